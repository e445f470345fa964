"""``autofusion calibrate``: a quick run writes a target profile the cost model loads.

The command module is mounted on a parser of its own here (as ``app.cli`` mounts it), so
the test does not depend on the command list. Only signs are checked, never speed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import calibrate as calibrate_cmd
from fusion_core.cost import CostModel, load_target_profile


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
