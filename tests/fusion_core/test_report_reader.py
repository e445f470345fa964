"""The one report reader: real reports (a real optimize and a real profile) read back,
and stored reports of an older shape still read."""

from __future__ import annotations

import onnx
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.profiling import ProfileOptions, profile_models
from autofusion.fusion_core.report import (
    build_report,
    format_markdown,
    format_summary,
    read_report,
    speed_section,
)
from tests.fusion_core.test_report import conv_bn_relu, validate

QUICK = ProfileOptions(warmup=1, iters=8, node_runs=1, levels=("ORT_ENABLE_ALL", "ORT_DISABLE_ALL"))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("reader")
    model_path, fused_path = folder / "model.onnx", folder / "fused.onnx"
    onnx.save(conv_bn_relu(), model_path)
    config = OptimizeConfig(target="onnxruntime")
    result = optimize(model_path, config)
    save_model(result.model, fused_path)
    profile = profile_models(model_path, fused_path, options=QUICK).to_dict()
    return build_report(result, model=str(model_path), output=str(fused_path), profile=profile)


def test_a_profiled_report_carries_the_paired_verdict_at_the_deployment_level(profiled) -> None:
    validate(profiled)
    speed = read_report(profiled).speed
    assert speed is not None
    enable_all = profiled["profile"]["latency"][0]
    assert enable_all["level"] == speed.level == "ORT_ENABLE_ALL"
    assert speed.ratio == enable_all["paired"]["median"]
    assert speed.runs == QUICK.iters
    assert speed.low <= speed.ratio <= speed.high
    assert speed.verdict in ("faster", "no measurable change", "slower")
    assert speed.threads == QUICK.threads
    assert profiled["speed"]["speedup"] == pytest.approx(1 / speed.ratio, rel=1e-12)


def test_the_renderings_show_the_verdict(profiled) -> None:
    speed = read_report(profiled).speed
    summary, markdown = format_summary(profiled), format_markdown(profiled)
    assert f"speed: {speed.describe()}" in summary
    assert "**Speed:**" in markdown and f"{speed.speedup:.2f}x" in markdown
    assert f"{speed.runs} paired runs" in speed.describe()


def test_the_facts_of_a_real_report(profiled) -> None:
    facts = read_report(profiled)
    assert facts.fusions == 1 and facts.target == "onnxruntime"
    assert facts.check_passed is True and facts.max_abs_diff == profiled["check"]["max_abs_diff"]
    assert (facts.nodes_before, facts.nodes_after) == (3, 1)
    assert facts.counts == {"conv_bn_relu": 1} and facts.check_error is None
    assert set(facts.timings_s) >= {"load", "prepasses", "match", "rewrite", "check"}


def test_an_unprofiled_report_has_no_speed(profiled) -> None:
    unprofiled = {**profiled, "profile": None, "speed": None}
    assert read_report(unprofiled).speed is None
    assert "speed:" not in format_summary(unprofiled)
    assert "**Speed:** not measured" in format_markdown(unprofiled)


def test_a_stored_report_from_before_the_verdict_reads_its_ratio_of_medians() -> None:
    old = {
        "target": "generic",
        "fusions": {"a": 2},
        "check": {"passed": False, "max_abs_diff": 0.5, "failure": "mismatch"},
        "profile": {"latency": [{"level": "ORT_DISABLE_ALL", "ratio": 0.5}]},
    }
    facts = read_report(old)
    assert facts.speed.ratio == 0.5 and facts.speed.speedup == 2.0
    assert facts.speed.verdict is None and facts.speed.low is None
    assert facts.check_passed is False and facts.check_failure == "mismatch"
    assert facts.counts == {"a": 2} and facts.timings_s == {}
    assert facts.fusions == 2


@pytest.mark.parametrize("junk", [None, [], {"latency": "x"}, {"latency": [{"ratio": "1"}]}])
def test_junk_profiles_give_no_speed_rather_than_an_error(junk) -> None:
    assert speed_section(junk) is None
    assert read_report({"profile": junk}).speed is None
