"""The wheel, installed the way a user installs it, runs the service.

The wheel is built offline from a copy of what the Docker build context holds (the
allow-list in ``.dockerignore``), installed with ``--no-deps`` into a fresh venv, and run
from a folder outside the repository: ``autofusion migrate``, ``keys create``/``list``,
then ``autofusion serve`` on a free port with its own data dir, and a job over HTTP. The
venv gets its dependencies from the test environment's site-packages through a ``.pth``
file (no download); the editable install of autofusion there never shadows the wheel,
which the first test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import onnx
import pytest

from autofusion.fusion_core.testing import conv_bn_relu
from tests.serve_process import free_port, run_job, serving

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "fusion_core", "worker", "migrations")
# Lint settings of the source tree: nothing reads them at run time.
NOT_SHIPPED = {"ruff.toml"}


def _context_entries() -> list[str]:
    """The paths ``.dockerignore`` lets into the build context (its ``!`` lines)."""
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip()[1:] for line in lines if line.strip().startswith("!")]


def _source_files(package: str) -> set[str]:
    """Every file of a package folder in the checkout, as a path inside the wheel (under the
    one ``autofusion`` namespace)."""
    files = (path.relative_to(REPO) for path in (REPO / package).rglob("*") if path.is_file())
    return {
        f"autofusion/{path.as_posix()}"
        for path in files
        if not any(part.startswith((".", "__pycache__")) for part in path.parts)
        and path.suffix != ".pyc"
        and path.name not in NOT_SHIPPED
    }


def _run(command: list[str | Path], **options) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=300, **options
    )
    assert done.returncode == 0, (command, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel --no-deps`` of the build context, offline (no build isolation)."""
    source = tmp_path_factory.mktemp("context")
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".ruff_cache")
    for entry in _context_entries():
        path = REPO / entry
        if path.is_dir():
            shutil.copytree(path, source / entry, ignore=junk)
        else:
            shutil.copy2(path, source / entry)
    out = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", out, source],
        cwd=out,
    )  # fmt: skip
    (built,) = out.glob("autofusion-*.whl")
    return built


@dataclass
class Venv:
    root: Path
    python: Path
    bin: Path
    env: dict[str, str]

    def run(self, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
        return _run([self.bin / "autofusion", *args], cwd=cwd, env=self.env)


# A user's own FastAPI project, already in the venv autofusion is installed into: its
# packages are named ``app`` and ``worker``, as most such projects' are.
THEIR_PACKAGES = ("app", "worker")
THEIR_MARK = "their own project"


def _their_project(site: Path) -> None:
    for name in THEIR_PACKAGES:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text(f"OWNER = {THEIR_MARK!r}\n")


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv that already holds another project's ``app`` and ``worker`` packages,
    then the wheel; its dependencies borrowed by a .pth."""
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", root])
    python = root / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                .stdout.strip())  # fmt: skip
    _their_project(site)
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
         "--no-index", "--quiet", wheel],
    )  # fmt: skip
    borrowed = dict.fromkeys(sysconfig.get_path(name) for name in ("purelib", "platlib"))
    (site / "zz-autofusion-test-dependencies.pth").write_text("\n".join(borrowed) + "\n")
    # Nothing of the caller's: no AUTOFUSION_* setting, no PYTHONPATH to the checkout.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("AUTOFUSION_") and k not in ("PYTHONPATH", "PYTHONHOME")
    }
    env["PYTHONNOUSERSITE"] = "1"
    return Venv(root, python, root / "bin", env)


def test_the_wheel_holds_every_file_of_the_packages(wheel: Path) -> None:
    """Templates, static files, pattern YAML, the Alembic environment and its revisions:
    whatever the checkout has in a package folder, the wheel has too."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        missing = sorted(_source_files(package) - names)
        assert not missing, f"not in {wheel.name}: {missing}"
    assert {"autofusion/migrations/env.py", "autofusion/migrations/script.py.mako"} <= names
    assert any(n.startswith("autofusion/migrations/versions/0001_") for n in names)
    assert "autofusion/app/ui/templates/base.html" in names
    assert "autofusion/app/ui/static/style.css" in names
    entry_points = zipfile.ZipFile(wheel).read("autofusion-0.1.0.dist-info/entry_points.txt")
    assert b"autofusion = autofusion.app.cli:main" in entry_points
    # One top-level name in site-packages: nothing called app, worker or migrations.
    assert {name.split("/")[0] for name in names} == {"autofusion", "autofusion-0.1.0.dist-info"}


def test_the_venv_imports_the_wheel_not_the_checkout(venv: Venv, tmp_path: Path) -> None:
    code = (
        "import json; from autofusion import app, fusion_core, worker, migrations; "
        "import autofusion.app.migrate as migrate; "
        "print(json.dumps({m.__name__: m.__file__ for m in (app, fusion_core, worker, "
        "migrations)} | {'dir': str(migrate.migrations_dir())}))"
    )
    files = json.loads(_run([venv.python, "-c", code], cwd=tmp_path, env=venv.env).stdout)
    for name, path in files.items():
        assert Path(path).resolve().is_relative_to(venv.root.resolve()), (name, path)


def test_the_other_projects_app_and_worker_stay_theirs(venv: Venv, tmp_path: Path) -> None:
    """Installing autofusion shadows nothing: ``import app`` and ``import worker`` still give
    the other project's packages, and the CLI (which runs below) finds its own."""
    code = "import json, app, worker; print(json.dumps([app.OWNER, worker.OWNER]))"
    owners = json.loads(_run([venv.python, "-c", code], cwd=tmp_path, env=venv.env).stdout)
    assert owners == [THEIR_MARK, THEIR_MARK]
    version = venv.run("--version", cwd=tmp_path).stdout
    assert version.startswith("autofusion ")


@pytest.fixture
def served(venv: Venv, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """``migrate``, ``keys create`` and ``serve`` from the venv, run outside the repo."""
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    data = tmp_path / "data"
    done = venv.run("migrate", "--data-dir", data, cwd=workdir)
    assert "database schema is up to date" in done.stderr
    key = venv.run(
        "keys", "create", "--tenant", "ci", "--scopes", "jobs:write", "--data-dir", data,
        cwd=workdir,
    ).stdout.strip()  # fmt: skip
    assert key.startswith("af_")
    log = tmp_path / "serve.log"
    command = [venv.bin / "autofusion", "serve", "--port", free_port(), "--data-dir", data,
               "--require-api-keys", "--log-level", "warning"]  # fmt: skip
    with serving(command, env=venv.env, cwd=workdir, log=log) as url:
        yield url, key, log
    assert list(workdir.iterdir()) == []  # nothing depended on the current directory


def test_the_installed_wheel_serves_a_job(served: tuple[str, str, Path]) -> None:
    url, key, log = served
    auth = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
        assert client.get("/v1/jobs", headers={"Authorization": ""}).status_code == 401
        job = run_job(client, conv_bn_relu().SerializeToString(), log=log)
        fused = onnx.load_from_string(client.get(f"/v1/jobs/{job['id']}/model").content)
        assert "BatchNormalization" not in {n.op_type for n in fused.graph.node}

        # The dashboard's templates and static files came with the wheel.
        login = client.get("/ui/login")
        assert login.status_code == 200 and "<form" in login.text, login.text[:500]
        css = client.get("/ui/static/style.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
