"""DeepSeek-V3-style sigmoid routers (GLM-4.5 MoE, dots.llm1, EXAONE-MoE, AFMoE): one
com.microsoft.MoE fed log(sigmoid(logits)) where the choice is the top k of the logits.

The router scores the experts by s = sigmoid(logits), picks the top k of s + bias (per
group first, or not) and weights them by s, renormalized or not, times a scaling
factor. onnxruntime's CPU kernel picks and weights by one softmax of its input: fed
log(s) it picks the top k of s and weighs s / sum(s) (``_sigmoid.py``), which is the
model's routing exactly when the bias is all zero and no group is dropped.

A generator (hypothesis) writes such blocks as the exporters do (dynamo's group
TopKs, mask and Where; TorchScript's + 1e-20 in the denominator; one group or several
all kept; the bias an Add of zeros or absent; the scaling factor; the batched experts'
spellings of ``test_mixture_of_experts.py``): each must become exactly one MoE and
compute what the original computes (onnxruntime, its optimizations off) on several
token counts, rtol = 1e-4, atol = 1e-5 (the kernel sums the experts in another order).
Ties (sigmoid is exactly 1.0 in float32 above about 16.6) are run too: ONNX's TopK
gives the lower index, the kernel the higher, which the rewrite turns round. A bias
not all zero and groups that drop experts fuse by the router's own choice instead
(``_any_router.py``); the generic target keeps the block, with a near miss. The
example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``, 200 in
``make test-corpus``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from test_mixture_of_experts import (
    _PLAIN,
    HIDDEN,
    Spelling,
    _batched,
    _Graph,
    generated,
    group_mask,
    kernel_routing,
    ops_of,
    scaled_weights,
    token_feeds,
)

from autofusion.fusion_core.testing import optimize_quiet, run_both

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-4, atol=1e-5)


@dataclass(frozen=True)
class Router:
    groups: int  # 0: no group step (AFMoE); else G groups, each scored by its top 2
    topk_group: int  # the groups kept
    bias: str  # "zero": an Add of zeros, "none": no Add, "random": a trained bias
    normalize: bool
    epsilon: bool  # TorchScript's + 1e-20 in the denominator
    scale: float  # routed_scaling_factor
    gemm_router: bool
    router_gain: float = 1.0  # the router weights' scale: large makes sigmoid saturate


@st.composite
def blocks(draw) -> tuple[Router, Spelling]:
    experts = draw(st.sampled_from([2, 4, 6, 8]))
    divisors = [g for g in (1, 2, 4) if experts % g == 0 and experts // g >= 2]
    groups = draw(st.sampled_from([0, *divisors]))
    router = Router(
        groups=groups,
        topk_group=groups,  # every group kept: the choice is the global top k
        bias=draw(st.sampled_from(["zero", "none"])),
        normalize=draw(st.booleans()),
        epsilon=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 2.5])),
        gemm_router=draw(st.booleans()),
    )
    experts_spelling = replace(
        _PLAIN,
        experts=experts,
        k=draw(st.integers(1, min(3, experts))),
        inter=draw(st.sampled_from([4, 8])),
        gather_nd=draw(st.booleans()),
        weight_first=draw(st.booleans()),
        fused_gate_up=draw(st.booleans()),
        split_by_slices=draw(st.booleans()),
        gate_second=draw(st.booleans()),
        repeat_by_tile=draw(st.booleans()),
    )
    return router, experts_spelling


def _router(g: _Graph, r: Router, s: Spelling, x: str) -> tuple[str, str]:
    """(routing weights [T, k], chosen experts [T, k])."""
    weight = g.weight(s.experts, HIDDEN) * np.float32(r.router_gain)
    if r.gemm_router:
        logits = g.one("Gemm", x, g.const(weight, "router"), transB=1)
    else:
        logits = g.one("MatMul", x, g.const(np.ascontiguousarray(weight.T), "router"))
    scores = g.one("Sigmoid", logits)
    choice = scores
    if r.bias != "none":
        bias = np.zeros(s.experts, np.float32)
        if r.bias == "random":
            bias = np.random.default_rng(7).uniform(-0.2, 0.2, s.experts).astype(np.float32)
        choice = g.one("Add", scores, g.const(bias, "e_score_correction_bias"))
    if r.groups:
        groups = (r.groups, r.topk_group)
        choice = group_mask(g, choice, s.experts, groups, score="top2", fill=-np.inf)
    chosen = g.op("TopK", choice, g.ints(s.k), outputs=2, axis=-1, sorted=0)[1]
    weights = g.one("GatherElements", scores, chosen, axis=1)
    finished = dict(normalize=r.normalize, epsilon=r.epsilon, scale=r.scale)
    return scaled_weights(g, weights, **finished), chosen


def sigmoid_block(r: Router, s: Spelling, seed: int = 0) -> onnx.ModelProto:
    g = _Graph(seed)
    weights, chosen = _router(g, r, s, "hidden")
    out = g.one("Add", _batched(g, s, "hidden", weights, chosen), "hidden")  # the residual
    shape = ["tokens", HIDDEN]
    return g.model("sigmoid_moe", out, shape)


feeds = token_feeds


def _misses(result) -> list[str]:
    return [m.reason for m in result.near_misses if m.pattern == "moe_sigmoid_topk"]


def _moe_attributes(model: onnx.ModelProto) -> dict:
    (moe,) = [n for n in model.graph.node if n.op_type == "MoE"]
    return {a.name: helper.get_attribute_value(a) for a in moe.attribute}


@generated()
@given(blocks())
def test_every_zero_bias_spelling_becomes_one_moe_exactly(block) -> None:
    r, s = block
    model = sigmoid_block(r, s)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = ops_of(fused)
    assert ops.count("MoE") == 1, f"{r} {s}: {_misses(result)}"
    assert "TopK" not in ops and "GatherElements" not in ops, f"{r} {s}: {ops}"
    attrs = _moe_attributes(fused)
    assert attrs["k"] == s.k
    assert attrs["normalize_routing_weights"] == int(r.normalize)
    for tokens in (1, 5, 17):
        run_both(model, fused, feeds=feeds(tokens), **TOL)


@pytest.mark.parametrize("normalize", [True, False], ids=["renormalized", "raw"])
def test_ties_where_sigmoid_saturates_go_to_the_lower_expert(normalize) -> None:
    """Router weights 1000 times larger: most scores are exactly 1.0 (or 0), so the
    choice is among equals; the fused block picks the experts the original picks."""
    r = Router(0, 0, "zero", normalize, False, 1.0, False, router_gain=1000.0)
    s = replace(_PLAIN, experts=6, k=2)
    model = sigmoid_block(r, s)
    fused = optimize_quiet(model, target="onnxruntime").to_proto()
    assert ops_of(fused).count("MoE") == 1
    hidden = feeds(64, seed=3)
    logits = hidden["hidden"] @ model_router(model)
    saturated = (logits > 17).sum(-1)
    assert (saturated > s.k).sum() > 10  # ties at the choice's edge, on many tokens
    run_both(model, fused, feeds=hidden, **TOL)


def model_router(model: onnx.ModelProto) -> np.ndarray:
    """The router's weight [hidden, experts] of a block with a MatMul router."""
    (matmul,) = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] == "hidden"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return inits[matmul.input[1]]


