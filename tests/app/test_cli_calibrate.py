"""``autofusion calibrate``: a quick run writes a target profile the cost model loads.

The command module is mounted on a parser of its own here (as ``app.cli`` mounts it), so
the test does not depend on the command list. Only signs are checked, never speed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

from autofusion.app.cli import calibrate as calibrate_cmd
from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.cost import CostModel, load_target_profile
from autofusion.fusion_core.errors import ConfigError


def run_calibrate(capsys, *args: str | Path) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="autofusion")
    calibrate_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["calibrate", *map(str, args)])
    code = parsed.run(parsed)
    out, err = capsys.readouterr()
    return code, out, err


def test_quick_calibration_writes_a_loadable_profile_with_positive_numbers(capsys, tmp_path):
    output = tmp_path / "profiles" / "here.yaml"

    code, out, err = run_calibrate(
        capsys, "--quick", "--threads", "1", "--name", "here", "--output", output
    )

    assert code == 0, err
    profile = load_target_profile(output)
    assert profile.name == "here"
    assert profile.memory_bandwidth_bytes_per_s > 0
    assert profile.launch_overhead_s > 0
    assert profile.peak_flops_per_s > 0
    assert min(profile.l1_cache_bytes, profile.l2_cache_bytes, profile.memory_pool_bytes) > 0
    assert profile.calibration is not None
    assert (profile.calibration.threads, profile.calibration.quick) == (1, True)
    assert profile.value_info == "none"  # onnxruntime's CPU provider, as the cpu profile
    assert str(output) in out
    for label in ("memory bandwidth", "launch overhead", "peak compute", "GB/s", "GFLOP/s"):
        assert label in out
    assert output.read_text(encoding="utf-8").startswith("# Measured by")
    assert CostModel(output).profile == profile


def test_zero_threads_is_a_usage_error(capsys, tmp_path):
    output = tmp_path / "p.yaml"
    code, _, err = run_calibrate(capsys, "--quick", "--threads", "0", "--output", output)
    assert code == 2
    assert "--threads" in err
    assert not output.exists()


def test_a_name_that_is_not_a_profile_name_is_a_usage_error(capsys, tmp_path):
    output = tmp_path / "p.yaml"
    code, _, err = run_calibrate(capsys, "--quick", "--name", "two words", "--output", output)
    assert code == 2
    assert "name" in err
    assert not output.exists()


def test_calibrate_from_reports_writes_a_profile_that_changes_the_choice(tmp_path, capsys):
    report = tmp_path / "report.json"
    slow_conv = [  # unfused nodes 2x their roofline, the FusedConv 20x: a factor of 10
        {
            "rewriter": "fuse_activation",
            "provenance": {"from_fusions": []},
            "predicted_gain": {"before_us": 10.0, "after_us": 2.0},
            "measured_gain": {"before_us": 20.0, "after_us": 40.0},
        }
    ]
    report.write_text(json.dumps({"applied": slow_conv}), encoding="utf-8")
    out = tmp_path / "profile.yaml"
    code, printed, _ = run_calibrate(capsys, "--from-report", report, "-o", out)
    assert code == 0 and "fuse_activation" in printed
    learned = load_target_profile(out)
    base = load_target_profile("cpu")
    assert learned.kernel_factors == {"fuse_activation": 10.0}
    assert learned.name == "cpu-kernels"
    assert learned.memory_bandwidth_bytes_per_s == base.memory_bandwidth_bytes_per_s

    model = conv_bn_relu_model()
    chosen = optimize(model, OptimizeConfig(target="onnxruntime", selection="greedy"))
    assert chosen.counts.get("conv_bn_relu") == 1
    refused = optimize(
        model, OptimizeConfig(target="onnxruntime", selection="greedy", target_profile=str(out))
    )
    assert "conv_bn_relu" not in refused.counts and refused.check.passed
    (prediction,) = [a.predicted_gain for a in chosen.applied]
    assert prediction["saved_us"] > 0


def test_calibrate_from_an_unreadable_report_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot read the report"):
        run_calibrate(capsys, "--from-report", bad, "-o", tmp_path / "p.yaml")


def conv_bn_relu_model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1,16,32,32] x) => (float[1,16,32,32] y) {\n"
        " c = Conv<pads = [1, 1, 1, 1]>(x, w)\n"
        " n = BatchNormalization(c, gamma, beta, mean, var)\n"
        " y = Relu(n)\n}"
    )
    arrays = {
        "w": rng.normal(0, 0.1, (16, 16, 3, 3)),
        "gamma": rng.uniform(0.5, 1.5, 16),
        "beta": rng.normal(0, 0.1, 16),
        "mean": rng.normal(0, 0.1, 16),
        "var": rng.uniform(0.5, 2.0, 16),
    }
    model.graph.initializer.extend(
        numpy_helper.from_array(a.astype(np.float32), n) for n, a in arrays.items()
    )
    return model
