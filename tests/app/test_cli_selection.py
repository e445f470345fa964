"""``autofusion optimize --selection``: cost-based selection from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from autofusion.app.cli import main
from tests.fusion_core.test_report import conv_bn_relu

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


def test_measured_selection_from_the_command_line(tmp_path, capsys) -> None:
    conv = tmp_path / "conv.onnx"
    onnx.save(conv_bn_relu(), conv)
    report, cache = tmp_path / "report.json", tmp_path / "measured"
    args = ["optimize", str(conv), "-o", str(tmp_path / "f.onnx"), "--report", str(report)]
    args += ["--target", "onnxruntime", "--selection", "measured", "--measure-budget", "0.5"]
    assert main([*args, "--measure-threads", "2", "--measure-cache", str(cache)]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["measure_options"] == {
        "budget_s": 0.5, "level": "ORT_ENABLE_ALL", "threads": 2, "cache_dir": str(cache),
        "verdicts_file": None, "verdict_max_age_days": 30.0, "min_runs": 10,
    }  # fmt: skip
    record = data["measurement"]
    assert record["threads"] == 2 and record["groups"] and record["final"]["runs"] >= 10
    assert data["speed"]["verdict"] == record["final"]["verdict"]
    out = capsys.readouterr().out
    assert f"measured selection: kept {sum(g['kept'] for g in record['groups'])} of" in out
    assert "speed: " in out and "2 threads" in out
    assert (cache / "verdicts.json").is_file()
    # --no-measure-cache: nothing is read or kept
    assert main([*args, "--no-measure-cache"]) == 0
    again = json.loads(report.read_text())
    assert again["config"]["measure_options"]["cache_dir"] is None
    store = again["measurement"]["store"]
    assert store["read"] == store["matched"] == store["written"] == 0


def test_the_cli_adds_its_excludes_to_the_strategy_files(tmp_path) -> None:
    """As the worker merges a named strategy under a job (OptimizeConfig.merged)."""
    import argparse

    from autofusion.app.cli import optimize as optimize_cmd

    path = tmp_path / "s.yaml"
    path.write_text("exclude: [conv_bn]\n")
    parser = argparse.ArgumentParser()
    optimize_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["optimize", "m.onnx", "-o", "f.onnx", "--strategy", str(path), "--exclude", "gelu_erf"]
    )
    assert optimize_cmd.build_config(args, []).exclude == ["conv_bn", "gelu_erf"]
