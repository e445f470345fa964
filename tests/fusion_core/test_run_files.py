"""autofusion.fusion_core.run: the one path from a model file to the files (the CLI and the
sandbox both take it)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

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
