"""autofusion.fusion_core.run: the one path from a model file to the files (the CLI and the
sandbox both take it)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from autofusion.fusion_core import OptimizeConfig, RunFiles, run
from autofusion.fusion_core.testing import conv_bn_relu

RESNET = Path(__file__).resolve().parents[1] / "data" / "resnet" / "resnet50_w8_torchscript.onnx"


def _files(folder) -> RunFiles:
    return RunFiles(
        report=folder / "report.json",
        markdown=folder / "report.md",
        html=folder / "report.html",
        regions=folder / "regions.json",
        trace=folder / "trace.json",
    )


def test_run_writes_the_model_the_report_its_renderings_and_the_trace(tmp_path) -> None:
    model = tmp_path / "in.onnx"
    onnx.save(conv_bn_relu(), model)
    stages = []
    outcome = run(
        model, tmp_path / "out" / "fused.onnx", OptimizeConfig(profile=True),
        files=_files(tmp_path / "out"), names=("in.onnx", "fused.onnx"),
        on_stage=lambda stage, _: stages.append(stage),
    )  # fmt: skip
    assert outcome.written and not outcome.failed
    assert stages == ["saving", "profiling", "report"]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["model"] == "in.onnx" and report["output"] == "fused.onnx"
    assert report["profile"] and report["memory"] and report["speed"]
    assert report["digests"]["model_sha256"] and report["digests"]["output_sha256"]
    for name in ("fused.onnx", "report.md", "report.html", "regions.json", "trace.json"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name


def test_a_failed_check_writes_the_report_but_not_the_model(tmp_path) -> None:
    # a small ResNet with zero tolerance: its folded BatchNormalizations differ in the
    # last bits (as tests/app/test_cli_failures.py relies on)
    config = OptimizeConfig(check={"rtol": 0.0, "atol": 0.0}, profile=True, strict=True)
    outcome = run(RESNET, tmp_path / "fused.onnx", config, files=_files(tmp_path))
    assert outcome.failed and not outcome.written
    assert not (tmp_path / "fused.onnx").exists()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["check"]["passed"] is False and report.get("profile") is None
    assert (tmp_path / "report.html").exists() and not (tmp_path / "regions.json").exists()


class _StoppedWhileProfiling(Exception):
    """What a worker's time limit does to the sandbox, at the same point."""


def _stop_at_profiling(stage: str, _progress: float) -> None:
    if stage == "profiling":
        raise _StoppedWhileProfiling


def test_a_run_stopped_while_profiling_leaves_the_checked_model_and_a_report(tmp_path) -> None:
    """Issue 27: the model is saved and checked before profiling, and the report written
    then says that profiling did not finish (the finished run replaces it)."""
    from autofusion.fusion_core.pipeline import PROFILE_UNFINISHED

    model = tmp_path / "in.onnx"
    onnx.save(conv_bn_relu(), model)
    out = tmp_path / "out"
    with pytest.raises(_StoppedWhileProfiling):
        run(
            model, out / "fused.onnx", OptimizeConfig(profile=True), files=_files(out),
            names=("in.onnx", "fused.onnx"), on_stage=_stop_at_profiling,
        )  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert report["profile"] == {"error": PROFILE_UNFINISHED} and report["speed"] is None
    assert report["check"]["passed"] is True and report["output"] == "fused.onnx"
    fused = onnx.load(out / "fused.onnx")
    assert "BatchNormalization" not in {n.op_type for n in fused.graph.node}
    assert not (out / "report.html").exists()  # renderings come with the finished report