def test_the_kernel_gives_a_tie_to_the_higher_expert() -> None:
    """The fact the rewrite's reversal rests on: fails when onnxruntime changes it."""
    router = np.array([[0, 0, 0, 0], [0, 1, 1, 1]], np.float32)
    weights = kernel_routing(router, 2, 1)
    np.testing.assert_array_equal(weights, [[0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5]])


def deepseek_routing(logits: np.ndarray, k: int, normalize: bool, scale: float) -> np.ndarray:
    """transformers' DeepSeek-V3 routing (bias zero, one group) in numpy, per expert."""
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    chosen = np.argsort(-s, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(s, chosen, -1)
    if normalize:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    weights = np.zeros_like(s)
    np.put_along_axis(weights, chosen, w * scale, -1)
    return weights


@pytest.mark.parametrize("normalize", [True, False], ids=["renormalized", "raw"])
def test_log_sigmoid_in_the_kernel_is_deepseek_routing(normalize) -> None:
    """The identity the rewrite rests on, on the kernel itself: fed log(sigmoid(x)) it
    weighs s / sum(s) over its top k (times sum(s) when not renormalized)."""
    logits = np.random.default_rng(4).standard_normal((64, 8)).astype(np.float32) * 3
    s = 1 / (1 + np.exp(-logits.astype(np.float64)))
    got = kernel_routing(np.log(s).astype(np.float32), 3, int(normalize))
    if not normalize:
        got = got * s.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, deepseek_routing(logits, 3, normalize, 1.0), **TOL)


@pytest.mark.slow  # importing transformers' GLM-4.5 MoE (and torch): about 15 s
@pytest.mark.parametrize("normalize", [True, False], ids=["renormalized", "raw"])
def test_our_routing_is_transformers(normalize) -> None:
    glm = pytest.importorskip("transformers.models.glm4_moe.modeling_glm4_moe")
    config_module = pytest.importorskip("transformers.models.glm4_moe.configuration_glm4_moe")
    import torch

    config = config_module.Glm4MoeConfig(
        hidden_size=16, n_routed_experts=8, num_experts_per_tok=3, n_group=1, topk_group=1,
        norm_topk_prob=normalize, routed_scaling_factor=2.5,
    )  # fmt: skip
    router = glm.Glm4MoeTopkRouter(config)
    rng = np.random.default_rng(5)
    router.weight.data = torch.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
    hidden = rng.standard_normal((32, 16)).astype(np.float32)
    logits, weights, chosen = router(torch.from_numpy(hidden))
    expected = np.zeros((32, 8))
    np.put_along_axis(expected, chosen.numpy(), weights.detach().double().numpy(), -1)
    got = deepseek_routing(logits.detach().numpy(), 3, normalize, 2.5)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "r, experts",
    [
        # a trained e_score_correction_bias moves the choice, not the weights
        (Router(0, 0, "random", True, False, 1.0, False), 4),
        # two groups of four, one kept: the choice is the top k of the better group
        (Router(2, 1, "zero", True, False, 1.0, True), 8),
    ],
    ids=["selection-bias", "groups-drop-experts"],
)
def test_a_choice_the_kernels_top_k_cannot_make_fuses_by_the_routers_own(r, experts) -> None:
    """Not the fast path (the kernel's top k of log(sigmoid) is not the model's choice):
    the router stays and the kernel is fed its choice and weights (``_any_router.py``,
    ``test_mixture_of_experts_any_router.py``)."""
    model = sigmoid_block(r, replace(_PLAIN, experts=experts, k=2))
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = ops_of(fused)
    assert ops.count("MoE") == 1 and "Log" in ops and "TopK" in ops, (ops, _misses(result))
    run_both(model, fused, feeds=feeds(9), **TOL)


def test_generic_keeps_the_block_and_says_why() -> None:
    r = Router(1, 1, "zero", True, True, 2.5, False)
    result = optimize_quiet(sigmoid_block(r, _PLAIN), target="generic")
    assert "MoE" not in ops_of(result.to_proto())
    assert any("ONNX has no mixture-of-experts op" in m for m in _misses(result)), _misses(result)
