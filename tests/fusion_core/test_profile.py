"""Profiling: latency records, per-node and per-op-type times from onnxruntime's trace,
fused regions before and after, and JSON that survives ``allow_nan=False``.

Speed is never asserted (the machine is shared and noisy): only that records exist,
are non-zero, name nodes of the right model and add up.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from autofusion.fusion_core import (
    CheckOptions,
    ConfigError,
    OptimizeConfig,
    UnsafeModelError,
    optimize,
)
from autofusion.fusion_core.profiling import (
    LEVELS,
    NodeProfile,
    NodeTime,
    ProfileOptions,
    parse_trace,
    profile_models,
    region_times,
)

QUICK = ProfileOptions(warmup=1, iters=5, node_runs=3)

CONV_BN_RELU = """\
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,16,16] x) => (float[1,4,16,16] y) {
  c = Conv<pads=[1,1,1,1]>(x, w, b)
  n = BatchNormalization(c, bn_scale, bn_bias, bn_mean, bn_var)
  r = Relu(n)
  c2 = Conv<pads=[1,1,1,1]>(r, w2, b2)
  y = Relu(c2)
}
"""


def conv_model() -> onnx.ModelProto:
    """Conv -> BN -> Relu -> Conv -> Relu with named nodes (provenance names them)."""
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(CONV_BN_RELU)
    weights = {
        "w": rng.standard_normal((4, 3, 3, 3)),
        "b": rng.standard_normal(4),
        "bn_scale": rng.uniform(0.5, 2.0, 4),
        "bn_bias": rng.standard_normal(4),
        "bn_mean": rng.standard_normal(4),
        "bn_var": rng.uniform(0.5, 2.0, 4),
        "w2": rng.standard_normal((4, 4, 3, 3)),
        "b2": rng.standard_normal(4),
    }
    for name, array in weights.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(array.astype("float32"), name))
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}_{index}"
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    original = conv_model()
    result = optimize(
        original, OptimizeConfig(target="onnxruntime", check=CheckOptions(enabled=False))
    )
    assert result.applied, "the test model must fuse"
    return original, ir.serde.serialize_model(result.model)


@pytest.fixture(scope="module")
def report(models):
    original, fused = models
    return profile_models(original, fused, options=QUICK)


def names(model: onnx.ModelProto) -> set[str]:
    return {n.name for n in model.graph.node}


def test_node_records_are_non_zero_and_name_nodes_of_their_model(models, report) -> None:
    original, fused = models
    for profile, model in ((report.original_nodes, original), (report.fused_nodes, fused)):
        assert profile.runs == QUICK.node_runs
        assert profile.nodes and profile.traced_run_us > 0
        assert {n.name for n in profile.nodes} <= names(model)
        for node in profile.nodes:
            assert node.count == QUICK.node_runs
            assert node.total_us > 0 and node.mean_us > 0
    assert {n.op_type for n in report.fused_nodes.nodes} == {"FusedConv"}


def test_op_type_totals_are_the_sums_of_their_nodes(report) -> None:
    for profile in (report.original_nodes, report.fused_nodes):
        for op in profile.op_types:
            members = [n for n in profile.nodes if n.op_type == op.op_type]
            assert op.nodes == len(members)
            assert op.count == sum(n.count for n in members)
            assert op.total_us == pytest.approx(sum(n.total_us for n in members))
        assert {o.op_type for o in profile.op_types} == {n.op_type for n in profile.nodes}


def test_regions_map_fused_nodes_to_original_nodes(models, report) -> None:
    original, fused = models
    assert report.regions
    for region in report.regions:
        assert set(region.fused_nodes) <= names(fused)
        assert set(region.replaced_nodes) <= names(original)
        assert region.unmatched == ()
        assert region.before_us > 0 and region.after_us > 0
        assert math.isfinite(region.ratio)
    assert {p.pattern for p in report.patterns} == {r.pattern for r in report.regions}
    for pattern in report.patterns:
        members = [r for r in report.regions if r.pattern == pattern.pattern]
        assert pattern.regions == len(members)
        assert pattern.before_us == pytest.approx(sum(r.before_us for r in members))


def test_latency_is_measured_at_both_levels(report) -> None:
    assert [c.level for c in report.latency] == list(LEVELS)
    for comparison in report.latency:
        assert [s.label for s in comparison.sessions] == ["original", "fused"]
        for session in comparison.sessions:
            assert session.runs == QUICK.iters
            assert session.median_ms > 0 and session.create_ms > 0
            assert session.p90_ms >= session.median_ms >= session.min_ms
        assert math.isfinite(comparison.ratio) and comparison.ratio > 0


def test_memory_comes_from_the_allocator(report) -> None:
    for profile in (report.original_nodes, report.fused_nodes):
        memory = profile.memory
        assert memory.largest_node_io_bytes > 0
        if memory.allocator_peak_bytes is not None:  # reported by the CPU arena
            assert 0 < memory.allocator_peak_bytes <= memory.arena_held_bytes


def test_to_dict_is_plain_finite_json(report) -> None:
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert set(data) == {"options", "latency", "nodes", "regions", "patterns"}
    assert set(data["nodes"]) == {"original", "fused"}
    assert set(data["nodes"]["fused"]) == {
        "level",
        "runs",
        "total_us_per_run",
        "nodes",
        "op_types",
        "memory",
        "traced_run_us",
    }
    assert set(data["regions"][0]) == {
        "pattern",
        "fused_nodes",
        "replaced_nodes",
        "before_us",
        "after_us",
        "ratio",
        "unmatched",
    }


def test_one_model_alone_has_no_ratio_and_no_regions(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(conv_model(), path)
    options = ProfileOptions(warmup=0, iters=2, node_runs=1, levels=("ORT_DISABLE_ALL",))
    report = profile_models(path, options=options)
    (comparison,) = report.latency
    assert comparison.ratio is None and [s.label for s in comparison.sessions] == ["original"]
    assert report.fused_nodes is None and report.regions == [] and report.patterns == []
    json.dumps(report.to_dict(), allow_nan=False)


def test_given_feeds_must_cover_every_input() -> None:
    with pytest.raises(ConfigError, match="no input values"):
        profile_models(conv_model(), feeds={"other": np.zeros(1, np.float32)}, options=QUICK)


def test_external_data_outside_the_model_folder_is_refused(tmp_path) -> None:
    model = conv_model()
    tensor = next(t for t in model.graph.initializer if t.name == "w")
    onnx.external_data_helper.set_external_data(tensor, location="../secret.bin")
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    (tmp_path / "secret.bin").write_bytes(b"\0" * 432)
    (tmp_path / "m").mkdir()
    onnx.save(model, tmp_path / "m" / "model.onnx")
    with pytest.raises(UnsafeModelError):
        profile_models(tmp_path / "m" / "model.onnx", options=QUICK)


@pytest.mark.parametrize(
    "bad",
    [{"threads": 0}, {"iters": 0}, {"warmup": -1}, {"levels": ("FAST",)}, {"providers": ("X",)}],
    ids=["threads", "iters", "warmup", "level", "provider"],
)
def test_bad_options_are_config_errors(bad) -> None:
    with pytest.raises(ConfigError):
        ProfileOptions(**bad)


def test_trace_parsing_drops_warm_up_runs_and_tolerates_missing_stats() -> None:
    def run(ts: int) -> dict:
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": 50}

    def kernel(ts: int, dur: int) -> dict:
        args = {"op_name": "Relu", "activation_size": "8", "output_size": "8"}
        return {"cat": "Node", "name": "r_kernel_time", "ts": ts, "dur": dur, "args": args}

    fence = {"cat": "Node", "name": "r_fence_before", "ts": 101, "dur": 1, "args": {}}
    events = [run(0), kernel(10, 1000), run(100), kernel(110, 7), fence, run(200), kernel(210, 9)]
    profile = parse_trace(events, skip_runs=1, level="ORT_DISABLE_ALL")
    assert profile.runs == 2 and profile.traced_run_us == 50.0
    assert profile.nodes == [NodeTime("r", "Relu", 2, 16.0)]
    assert profile.per_run_us("r") == 8.0 and profile.per_run_us("missing") is None
    assert profile.memory.allocator_peak_bytes is None
    assert profile.memory.largest_node_io_bytes == 16


def test_a_fused_function_call_has_no_kernel_and_is_reported_unmatched() -> None:
    fused = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 17, "ai.test" : 1]>\n'
        "g (float[2] x) => (float[2] y) { y = ai.test.Region(x) }"
    )
    node = fused.graph.node[0]
    node.name = "region_0"
    for key, value in (("autofusion.pattern", "p"), ("autofusion.replaced_nodes", '["a", "b"]')):
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value
    before = NodeProfile("ORT_DISABLE_ALL", 2, [NodeTime("a", "Relu", 2, 4.0)])
    after = NodeProfile("ORT_DISABLE_ALL", 2, [NodeTime("_inlfunc_Region_x", "Relu", 2, 2.0)])
    (region,) = region_times(fused, before, after)
    assert region.before_us == 2.0 and region.after_us is None and region.ratio is None
    assert region.unmatched == ("region_0", "b")
    json.dumps(region.to_dict(), allow_nan=False)
