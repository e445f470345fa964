"""``autofusion optimize --selection``: cost-based selection from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main

MODEL = Path(__file__).resolve().parents[1] / "data" / "resnet" / "resnet50_w8_dynamo.onnx"


def test_the_cli_takes_the_selection_options(tmp_path, capsys) -> None:
    report = tmp_path / "report.json"
    args = ["optimize", str(MODEL), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]
    assert main([*args, "--selection", "dp", "--target-profile", "gpu"]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["selection"] == "dp" and data["config"]["target_profile"] == "gpu"
    assert data["selections"][0]["strategy"] == "dp"
    assert main([*args, "--selection", "greedy", "--cost-threshold", "1000"]) == 0
    assert json.loads(report.read_text())["fusions"] == {}
