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


def test_a_strategy_file_sets_the_config_and_options_override_it(tmp_path) -> None:
    strategy = tmp_path / "large-images.yaml"
    strategy.write_text(
        "patterns: [conv_bn_relu, conv_bn, conv_activation]\n"
        "selection: dp\n"
        "target: onnxruntime\n"
        "switches:\n"
        "  - when: \"dim('$input', -1) > 16\"\n"  # the model's input is 1x3x32x32
        "    disable: [conv_bn_relu]\n"
        "check: {rtol: 0.001, atol: 0.0001, samples: 1}\n",
        encoding="utf-8",
    )
    report = tmp_path / "report.json"
    args = ["optimize", str(MODEL), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]
    assert main([*args, "--strategy", str(strategy)]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["selection"] == "dp" and data["config"]["target"] == "onnxruntime"
    assert data["config"]["check"]["samples"] == 1
    assert data["switches"][0]["fired"] is True
    assert "conv_bn_relu" not in data["fusions"] and data["fusions"]["conv_bn"] > 0
    # An option given on the command line wins over the file.
    assert main([*args, "--strategy", str(strategy), "--selection", "greedy"]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["selection"] == "greedy" and data["config"]["patterns"] is not None


def test_a_bad_strategy_file_is_a_clear_error(tmp_path, capsys) -> None:
    strategy = tmp_path / "bad.yaml"
    strategy.write_text("selection: simulated_annealing\n", encoding="utf-8")
    args = ["optimize", str(MODEL), "-o", str(tmp_path / "f.onnx"), "--strategy", str(strategy)]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "is not a valid strategy" in err and "selection" in err
