"""``optimize``'s progress by phase on stderr: a live line on a terminal (a real pty
here), plain lines when forced elsewhere, nothing in a log by default; the phases are
the ones the core announces through ``on_phase``."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from autofusion.app.cli import main
from autofusion.app.cli._progress import PHASES
from autofusion.fusion_core import OptimizeConfig, optimize, run
from autofusion.fusion_core.testing import conv_bn_relu

REPO = Path(__file__).resolve().parents[2]
PLAIN = ["load", "prepasses", "fuse", "check", "saving", "report"]


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "net.onnx"
    onnx.save_model(conv_bn_relu(width=8), path)
    return path


def test_the_core_announces_each_phase_in_order(model, tmp_path):
    heard: list[str] = []
    run(model, tmp_path / "f.onnx", OptimizeConfig(profile=True), on_phase=heard.append)
    assert heard == ["load", "prepasses", "fuse", "check", "saving", "profiling", "report"]
    heard.clear()
    optimize(model, OptimizeConfig(progressive=True), on_phase=heard.append)
    assert heard[0] == "progressive"
    assert set(heard) <= set(PHASES)


def _phase_lines(err: str) -> list[str]:
    words = {f"autofusion: {text}...": name for name, text in PHASES.items()}
    return [words[line] for line in err.splitlines() if line in words]


@pytest.mark.parametrize(
    "flag, expected",
    [
        pytest.param([], [], id="default-not-a-terminal"),
        pytest.param(["--no-progress"], [], id="off"),
        pytest.param(["--progress"], PLAIN, id="forced"),
    ],
)
def test_progress_in_a_log(capsys, model, tmp_path, flag, expected):
    code = main(["optimize", str(model), "-o", str(tmp_path / "f.onnx"), *flag])
    out, err = capsys.readouterr()
    assert code == 0
    assert _phase_lines(err) == expected
    assert "autofusion: loading" not in out  # progress never mixes into the summary


def _on_a_terminal(*args: str) -> str:
    """``autofusion ARGS`` with stderr on a pseudo-terminal; what the terminal got."""
    leader, follower = pty.openpty()
    command = [
        sys.executable,
        "-c",
        "import sys; from autofusion.app.cli import main; sys.exit(main())",
    ]
    process = subprocess.Popen(
        [*command, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120", "TERM": "xterm"},
        stdout=subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=120) == 0
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_a_terminal_shows_each_phase_live_and_done(model, tmp_path):
    screen = _on_a_terminal("optimize", str(model), "-o", str(tmp_path / "f.onnx"))
    assert "\x1b[" in screen  # drawn in place (rich's live line), not printed as a log
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    for name in PLAIN:
        assert re.search(rf"done {re.escape(PHASES[name])} \d+\.\d s", text), name
    assert "autofusion: loading the model..." not in screen
    quiet = _on_a_terminal("optimize", str(model), "-o", str(tmp_path / "g.onnx"), "--no-progress")
    assert "done" not in quiet and PHASES["load"] not in quiet
