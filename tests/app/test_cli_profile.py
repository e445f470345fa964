"""``autofusion profile``: exit codes, the printed summary and the JSON file.

The command module is mounted on a parser of its own here (as ``app.cli`` mounts it), so
the test does not depend on the command list. Runs are few and the model tiny: speed is
never asserted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from autofusion.app.cli import profile as profile_cmd
from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, save_model

QUICK = ("--warmup", "1", "--iters", "3", "--node-runs", "2")


def run_profile(capsys, *args: str | Path) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="autofusion")
    profile_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["profile", *map(str, args)])
    code = parsed.run(parsed)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def model_file(tmp_path) -> Path:
    """Conv -> Relu with a symbolic batch dimension, named nodes, weights inline."""
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[N,3,8,8] x) => (float[N,4,8,8] y) {\n"
        "  c = Conv<pads=[1,1,1,1]>(x, w, b)\n"
        "  y = Relu(c)\n"
        "}"
    )
    rng = np.random.default_rng(0)
    for name, shape in (("w", (4, 3, 3, 3)), ("b", (4,))):
        array = rng.standard_normal(shape).astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    model.graph.node[0].name, model.graph.node[1].name = "conv", "relu"
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def test_one_model_prints_medians(capsys, model_file) -> None:
    code, out, err = run_profile(capsys, model_file, *QUICK, "--dims", "N=2")
    assert code == 0, err
    assert "median" in out and "ORT_ENABLE_ALL" in out and "ORT_DISABLE_ALL" in out
    assert "Conv" in out


def test_original_against_fused_writes_json(capsys, tmp_path, model_file) -> None:
    config = OptimizeConfig(target="onnxruntime", check=CheckOptions(enabled=False))
    fused_file = tmp_path / "fused.onnx"
    save_model(optimize(model_file, config).model, fused_file)
    report_file = tmp_path / "out" / "profile.json"
    code, out, err = run_profile(
        capsys, model_file, "--fused", fused_file, *QUICK, "--json", report_file
    )
    assert code == 0, err
    assert "ratio fused/original" in out and "fused regions" in out
    report = json.loads(report_file.read_text(encoding="utf-8"))
    assert [s["label"] for s in report["latency"][0]["sessions"]] == ["original", "fused"]
    assert report["regions"] and report["regions"][0]["fused_nodes"]


def test_missing_model_exits_3(capsys, tmp_path) -> None:
    code, _, err = run_profile(capsys, tmp_path / "nope.onnx", *QUICK)
    assert code == 3
    assert "does not exist" in err


def test_missing_fused_model_exits_3(capsys, tmp_path, model_file) -> None:
    code, _, _ = run_profile(capsys, model_file, "--fused", tmp_path / "nope.onnx", *QUICK)
    assert code == 3


def test_malformed_model_exits_3(capsys, tmp_path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"this is not a protobuf")
    code, _, _ = run_profile(capsys, path, *QUICK)
    assert code == 3


@pytest.mark.parametrize(
    "options",
    [("--dims", "N"), ("--dims", "N=zero"), ("--threads", "0"), ("--providers", "NoSuchEP")],
    ids=["dims-no-value", "dims-not-a-number", "no-threads", "unknown-provider"],
)
def test_bad_options_exit_2(capsys, model_file, options) -> None:
    code, _, err = run_profile(capsys, model_file, *QUICK, *options)
    assert code == 2
    assert err.startswith("autofusion: error:")


def test_argparse_rejects_a_non_integer_thread_count(capsys, model_file) -> None:
    with pytest.raises(SystemExit) as exc:
        run_profile(capsys, model_file, "--threads", "many")
    assert exc.value.code == 2
