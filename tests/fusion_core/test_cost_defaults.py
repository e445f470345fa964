"""The default profile prices as losses the fusions that made the deployed model slower
(docs/cost.md, "Defaults that never lose"), so that default selection leaves them out.

On the real tiny transformer exports (tests/data/transformers) and the 8-channel
ResNet-50 (tests/data/resnet): the default profile ``cpu`` predicts every
SkipLayerNormalization and the Q/K/V merge to make their nodes slower, with the reason,
while attention, GELU and the CNN fusions still gain; ``cpu-roofline`` (the same prices
without kernel factors) still prices them all as gains. Cost-based selection (the
service's ``default`` preset: selection ``auto``) then leaves them out. Only predictions
and what is applied are asserted, never a time.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from autofusion.fusion_core import (
    CheckOptions,
    OptimizeConfig,
    builtin_patterns,
    load_model,
    optimize,
)
from autofusion.fusion_core.canonical import canonical_form
from autofusion.fusion_core.cost import CostModel, load_target_profile, rewrite_effect
from autofusion.fusion_core.patterns import Match, Matcher
from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses

DATA = Path(__file__).resolve().parents[1] / "data"
TRANSFORMERS = ["bert_eager_dynamo", "gpt2_eager_dynamo", "vit_eager_dynamo"]
LAYERS = 2
# The check's first shape profile when the caller gives one; none is the CLI's default.
DIMS = {"bert": {"batch": 1, "sequence": 16}, "gpt2": {"batch": 1, "sequence": 16}}
DIMS["vit"] = {"batch": 1}
ESTIMATES = ["hints", "shapes"]
SKIP_LN = "com.microsoft::SkipLayerNormalization"
MHA = "com.microsoft::MultiHeadAttention"


def _dims(name: str, estimate: str) -> dict[str, int]:
    return DIMS[name.split("_", 1)[0]] if estimate == "shapes" else {}


@functools.cache
def _candidates(path: Path, target: str = "onnxruntime") -> tuple[Match, ...]:
    """Every candidate of the built-in patterns for ``target`` after the pre-passes and
    the canonical form, as the first round of optimize() finds them."""
    model = load_model(path)
    run_prepasses(model, PrepassOptions())
    names = itertools.count()
    canonical_form(model.graph, lambda hint: f"{hint}__{next(names)}")
    specs = [p.spec for p in builtin_patterns() if target in p.spec.targets]
    return tuple(Matcher(specs).find(model.graph).candidates)


def _by_rewriter(path: Path, rewriter: str) -> list[Match]:
    found = [m for m in _candidates(path) if m.pattern.rewriter.name == rewriter]
    assert found, f"no {rewriter} candidate in {path.name}"
    return found


@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_the_default_profile_prices_skip_layer_normalization_as_a_loss(name, estimate):
    cpu = CostModel("cpu", dims=_dims(name, estimate))
    roofline = CostModel("cpu-roofline", dims=_dims(name, estimate))
    factor = cpu.profile.kernel_factor("skip_layer_norm")
    for match in _by_rewriter(DATA / "transformers" / f"{name}.onnx", "skip_layer_norm"):
        gain = cpu.candidate_gain(match)
        assert gain.estimated_from == estimate
        assert gain.loses and gain.kernel_factor == factor > 1, gain
        reason = cpu.loss_reason(gain)
        assert reason is not None and "predicts a loss on target profile 'cpu'" in reason
        assert "rewriter 'skip_layer_norm'" in reason and f"{factor:g}x" in reason
        assert not roofline.candidate_gain(match).loses  # the roofline alone: a gain


@pytest.mark.parametrize("estimate", ESTIMATES)
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_attention_and_gelu_still_gain_on_the_default_profile(name, estimate):
    cpu = CostModel("cpu", dims=_dims(name, estimate))
    path = DATA / "transformers" / f"{name}.onnx"
    for rewriter in ("attention_block", "gelu"):
        for match in _by_rewriter(path, rewriter):
            gain = cpu.candidate_gain(match)
            assert gain.gain_s > 0 and cpu.loss_reason(gain) is None, gain


@pytest.mark.parametrize("name", ["bert_eager_dynamo", "vit_eager_dynamo"])
def test_without_shapes_the_qkv_merge_is_priced_by_its_hints(name):
    """The default profile carries no factor for the merges (measured neutral on encoders
    and a decoder's prefill, faster on its decode step); cpu-kernels' fitted one, at
    ORT_DISABLE_ALL, still prices them as a loss."""
    cpu, kernels = CostModel("cpu"), CostModel("cpu-kernels")
    matches = list(_by_rewriter(DATA / "transformers" / f"{name}.onnx", "merge_siblings"))
    assert matches
    for match in matches:
        gain = cpu.candidate_gain(match)
        assert gain.estimated_from == "hints" and not gain.loses, gain
        assert gain.kernel_factor == 1.0 and cpu.loss_reason(gain) is None
        fitted = kernels.candidate_gain(match)
        assert fitted.loses and "rewriter 'merge_siblings'" in kernels.loss_reason(fitted)


QKV = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 128, 768] x) => (float[1, 128, 768] q, float[1, 128, 768] k, float[1, 128, 768] v) {
    mq = MatMul (x, wq)
    q = Add (mq, bq)
    mk = MatMul (x, wk)
    k = Add (mk, bk)
    mv = MatMul (x, wv)
    v = Add (mv, bv)
}"""


def test_the_qkv_merge_of_a_bert_base_layer_is_priced_by_the_roofline():
    """Q/K/V projections of BERT-base's size (hidden 768, sequence 128): the merged MatMul
    computes the same FLOPs, so the shared input's saved re-reads are ~2% of their time;
    the default profile prices that as the roofline does, cpu-kernels' fitted factor
    (onnxruntime's merge at ORT_DISABLE_ALL: MatMul + Add + a Split that copies) as a loss."""
    proto = onnx.parser.parse_model(QKV)
    rng = np.random.default_rng(0)
    for name in ("q", "k", "v"):
        weight = rng.standard_normal((768, 768)).astype(np.float32)
        proto.graph.initializer.append(numpy_helper.from_array(weight, f"w{name}"))
        bias = rng.standard_normal(768).astype(np.float32)
        proto.graph.initializer.append(numpy_helper.from_array(bias, f"b{name}"))
    model = ir.from_proto(proto)
    run_prepasses(model, PrepassOptions())
    specs = [p.spec for p in builtin_patterns() if p.name == "qkv_bias_merge"]
    (match,) = Matcher(specs).find(model.graph).candidates
    cpu = CostModel("cpu").candidate_gain(match)
    roofline = CostModel("cpu-roofline").candidate_gain(match)
    kernels = CostModel("cpu-kernels").candidate_gain(match)
    assert cpu.estimated_from == roofline.estimated_from == "shapes"
    assert 1.0 < roofline.speedup < 1.05  # the roofline alone: a gain of a few percent
    assert not cpu.loses and cpu.kernel_factor == 1.0
    assert cpu.speedup == pytest.approx(roofline.speedup, rel=0.02)  # the profiles' rooflines
    assert (
        kernels.loses
        and kernels.kernel_factor
        == load_target_profile("cpu-kernels").kernel_factors["merge_siblings"]
    )


def test_a_pre_ln_skip_layer_norm_does_not_count_the_next_add_as_fused():
    """The next residual Add is in the match so that the sum may escape; the rewriter
    re-creates it, so its time is in neither side of the prediction."""
    path = DATA / "transformers" / "gpt2_eager_dynamo.onnx"
    pre_ln = [m for m in _candidates(path) if m.pattern.name == "skip_layer_norm_pre_ln"]
    assert pre_ln
    roofline = CostModel("cpu-roofline", dims=DIMS["gpt2"])
    for match in pre_ln:
        assert rewrite_effect(match).fused == ("add", "ln")
        gain = roofline.candidate_gain(match)
        alone = sum(roofline.node_time(match.nodes[n]) for n in ("add", "ln"))
        assert gain.time_before_s == pytest.approx(alone, rel=1e-12)
        assert gain.launches_saved == 1


def test_the_cnn_fusions_still_gain_on_the_default_profile():
    cpu = CostModel("cpu")
    path = DATA / "resnet" / "resnet50_w8_dynamo.onnx"
    conv = [
        m
        for m in _candidates(path)
        if m.pattern.rewriter.name in ("fold_batchnorm", "fuse_activation")
    ]
    assert len(conv) >= 53
    for match in conv:
        gain = cpu.candidate_gain(match)
        assert gain.estimated_from == "shapes" and gain.gain_s > 0, gain


def _optimize(name: str, **config) -> object:
    return optimize(
        DATA / "transformers" / f"{name}.onnx",
        OptimizeConfig(target="onnxruntime", check=CheckOptions(rtol=0.0, atol=1e-4), **config),
    )


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_the_default_preset_leaves_skip_layer_norm_out_and_prices_no_merge_out(name):
    """The service's ``default`` preset is selection ``auto`` on every pattern."""
    result = _optimize(name, selection="auto")
    assert result.check is not None and result.check.passed, result.check
    assert result.ops_after.get(SKIP_LN, 0) == 0
    assert result.ops_after["LayerNormalization"] == 2 * LAYERS + 1
    # a merge may lose to attention over the same MatMuls, never to a predicted loss
    priced_out = [m for m in result.near_misses if "merge" in m.pattern and "loss" in m.reason]
    assert not priced_out, priced_out
    # BERT's and ViT's attention then packs with its merged projection; GPT-2's Conv1D
    # projection is one Gemm already, so its MultiHeadAttention stays
    packed = name.startswith(("bert", "vit"))
    assert result.ops_after["com.microsoft::Attention" if packed else MHA] == LAYERS
    assert sum(n for p, n in result.counts.items() if p.startswith("gelu_")) == LAYERS
    rejected = {r["pattern"] for s in result.selections for r in s["rejected"]}
    assert any(p.startswith("skip_layer_norm") for p in rejected)


@pytest.mark.parametrize("name", ["gpt2_eager_dynamo"])
def test_the_cli_default_leaves_skip_layer_norm_out_and_says_why(name):
    result = _optimize(name)  # OptimizeConfig(): priority selection, profile cpu
    assert result.check is not None and result.check.passed, result.check
    assert result.ops_after.get(SKIP_LN, 0) == 0
    assert result.ops_after[MHA] == LAYERS
    factor = load_target_profile("cpu").kernel_factor("skip_layer_norm")
    left_out = [
        m.reason
        for m in result.near_misses
        if m.pattern.startswith("skip_layer_norm") and "the cost model predicts a loss" in m.reason
    ]
    assert left_out, result.near_misses
    assert all(f"skip_layer_norm' emits runs {factor:g}x" in r for r in left_out), left_out


def test_cpu_roofline_is_the_cpu_profile_without_its_kernel_factors():
    cpu, roofline = load_target_profile("cpu"), load_target_profile("cpu-roofline")
    prices = {"name", "description", "kernel_factors"}
    assert roofline.model_dump(exclude=prices) == cpu.model_dump(exclude=prices)
    assert roofline.kernel_factors == {} and cpu.kernel_factors
    # every rewriter's factor the default carries was fitted (cpu-kernels) and is carried
    # as fitted; the soft-capped attention's were measured deployed (bench_llm.py, its
    # prefill) and per kernel (bench_softcap_kernel.py, its decode: cpu.yaml)
    fitted = load_target_profile("cpu-kernels").kernel_factors
    deployed = {"attention+softcap", "attention+softcap+cache"}
    assert all(
        fitted[name] == factor > 1
        for name, factor in cpu.kernel_factors.items()
        if name not in deployed
    )
    assert all(cpu.kernel_factors[name] > 1 for name in deployed)


def test_a_pattern_can_carry_its_own_kernel_factor() -> None:
    """Soft-capped GroupQueryAttention measured slower than the nodes it replaces on
    onnxruntime's CPU (a 1.22x prefill on Gemma-2, cpu.yaml), the same op without the
    cap faster: the factor belongs to that optional group of the attention pattern, not
    to the rewriter nor to the pattern's other variants."""
    cpu = load_target_profile("cpu")
    capped = ("repeat_kv", "softcap", "mask")
    assert cpu.kernel_factor("attention_block", "attention", capped) > 5
    assert cpu.kernel_factor("attention_block", "attention", ("repeat_kv", "mask")) == 1.0
    assert cpu.kernel_factor("attention_block", "attention") == 1.0
    assert cpu.kernel_factor("skip_layer_norm", "skip_layer_norm_pre_ln") == 12.7
    roofline = load_target_profile("cpu-roofline")
    assert roofline.kernel_factor("attention_block", "attention", capped) == 1.0
