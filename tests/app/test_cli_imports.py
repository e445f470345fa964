"""What the CLI imports: `--help`, `--version` and the client commands (submit, jobs,
registry) load no onnx, onnxruntime or fusion engine (issue 18: `autofusion --help` took
2.5 s importing them all). Checked in a fresh interpreter's ``sys.modules``, never by time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autofusion import fusion_core
from autofusion.app.cli import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
# Modules a light command must not load: the runtimes and the engine's heavy stages.
HEAVY = (
    "onnx",
    "onnxruntime",
    "onnx_ir",
    "onnxscript",
    "numpy",
    "autofusion.fusion_core.pipeline",
    "autofusion.fusion_core.patterns",
    "autofusion.fusion_core.validate",
    "autofusion.fusion_core.rewriters",
)

_PROBE = """
import json, sys
from autofusion.app.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("\\n" + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded_by(*argv: str) -> tuple[int, set[str]]:
    """(exit code, the modules loaded) of ``autofusion ARGV`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": "/nonexistent"},
    )
    last = done.stdout.strip().splitlines()[-1]
    result = json.loads(last)
    return result["code"], set(result["modules"])


def _heavy(modules: set[str]) -> list[str]:
    return sorted(name for name in HEAVY if name in modules)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--help"], id="help"),
        pytest.param(["--version"], id="version"),
        pytest.param(["submit", "--help"], id="submit-help"),
        pytest.param(["jobs", "list", "--help"], id="jobs-help"),
        pytest.param(["registry", "patterns", "put", "--help"], id="registry-help"),
        # Past the parser, up to the request: the server is not there (exit 5).
        pytest.param(["jobs", "status", "x", "--server", "http://127.0.0.1:9"], id="jobs-run"),
        pytest.param(
            ["registry", "strategies", "list", "--server", "http://127.0.0.1:9"], id="registry-run"
        ),
    ],
)
def test_light_commands_import_no_runtime(argv):
    code, modules = loaded_by(*argv)
    assert code in (0, 5), f"autofusion {' '.join(argv)} exited {code}"
    assert _heavy(modules) == [], f"autofusion {' '.join(argv)} imported {_heavy(modules)}"


# What the base install lacks (the light client: docs/service.md, "The light client"):
# the client commands load none of it, tests/test_wheel_client.py runs them without it.
SERVER = ("pydantic", "pydantic_settings", "fastapi", "starlette", "sqlalchemy", "celery")


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["submit", "--help"], id="submit-help"),
        pytest.param(["jobs", "status", "x", "--server", "http://127.0.0.1:9"], id="jobs-run"),
        pytest.param(["registry", "patterns", "list", "--server", "http://127.0.0.1:9"], id="reg"),
    ],
)
def test_client_commands_import_nothing_of_the_server(argv):
    code, modules = loaded_by(*argv)
    assert code in (0, 5)
    assert sorted(name for name in SERVER if name in modules) == []
    assert not [m for m in modules if m.startswith(("autofusion.app.core", "autofusion.worker"))]


def test_submit_runs_to_the_end_without_the_runtime(tmp_path):
    """A whole submit, the request included, down to its error (nothing listens)."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"the client never parses it")
    strategy = tmp_path / "s.yaml"
    strategy.write_text("target: onnxruntime\nexclude: [pad_conv]\n")
    code, modules = loaded_by(
        "submit", str(model), "--strategy", str(strategy), "--server", "http://127.0.0.1:9"
    )
    assert code == 5
    assert _heavy(modules) == []


def test_the_probe_sees_the_runtime_where_a_command_needs_it(tmp_path):
    """The check can fail: optimize's parser alone loads the engine it runs."""
    code, modules = loaded_by("optimize", str(tmp_path / "nowhere.onnx"), "-o", "x.onnx")
    assert code == 3
    assert "onnx" in modules and "autofusion.fusion_core.pipeline" in modules


def test_version_is_the_package_metadata(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stopped:
        build_parser(["--version"]).parse_args(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.strip() == f"autofusion {version('autofusion')}"


def test_every_command_module_is_named_and_builds():
    """COMMANDS names each command's module; each builds its parser under that name."""
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    assert list(commands.choices) == list(COMMANDS)


@pytest.mark.parametrize("face", [fusion_core, fusion_core.report, fusion_core.profiling])
def test_lazy_faces_resolve_every_name(face):
    """Every name a lazy package face lists loads (a typo in its table fails here)."""
    for name in face.__all__:
        assert getattr(face, name) is not None, f"{face.__name__}.{name}"
