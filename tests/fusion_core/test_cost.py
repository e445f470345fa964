"""The cost model: node FLOPs and bytes, candidate gains on real matches, profiles.

Node counts are compared with values computed by hand from the shapes; candidate gains
come from the built-in patterns matched on small models after the pre-passes. Speed is
never asserted: only counts, and the direction in which a profile moves a prediction.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
import yaml
from onnx import numpy_helper

from autofusion.fusion_core.catalog import builtin_patterns
from autofusion.fusion_core.cost import (
    CostModel,
    Gain,
    TargetProfile,
    load_target_profile,
    rewrite_effect,
    shipped_profiles,
)
from autofusion.fusion_core.cost.fit import fit_kernel_factors
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.patterns import Match, Matcher, PatternSpec
from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses
from autofusion.fusion_core.rewriters import RewriteEffect, builtin_rewriters, matched
from autofusion.fusion_core.rewriters.fold_batchnorm import FoldBatchNorm

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
F32 = 4
RNG = np.random.default_rng(0)


def make_model(text: str, **initializers: np.ndarray) -> ir.Model:
    """ONNX text + initializers, checked, pre-passed (shapes inferred) as the pipeline does."""
    proto = onnx.parser.parse_model(HEADER + text)
    for name, array in initializers.items():
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    onnx.checker.check_model(proto, full_check=True)
    model = ir.from_proto(proto)
    run_prepasses(model, PrepassOptions())
    return model


def nodes(model: ir.Model) -> dict[str, ir.Node]:
    return {n.name: n for n in model.graph}


@functools.cache
def builtin_specs() -> tuple[PatternSpec, ...]:
    return tuple(p.spec for p in builtin_patterns())


def matches(model: ir.Model, *specs: PatternSpec) -> dict[str, Match]:
    """Every candidate of the built-in patterns (or ``specs``), by pattern name."""
    specs = specs or builtin_specs()
    found = Matcher(list(specs)).find(model.graph).candidates
    return {m.pattern.name: m for m in found}


def weights(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def profile(**changes: float) -> TargetProfile:
    base = {
        "name": "test",
        "memory_bandwidth_bytes_per_s": 1e10,
        "launch_overhead_s": 1e-6,
        "peak_flops_per_s": 1e11,
        "l1_cache_bytes": 32 * 1024,
        "l2_cache_bytes": 1024 * 1024,
        "fusion_buffer_bytes": 1024 * 1024,
        "memory_pool_bytes": 1 << 30,
    }
    return TargetProfile(**(base | changes))


CPU = CostModel(profile())


# --- node costs ------------------------------------------------------------------------


def test_matmul_flops_are_two_per_multiply_add_and_bytes_are_inputs_and_outputs():
    model = make_model(
        "g (float[2,3,4] x) => (float[2,3,5] y) { [mm] y = MatMul(x, w) }", w=weights(4, 5)
    )
    cost = CPU.node_cost(nodes(model)["mm"])
    assert cost.flops == 2 * (2 * 3) * 5 * 4
    assert cost.bytes_read == (2 * 3 * 4 + 4 * 5) * F32  # the initializer is read too
    assert cost.bytes_written == 2 * 3 * 5 * F32


def test_gemm_flops_follow_trans_a_and_count_the_bias():
    model = make_model(
        "g (float[4,3] a) => (float[3,5] y) { [gemm] y = Gemm<transA = 1>(a, b, c) }",
        b=weights(4, 5),
        c=weights(5),
    )
    m, n, k = 3, 5, 4
    assert CPU.node_cost(nodes(model)["gemm"]).flops == 2 * m * n * k + m * n


@pytest.mark.parametrize(
    ("group", "c_in", "c_out", "bias"),
    [(1, 4, 6, False), (2, 4, 6, True), (4, 4, 4, False)],
    ids=["dense", "grouped-bias", "depthwise"],
)
def test_conv_flops_count_input_channels_per_group_and_kernel(group, c_in, c_out, bias):
    args = "x, w, b" if bias else "x, w"
    model = make_model(
        f"g (float[1,{c_in},8,8] x) => (float[1,{c_out},8,8] y) {{\n"
        f"  [conv] y = Conv<pads = [1,1,1,1], group = {group}>({args})\n}}",
        w=weights(c_out, c_in // group, 3, 3),
        **({"b": weights(c_out)} if bias else {}),
    )
    out = c_out * 8 * 8
    expected = 2 * out * (c_in // group) * 3 * 3 + (out if bias else 0)
    assert CPU.node_cost(nodes(model)["conv"]).flops == expected


def test_conv_transpose_flops_scatter_each_input_over_the_kernel():
    model = make_model(
        "g (float[1,2,4,4] x) => (float[1,6,6,6] y) {\n"
        "  [deconv] y = ConvTranspose<group = 2>(x, w)\n}",
        w=weights(2, 3, 3, 3),  # [C_in, C_out / group, kH, kW]
    )
    assert CPU.node_cost(nodes(model)["deconv"]).flops == 2 * (2 * 4 * 4) * 3 * 3 * 3


def test_elementwise_bytes_are_exact_and_transcendentals_cost_more():
    model = make_model(
        "g (float[2,3] x) => (float[2,3] y) {\n  [add] a = Add(x, b)\n  [erf] y = Erf(a)\n}",
        b=weights(3),
    )
    add, erf = CPU.node_cost(nodes(model)["add"]), CPU.node_cost(nodes(model)["erf"])
    assert (add.flops, add.bytes_read, add.bytes_written) == (6, (6 + 3) * F32, 6 * F32)
    assert erf.flops == 8 * 6 and erf.flops > add.flops


def test_a_reshape_is_a_view_that_copies_nothing():
    model = make_model(
        "g (float[2,6] x) => (float[3,4] y) { [reshape] y = Reshape(x, shape) }",
        shape=np.array([3, 4], np.int64),
    )
    cost = CPU.node_cost(nodes(model)["reshape"])
    assert cost.view and (cost.flops, cost.bytes) == (0, 0)


def test_symbolic_dims_are_unknown_until_the_dims_profile_resolves_them():
    model = make_model(
        "g (float[N,8] x) => (float[N,4] y) { [mm] y = MatMul(x, w) }", w=weights(8, 4)
    )
    mm = nodes(model)["mm"]
    assert CPU.node_cost(mm) is None
    resolved = CostModel(profile(), dims={"N": 3}).node_cost(mm)
    assert resolved.flops == 2 * 3 * 4 * 8
    assert resolved.bytes_written == 3 * 4 * F32


# --- candidate gains ----------------------------------------------------------------------

CONV_BN_RELU = """
g (float[{batch},3,8,8] x) => (float[{batch},4,8,8] y) {{
  [conv] c = Conv<pads = [1,1,1,1]>(x, w)
  [bn] b = BatchNormalization(c, gamma, beta, mean, var)
  [relu] y = Relu(b)
}}
"""


def conv_bn_relu(batch: str = "1") -> ir.Model:
    channel = np.ones(4, np.float32)
    return make_model(
        CONV_BN_RELU.format(batch=batch),
        w=weights(4, 3, 3, 3),
        gamma=channel,
        beta=channel,
        mean=channel,
        var=channel,
    )


ACTIVATION = 1 * 4 * 8 * 8 * F32  # bytes of the conv's and the BN's outputs


def test_conv_bn_relu_saves_its_intermediates_two_launches_and_the_bn_flops():
    found = matches(conv_bn_relu())
    gain = CPU.candidate_gain(found["conv_bn_relu"])

    assert gain.estimated_from == "shapes"
    # c and b: each written once and read back once, no longer.
    assert gain.bytes_saved == 2 * ACTIVATION + 2 * ACTIVATION
    assert gain.launches_saved == 2
    assert gain.flops_delta == -2 * (4 * 8 * 8)  # inference BN: x * s + t per element
    inputs = (3 * 8 * 8 + 4 * 3 * 3 * 3 + 4 * 4) * F32
    assert gain.working_set_bytes == inputs + ACTIVATION + ACTIVATION
    assert gain.gain_s > 0 and gain.speedup > 1
    assert gain.time_before_s - gain.time_after_s == pytest.approx(gain.gain_s)


def test_conv_bn_removes_the_bn_flops_and_conv_relu_keeps_them():
    found = matches(conv_bn_relu())
    conv_bn = CPU.candidate_gain(found["conv_bn"])
    assert (conv_bn.bytes_saved, conv_bn.launches_saved) == (2 * ACTIVATION, 1)
    assert conv_bn.flops_delta == -2 * (4 * 8 * 8)


def test_the_cost_effect_is_the_rewriters_own() -> None:
    """A registry whose fold_batchnorm says nothing folds away prices conv_bn so."""

    class NothingFolds(FoldBatchNorm):
        def cost_effect(self, match, params):
            return RewriteEffect(matched(match))

    conv_bn = matches(conv_bn_relu())["conv_bn"]
    assert rewrite_effect(conv_bn).removed == ("bn",)
    registry = builtin_rewriters()
    registry.register(NothingFolds())
    gain = CostModel(CPU.profile, rewriters=registry).candidate_gain(conv_bn)
    assert gain.flops_delta == 0 and gain.launches_saved == 1


MATMUL_ADD_GELU = """
g (float[4,8] x) => (float[4,16] y) {
  [mm] m = MatMul(x, w)
  [bias] h = Add(m, b)
  [half] g = Mul(h, half)
  [scale] s = Div(h, sqrt2)
  [erf] e = Erf(s)
  [one] o = Add(e, one_c)
  [out] y = Mul(g, o)
}
"""


def matmul_add_gelu() -> ir.Model:
    return make_model(
        MATMUL_ADD_GELU,
        w=weights(8, 16),
        b=weights(16),
        sqrt2=np.array(math.sqrt(2), np.float32),
        one_c=np.array(1.0, np.float32),
        half=np.array(0.5, np.float32),
    )


HIDDEN = 4 * 16 * F32


def test_matmul_add_gelu_gains_count_each_internal_tensor_and_shared_reads():
    found = matches(matmul_add_gelu())
    gemm = CPU.candidate_gain(found["matmul_add"])
    gelu = CPU.candidate_gain(found["gelu_erf"])
    bias_gelu = CPU.candidate_gain(found["gelu_erf_bias"])

    assert (gemm.bytes_saved, gemm.launches_saved, gemm.flops_delta) == (2 * HIDDEN, 1, 0)
    # s, e, o, g written and read back once; h (outside) was read by two nodes, now once.
    assert (gelu.bytes_saved, gelu.launches_saved, gelu.flops_delta) == (9 * HIDDEN, 4, 0)
    # Here h is internal: written once and read by scale and gate.
    assert (bias_gelu.bytes_saved, bias_gelu.launches_saved) == (11 * HIDDEN, 5)


def test_more_bandwidth_predicts_a_smaller_gain_from_memory_savings():
    match = matches(matmul_add_gelu())["gelu_erf"]
    compute_free = {"peak_flops_per_s": 1e18}  # keep every node memory-bound
    gains = [
        CostModel(profile(memory_bandwidth_bytes_per_s=bw, **compute_free)).candidate_gain(match)
        for bw in (1e9, 1e10, 1e11, 1e12)
    ]
    assert [g.gain_s for g in gains] == sorted((g.gain_s for g in gains), reverse=True)
    assert len({g.gain_s for g in gains}) == 4
    assert all(g.bytes_saved == gains[0].bytes_saved for g in gains)


def test_a_longer_launch_overhead_predicts_a_larger_gain():
    match = matches(conv_bn_relu())["conv_bn_relu"]
    short = CostModel(profile(launch_overhead_s=1e-7)).candidate_gain(match)
    long = CostModel(profile(launch_overhead_s=1e-5)).candidate_gain(match)
    assert long.gain_s - short.gain_s == pytest.approx(2 * (1e-5 - 1e-7))


def test_qkv_merge_keeps_flops_and_reads_the_shared_input_once():
    model = make_model(
        "g (float[4,8] x) => (float[4,8] q, float[4,8] k, float[4,8] v) {\n"
        "  [q] q = MatMul(x, wq)\n  [k] k = MatMul(x, wk)\n  [v] v = MatMul(x, wv)\n}",
        wq=weights(8, 8),
        wk=weights(8, 8),
        wv=weights(8, 8),
    )
    gain = CPU.candidate_gain(matches(model)["qkv_merge"])
    assert gain.flops_delta == 0
    assert gain.launches_saved == 1  # one MatMul and a Split
    assert gain.bytes_saved == 2 * 4 * 8 * F32


def test_symbolic_shapes_without_dims_fall_back_to_the_pattern_hints():
    match = matches(conv_bn_relu(batch="N"))["conv_bn_relu"]

    hinted = CPU.candidate_gain(match)
    assert hinted.estimated_from == "hints"
    assert hinted.speedup == pytest.approx(1 / (1 - 0.66))  # conv_bn_relu's memory_saving
    assert hinted.launches_saved == 2 and hinted.gain_s == pytest.approx(2e-6)
    assert hinted.bytes_saved is None and hinted.flops_delta is None

    resolved = CostModel(profile(), dims={"N": 1}).candidate_gain(match)
    static = CPU.candidate_gain(matches(conv_bn_relu())["conv_bn_relu"])
    assert resolved.estimated_from == "shapes"
    assert resolved.bytes_saved == static.bytes_saved


def test_no_shapes_and_no_hints_is_an_estimate_from_nothing():
    spec = PatternSpec.model_validate(
        {
            "name": "relu_relu",
            "nodes": [{"id": "a", "op": "Relu"}, {"id": "b", "op": "Relu", "inputs": {0: "a"}}],
            "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
        }
    )
    model = make_model("g (float[N,4] x) => (float[N,4] y) { a = Relu(x)\n y = Relu(a) }")
    gain = CPU.candidate_gain(matches(model, spec)["relu_relu"])
    assert (gain.estimated_from, gain.speedup, gain.launches_saved) == ("none", None, 1)


def test_gains_serialise_to_strict_json():
    found = matches(conv_bn_relu())
    gains = CPU.score(list(found.values())) + [
        CPU.candidate_gain(matches(conv_bn_relu(batch="N"))["conv_bn_relu"])
    ]
    for gain in gains:
        assert isinstance(gain, Gain)
        data = json.loads(json.dumps(gain.to_dict(), allow_nan=False))
        assert data["pattern"] == gain.pattern and data["estimated_from"] in ("shapes", "hints")


# --- target profiles ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cpu", "cpu-kernels", "gpu"])
def test_shipped_profiles_load_with_positive_prices(name):
    loaded = load_target_profile(name)
    assert name in shipped_profiles() and loaded.name == name
    prices = loaded.model_dump(
        exclude={"name", "description", "calibration", "kernel_factors", "value_info"}
    )
    assert all(value > 0 for value in prices.values())
    assert all(value > 0 for value in loaded.kernel_factors.values())


def test_the_gpu_profile_is_faster_than_the_cpu_one():
    cpu, gpu = load_target_profile("cpu"), load_target_profile("gpu")
    assert gpu.memory_bandwidth_bytes_per_s > cpu.memory_bandwidth_bytes_per_s
    assert gpu.peak_flops_per_s > cpu.peak_flops_per_s
    assert gpu.launch_overhead_s > cpu.launch_overhead_s  # a device launch costs more


def test_an_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError, match="unknown target profile 'tpu'") as info:
        load_target_profile("tpu")
    assert "cpu" in str(info.value) and "gpu" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("memory_bandwidth_bytes_per_s", -1), ("launch_overhead_s", "fast"), ("cache_lines", 64)],
    ids=["negative", "not-a-number", "unknown-field"],
)
def test_an_invalid_profile_file_names_the_field(tmp_path, field, value):
    data = load_target_profile("cpu").model_dump(mode="json", exclude_none=True)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data | {field: value}), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"bad.yaml' is invalid: {field}"):
        load_target_profile(path)


def test_a_profile_missing_a_field_or_not_a_mapping_is_refused(tmp_path):
    data = load_target_profile("gpu").model_dump(mode="json", exclude_none=True)
    del data["peak_flops_per_s"]
    missing = tmp_path / "missing.yaml"
    missing.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match="peak_flops_per_s"):
        load_target_profile(missing)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds no mapping"):
        load_target_profile(listing)
    with pytest.raises(ConfigError, match="cannot read"):
        load_target_profile(tmp_path / "absent.yaml")


def test_cost_model_accepts_a_profile_name():
    assert CostModel("gpu").profile.name == "gpu"


# --- kernel factors (a profile's measured correction of the roofline, per rewriter) ----


def _conv_bn_relu_match():
    model = conv_bn_relu()
    return matches(model)["conv_bn_relu"]


def test_a_kernel_factor_scales_the_fused_kernels_time_only():
    match = _conv_bn_relu_match()
    assert match.pattern.rewriter.name == "fuse_activation"
    plain = CostModel(profile()).candidate_gain(match)
    slow = CostModel(profile(kernel_factors={"fuse_activation": 4.0})).candidate_gain(match)
    other = CostModel(profile(kernel_factors={"skip_layer_norm": 4.0})).candidate_gain(match)
    assert slow.time_before_s == plain.time_before_s
    assert slow.time_after_s == pytest.approx(4.0 * plain.time_after_s, rel=1e-12)
    assert slow.gain_s < 0 < plain.gain_s  # the fusion is now predicted to lose
    assert other == plain  # a factor for another rewriter changes nothing


def test_a_profile_refuses_a_factor_that_is_not_positive():
    with pytest.raises(ValueError, match="must be positive"):
        profile(kernel_factors={"fuse_activation": 0.0})


def _entry(rewriter, predicted, measured, from_fusions=()):
    return {
        "rewriter": rewriter,
        "provenance": {"from_fusions": list(from_fusions)},
        "predicted_gain": {"before_us": predicted[0], "after_us": predicted[1]},
        "measured_gain": {"before_us": measured[0], "after_us": measured[1]},
    }


def test_a_factor_is_the_measured_ratio_over_the_predicted_one():
    report = {
        "applied": [
            # (measured after / before) / (predicted after / before)
            _entry("fuse_activation", (10.0, 5.0), (20.0, 10.0)),  # 0.5 / 0.5 = 1
            _entry("fuse_activation", (30.0, 10.0), (60.0, 30.0)),  # 0.5 / (1/3) = 1.5
            _entry("skip_layer_norm", (10.0, 4.0), (20.0, 32.0)),  # 1.6 / 0.4 = 4
            # built on fusion 0: the region's predicted before is the chain's,
            # 10 + 1 - 5 (fusion 0's kernel is inside) = 6; 0.5 / (5 / 6) = 0.6
            _entry("merge_siblings", (1.0, 5.0), (60.0, 30.0), from_fusions=[0]),
            # no measurement (the report was not profiled there): ignored
            {"rewriter": "fold_batchnorm", "predicted_gain": {"before_us": 1, "after_us": 1}},
        ]
    }
    scale, fitted = fit_kernel_factors([report])
    assert scale == 2.0  # median measured / predicted before: 2, 2, 2, 10
    by_name = {f.key: f for f in fitted}
    assert sorted(by_name) == ["fuse_activation", "merge_siblings", "skip_layer_norm"]
    assert by_name["fuse_activation"].factor == 1.25  # median of 1 and 1.5
    assert (by_name["fuse_activation"].low, by_name["fuse_activation"].high) == (1.0, 1.5)
    assert by_name["fuse_activation"].regions == 2
    assert by_name["skip_layer_norm"].factor == pytest.approx(4.0, rel=1e-12)
    assert by_name["merge_siblings"].factor == pytest.approx(0.6, rel=1e-12)


def test_reports_without_profiled_regions_cannot_be_fitted():
    with pytest.raises(ConfigError, match="optimize --profile"):
        fit_kernel_factors([{"applied": [{"rewriter": "x", "predicted_gain": None}]}])


def test_the_kernel_factors_profile_is_the_cpu_profile_plus_factors():
    cpu, fitted = load_target_profile("cpu"), load_target_profile("cpu-kernels")
    prices = {"name", "description", "calibration", "kernel_factors"}
    assert fitted.model_dump(exclude=prices) == cpu.model_dump(exclude=prices)
    assert fitted.kernel_factor("skip_layer_norm") > 1 and fitted.kernel_factor("nope") == 1.0


def test_without_shapes_a_kernel_factor_divides_the_hinted_speedup():
    match = matches(conv_bn_relu(batch="N"))["conv_bn_relu"]  # hints: speedup 1 / 0.34
    mild = CostModel(profile(kernel_factors={"fuse_activation": 2.0})).candidate_gain(match)
    assert mild.estimated_from == "hints"
    assert mild.speedup == pytest.approx(1 / (1 - 0.66) / 2.0)
    assert mild.gain_s == pytest.approx(2e-6)  # still above 1: the launches saved
    slow = CostModel(profile(kernel_factors={"fuse_activation": 10.0})).candidate_gain(match)
    assert slow.speedup < 1 and slow.gain_s == pytest.approx(-2e-6)  # predicted to lose
