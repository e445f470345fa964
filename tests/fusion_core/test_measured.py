"""Measured selection: which groups it keeps, what it reuses, when it keeps nothing.

The timing is replaced by a timer whose paired ratios the test decides (a unit test
never asserts a speed); one test runs the real timer and checks only what it recorded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.pipeline.measured import group_fusions, optimize_measured
from autofusion.fusion_core.profiling import PairedTimer
from autofusion.fusion_core.profiling.stats import paired_ratio
from autofusion.fusion_core.report import build_report, format_summary, read_report
from autofusion.fusion_core.validate import CANDIDATES, candidate_dims, input_dims
from tests.fusion_core.test_report import conv_bn_relu, validate

REPO = Path(__file__).resolve().parents[2]
BERT = REPO / "tests" / "data" / "transformers" / "bert_eager_torchscript.onnx"

# with-group / without-group run time, per pattern prefix (below 1: the group is faster)
RATIOS = {
    "skip_layer_norm": 1.04,  # slower
    "gelu": 1.0,  # no measurable change
    "attention": 0.90,
    "qkv": 0.97,
}


# what those ratios keep on BERT: attention (MultiHeadAttention, then packed with its
# projection into Attention) and the Q/K/V merge
KEPT = {"attention", "attention_packed_merged", "qkv_bias_merge"}


def ratio_of(value: float):
    """A paired ratio of 20 runs centred on ``value`` (interval about +-0.5%)."""
    spread = [value * (1 + 0.001 * (k - 10)) for k in range(21)]
    return paired_ratio(spread, [1.0] * len(spread))


class FakeTimer(PairedTimer):
    """The real inputs, ratios from RATIOS; counts what it was asked to time."""

    calls: list[str] = []
    final = 0.95

    def with_and_without(self, full, variants, *, budget_s):
        self.charge(1.0)
        FakeTimer.calls += list(variants)
        return {key: ratio_of(_table(key)) for key in variants}

    def compare(self, fused, original, *, budget_s):
        FakeTimer.calls.append("final")
        return ratio_of(FakeTimer.final)


def _table(group_key: str) -> float:
    return next(v for prefix, v in RATIOS.items() if group_key.startswith(prefix))


@pytest.fixture(autouse=True)
def _reset():
    FakeTimer.calls, FakeTimer.final = [], 0.95


def measured(tmp_path, **options) -> OptimizeConfig:
    return OptimizeConfig(
        target="onnxruntime",
        selection="measured",
        check={"samples": 1},
        measure_options={"cache_dir": str(tmp_path / "cache"), **options},
    )


def test_only_the_groups_that_measure_faster_are_kept(tmp_path) -> None:
    # The default prices SkipLayerNormalization as a loss on profile cpu (and keeps the
    # merge); measured selection proposes it anyway: this machine decides.
    default = optimize(BERT, OptimizeConfig(target="onnxruntime", check={"enabled": False}))
    applied = {g.pattern for g in group_fusions(default.applied)}
    assert "skip_layer_norm_bias" not in applied and "qkv_bias_merge" in applied
    assert "attention_packed_merged" in applied

    result = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    proposed = {g["pattern"] for g in result.measurement["groups"]}
    assert {"skip_layer_norm_bias", "attention", "qkv_bias_merge"} <= proposed
    assert set(result.counts) == KEPT
    assert result.check.passed
    groups = {g["pattern"]: g for g in result.measurement["groups"]}
    assert groups["skip_layer_norm_bias"]["kept"] is False
    assert groups["skip_layer_norm_bias"]["ratio"]["verdict"] == "slower"
    assert groups["gelu_erf_bias"]["ratio"]["verdict"] == "no measurable change"
    assert groups["attention"]["kept"] is True
    # BiasGelu left out lets the bias-less Gelu fuse instead: measured in a second pass
    assert groups["gelu_erf"]["ratio"] is not None
    assert groups["gelu_erf"]["kept"] is False
    misses = [
        m
        for m in result.near_misses
        if m.pattern == "skip_layer_norm_bias" and m.reason.startswith("measured selection")
    ]
    assert len(misses) == groups["skip_layer_norm_bias"]["fusions"]
    assert all("slower on this machine" in m.reason for m in misses)
    assert {m.kind for m in misses} == {"selection"}


def test_the_report_says_what_was_measured_and_its_verdict(tmp_path) -> None:
    result = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    report = build_report(result, model=BERT.name)
    validate(report)
    speed = read_report(report).speed  # unprofiled: the verdict is the final comparison
    assert speed.verdict == "faster" and speed.ratio == pytest.approx(0.95)
    summary = format_summary(report)
    assert f"measured selection: kept {len(KEPT)} of" in summary
    assert "left out  skip_layer_norm_bias" in summary
    assert f"speed: {speed.describe()}" in summary


def test_a_second_job_on_the_same_architecture_measures_only_the_final_model(tmp_path) -> None:
    first = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    measured_groups = [c for c in FakeTimer.calls if c != "final"]
    assert measured_groups and FakeTimer.calls.count("final") == 1
    FakeTimer.calls = []
    second = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    assert FakeTimer.calls == ["final"]
    assert second.counts == first.counts
    assert second.measurement["store"]["matched"] == len(second.measurement["groups"])
    assert all(g["source"] == "store" and g["cached"] for g in second.measurement["groups"])


def test_another_machine_class_does_not_reuse_decisions(tmp_path) -> None:
    optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    FakeTimer.calls = []
    optimize_measured(BERT, measured(tmp_path, threads=2), timer_factory=FakeTimer)
    assert len([c for c in FakeTimer.calls if c != "final"]) > 0


def test_a_final_model_slower_than_the_original_keeps_no_fusion(tmp_path) -> None:
    FakeTimer.final = 1.05
    result = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    assert result.applied == []
    assert "measured slower than the original" in result.measurement["fallback"]
    assert not any(g["kept"] for g in result.measurement["groups"])
    reasons = {m.pattern: m.reason for m in result.near_misses}
    assert "as a whole measured slower" in reasons["attention"]
    assert read_report(build_report(result)).speed.verdict == "slower"


def test_a_slower_final_model_is_handed_out_as_it_came(tmp_path) -> None:
    FakeTimer.final = 1.05
    result = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    # no fusion and no constant folding: the same ops as the original
    assert result.ops_after == result.ops_before
    assert "handed out as it came" in result.measurement["fallback"]


def test_a_final_model_within_the_margin_keeps_its_fusions(tmp_path) -> None:
    FakeTimer.final = 1.005  # tight, above 1, but under MARGIN: no measurable change
    result = optimize_measured(BERT, measured(tmp_path), timer_factory=FakeTimer)
    assert result.measurement["fallback"] is None
    assert set(result.counts) == KEPT
    assert result.measurement["final"]["verdict"] == "no measurable change"


class CannotRunTimer(FakeTimer):
    def feeds_for(self, original, config, feeds):
        return None


def test_a_model_that_runs_on_no_inputs_keeps_no_fusion(tmp_path) -> None:
    result = optimize_measured(BERT, measured(tmp_path), timer_factory=CannotRunTimer)
    assert result.applied == [] and FakeTimer.calls == []
    assert "no fusion is kept" in result.measurement["error"]
    assert result.ops_after == result.ops_before


def test_the_real_timer_tries_the_checks_candidate_sizes(tmp_path) -> None:
    # a sequence that must be at least 64 long: the first four of the check's sizes are
    # too short (the three tried before did not reach it)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [
                onnx.helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
                onnx.helper.make_node("Reshape", ["s", "shape"], ["y"]),
            ],
            "needs_a_long_sequence",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "seq"])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
            [
                onnx.numpy_helper.from_array(np.array([0], np.int64), "starts"),
                onnx.numpy_helper.from_array(np.array([64], np.int64), "ends"),
                onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
                onnx.numpy_helper.from_array(np.array([8, 8], np.int64), "shape"),
            ],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )
    timer = PairedTimer(measured(tmp_path).measure_options, tmp_path)
    free = input_dims(model)
    runnable = [k for k in range(CANDIDATES) if candidate_dims(free, {}, k)["seq"] >= 64]
    assert runnable and runnable[0] >= 3, runnable
    assert timer.feeds_for(model, OptimizeConfig(), None) is not None
    assert timer.dims["seq"] >= 64


class SlowRunsTimer(FakeTimer):
    """Says one run takes 100 s: no batch of min_runs fits a 60 s budget."""

    def __init__(self, opts, scratch) -> None:
        super().__init__(opts, scratch)
        self._run_s = 100.0


def test_a_batch_the_budget_cannot_afford_is_not_started(tmp_path) -> None:
    result = optimize_measured(BERT, measured(tmp_path), timer_factory=SlowRunsTimer)
    assert FakeTimer.calls == ["final"]
    groups = result.measurement["groups"]
    assert groups and all(g["ratio"] is None and not g["kept"] for g in groups)
    assert all("time budget" in g["reason"] or "unmeasured" in g["reason"] for g in groups)
    assert groups[0]["group"].startswith("attention") and "time budget" in groups[0]["reason"]


def test_groups_the_budget_does_not_reach_are_left_out(tmp_path) -> None:
    # the fake charges 1 s per batch of three: a 1 s budget (0.75 s before the final)
    # ends after the first batch
    result = optimize_measured(BERT, measured(tmp_path, budget_s=1.0), timer_factory=FakeTimer)
    groups = result.measurement["groups"]
    unmeasured = [g for g in groups if g["ratio"] is None]
    assert len(groups) > 3 and unmeasured
    assert not any(g["kept"] for g in unmeasured)
    assert any("time budget" in g["reason"] for g in unmeasured)
    assert {f.pattern for f in result.applied} <= {g["pattern"] for g in groups if g["kept"]}


def test_progressive_and_measured_are_refused_together(tmp_path) -> None:
    config = measured(tmp_path).model_copy(update={"progressive": True})
    with pytest.raises(ConfigError, match="cannot be combined"):
        optimize(BERT, config)


def test_the_real_timer_records_paired_runs_for_every_group(tmp_path) -> None:
    path = tmp_path / "conv.onnx"
    onnx.save(conv_bn_relu(), path)
    config = measured(tmp_path, budget_s=5.0, min_runs=6)
    result = optimize(path, config)  # through optimize(), as the CLI and worker call it
    record = result.measurement
    assert record["groups"] and record["final"]["runs"] >= 6
    assert record["groups"][0]["ratio"] is not None  # the first batch is always measured
    for group in record["groups"]:
        if group["ratio"] is None:  # a loaded machine: the budget ran out first
            assert not group["kept"]
            assert "time budget" in group["reason"] or "unmeasured" in group["reason"]
            continue
        assert group["ratio"]["runs"] >= 6
        # kept when it measured faster, unless the final comparison overruled every
        # group (the kept model as a whole measured slower than the original)
        overruled = record["fallback"] is not None
        assert group["kept"] == (group["ratio"]["verdict"] == "faster" and not overruled)
        if overruled and group["ratio"]["verdict"] == "faster":
            assert "as a whole measured slower" in group["reason"]
    assert result.check.passed
    # a kept group can still vanish: conv_activation measured after conv_bn's fold
    # cannot match once that fold is left out
    assert {f.pattern for f in result.applied} <= {
        g["pattern"] for g in record["groups"] if g["kept"]
    }
    timed = [g for g in record["groups"] if g["source"] == "measured"]
    assert record["store"]["measured"] == len(timed) == len(result.verdicts)
    assert record["store"]["written"] == len(timed)
    assert (tmp_path / "cache" / "verdicts.json").is_file()
