"""The service refuses to start on an onnx or onnxruntime older than it requires (issue 26).

Before: nothing checked; an older runtime failed jobs later, obscurely. The required
versions are read from autofusion's installed metadata (pyproject.toml's dependencies),
so these tests compare against that, never against numbers written here.
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from packaging.requirements import Requirement

from autofusion.app.core.config import Settings
from autofusion.app.main import create_app
from autofusion.app.services import runtime_versions
from autofusion.app.services.runtime_versions import RuntimeVersionError, runtime_version_refusal

REPO = Path(__file__).resolve().parents[2]


def _required(name: str) -> Requirement:
    """The engine's requirement on ``name`` (pyproject.toml's ``core`` extra)."""
    lines = [Requirement(line) for line in metadata.requires("autofusion")]
    (found,) = [
        r
        for r in lines
        if r.name == name and (r.marker is None or r.marker.evaluate({"extra": "core"}))
    ]
    return found


def _floor(name: str) -> str:
    (spec,) = [s for s in _required(name).specifier if s.operator == ">="]
    return spec.version


def _older(version: str) -> str:
    """A release just below ``version`` ("1.23" -> "1.22.99")."""
    major, minor, *_ = (int(p) for p in version.split("."))
    return f"{major}.{minor - 1}.99"


@pytest.fixture
def old_onnxruntime(monkeypatch) -> str:
    installed = _older(_floor("onnxruntime"))
    real = runtime_versions.installed_version
    monkeypatch.setattr(
        runtime_versions,
        "installed_version",
        lambda name: installed if name == "onnxruntime" else real(name),
    )
    return installed


def test_the_installed_versions_pass():
    assert runtime_version_refusal() is None


def test_an_older_onnxruntime_is_refused_naming_both_versions(old_onnxruntime):
    refusal = runtime_version_refusal()
    assert refusal is not None and "\n" not in refusal
    assert f"onnxruntime {old_onnxruntime} is installed" in refusal
    assert f"'onnxruntime{_required('onnxruntime').specifier}'" in refusal
    assert "onnx " not in refusal  # onnx itself is recent enough


@pytest.mark.parametrize("name", ["onnx", "onnxruntime"])
def test_a_missing_or_older_package_is_refused_a_newer_one_is_not(monkeypatch, name):
    versions = {"onnx": metadata.version("onnx"), "onnxruntime": metadata.version("onnxruntime")}
    monkeypatch.setattr(runtime_versions, "installed_version", lambda n: versions[n])
    versions[name] = "99.0"  # newer than the upper bound: pip's business, not a reason to stop
    assert runtime_version_refusal() is None
    versions[name] = _older(_floor(name))
    assert f"{name} {versions[name]} is installed" in runtime_version_refusal()
    versions[name] = None
    assert f"{name} is not installed" in runtime_version_refusal()


def test_a_variant_build_is_found_by_its_import_package(monkeypatch):
    """onnxruntime-gpu provides the ``onnxruntime`` import package."""
    real_version = metadata.version

    def version(name: str) -> str:
        if name == "onnxruntime":
            raise metadata.PackageNotFoundError(name)
        return _floor("onnxruntime") if name == "onnxruntime-gpu" else real_version(name)

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(
        metadata, "packages_distributions", lambda: {"onnxruntime": ["onnxruntime-gpu"]}
    )
    assert runtime_versions.installed_version("onnxruntime") == _floor("onnxruntime")
    assert runtime_version_refusal() is None


def test_the_api_does_not_start_and_says_why_in_one_line(old_onnxruntime, tmp_path, caplog):
    app = create_app(Settings(data_dir=tmp_path / "data", embedded_worker=False))
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeVersionError), TestClient(app):
        pass
    ours = [r for r in caplog.records if r.name == runtime_versions.__name__]
    assert len(ours) == 1 and ours[0].levelno == logging.ERROR
    assert f"onnxruntime {old_onnxruntime} is installed" in ours[0].getMessage()


_PROBE = """
import sys
from autofusion.app.services import runtime_versions
real = runtime_versions.installed_version
runtime_versions.installed_version = lambda n: "1.0.0" if n == "onnxruntime" else real(n)
from autofusion.app.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_serve_and_worker_refuse_to_start_with_one_log_line(command, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, command],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "AUTOFUSION_DATA_DIR": str(tmp_path / "data"),
            "AUTOFUSION_LOG_FORMAT": "text",
        },
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"autofusion {command}: refusing to start: onnxruntime 1.0.0 is installed" in lines[0]
    assert str(_required("onnxruntime").specifier) in lines[0]
    assert "Traceback" not in done.stderr


def test_the_floors_are_found_where_the_packaging_puts_them():
    """onnx and onnxruntime are requirements of the core extra (the base install is the
    light client): the check must still find both, or it would pass whatever is installed."""
    assert set(runtime_versions.required_versions()) == {"onnx", "onnxruntime"}
