"""The base install is the light client: the wheel, installed into a fresh venv with only
what ``pip install autofusion`` pulls (its Requires-Dist without an extra: httpx, PyYAML,
lazy-loader and theirs), runs ``submit``, ``jobs``, ``registry`` and the typed client, and
a command of an extra says which extra to install (exit 2), not a traceback.

The wheel is the one tests/test_wheel.py builds (offline, from the Docker build context).
The dependencies are copied from the test environment's site-packages, distribution by
distribution (their RECORD), so nothing is downloaded and nothing else is importable:
the test checks that pydantic and onnx are not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import httpx
import onnx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from autofusion.fusion_core.testing import conv_bn_relu
from tests.serve_process import free_port, serving
from tests.test_wheel import wheel  # noqa: F401 - the fixture: the same offline build

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _base_requirements(built: Path) -> list[Requirement]:
    """The wheel's Requires-Dist that no extra guards: what ``pip install autofusion`` pulls."""
    with zipfile.ZipFile(built) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        fields = Parser().parsestr(archive.read(name).decode())
    requirements = [Requirement(line) for line in fields.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def _closure(requirements: list[Requirement]) -> list[metadata.Distribution]:
    """The installed distributions these requirements pull, theirs included."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        key = canonicalize_name(requirement.name)
        if key in found:
            continue
        found[key] = dist = metadata.distribution(requirement.name)
        assert dist.version in requirement.specifier, (requirement, dist.version)
        for line in dist.requires or []:
            needed = Requirement(line)
            if needed.marker is None or needed.marker.evaluate({"extra": ""}):
                todo.append(needed)
    return list(found.values())


def _copy_installed(dist: metadata.Distribution, site: Path) -> None:
    """A distribution's files as its RECORD lists them (its scripts in bin/ left out)."""
    for file in dist.files or []:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue
        source = Path(dist.locate_file(file))
        if source.is_file():
            (site / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, site / file)


@dataclass
class LightVenv:
    python: Path
    autofusion: Path
    env: dict[str, str]
    dependencies: list[str]

    def run(self, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
        command = [str(a) for a in args]
        return subprocess.run(
            command, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=120
        )


@pytest.fixture(scope="module")
def light(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> LightVenv:  # noqa: F811
    root = tmp_path_factory.mktemp("light-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    python = root / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         "--quiet", wheel],
        check=True,
    )  # fmt: skip
    dists = _closure(_base_requirements(wheel))
    for dist in dists:
        _copy_installed(dist, site)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("AUTOFUSION_") and k not in ("PYTHONPATH", "PYTHONHOME")
    }
    env["PYTHONNOUSERSITE"] = "1"
    names = sorted(canonicalize_name(d.metadata["Name"]) for d in dists)
    return LightVenv(python, root / "bin" / "autofusion", env, names)


def test_the_base_install_is_httpx_and_a_few_small_packages(light: LightVenv) -> None:
    assert {"httpx", "pyyaml", "lazy-loader"} <= set(light.dependencies)
    server_side = {"pydantic", "onnx", "onnxruntime", "numpy", "fastapi", "sqlalchemy", "celery"}
    assert not server_side & set(light.dependencies)


def test_the_venv_has_neither_the_engine_nor_the_server(light: LightVenv, tmp_path: Path) -> None:
    """The check below can fail: what the base install lacks is not importable here."""
    for module in ("pydantic", "onnx", "fastapi"):
        done = light.run(light.python, "-c", f"import {module}", cwd=tmp_path)
        assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, module
    done = light.run(light.python, "-c", "import autofusion.app.client", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["submit", "--help"], ["jobs", "--help"], ["registry", "patterns", "--help"]],
    ids=["help", "submit", "jobs", "registry"],
)
def test_the_client_commands_run(light: LightVenv, tmp_path: Path, argv: list[str]) -> None:
    done = light.run(light.autofusion, *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage: autofusion" in done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv, extra",
    [(["serve"], "server"), (["worker"], "server"), (["optimize", "m.onnx"], "core")],
    ids=["serve", "worker", "optimize"],
)
def test_a_command_of_an_extra_names_it(
    light: LightVenv, tmp_path: Path, argv: list[str], extra: str
) -> None:
    done = light.run(light.autofusion, *argv, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = f"autofusion {argv[0]} needs the {extra} extra: pip install 'autofusion[{extra}]'"
    assert done.stderr.startswith(line), done.stderr
    assert "Traceback" not in done.stderr


def test_the_light_client_submits_to_a_server(light: LightVenv, tmp_path: Path) -> None:
    """``autofusion submit`` and ``jobs status`` from the light venv, a YAML strategy file
    read without the engine, against a server run from the test environment (one that
    only queues: tests/app/test_submit.py follows jobs to their end with the same code)."""
    model = tmp_path / "conv_bn_relu.onnx"
    onnx.save_model(conv_bn_relu(), model)
    strategy = tmp_path / "strategy.yaml"
    strategy.write_text("target: onnxruntime\nexclude: [pad_conv]\n")
    serve = [sys.executable, "-c", "import sys; from autofusion.app.cli import main; "
             "sys.exit(main())", "serve", "--port", free_port(), "--data-dir", tmp_path / "data",
             "--no-embedded-worker", "--log-level", "warning"]  # fmt: skip
    with serving(serve, env=light.env, cwd=REPO, log=tmp_path / "serve.log") as url:
        done = light.run(
            light.autofusion, "submit", model, "--server", url, "--strategy", strategy,
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.split(" -> job ", 1)[1].split()[0]
        status = light.run(light.autofusion, "jobs", "status", job_id, "--server", url,
                           cwd=tmp_path)  # fmt: skip
        assert status.returncode == 0 and "queued" in status.stdout, status.stderr
        config = httpx.get(f"{url}/v1/jobs/{job_id}").json()["config"]
        assert config["target"] == "onnxruntime" and config["exclude"] == ["pad_conv"]
