"""PhiMoE's sparsemixer router: com.microsoft.MoE fed the router's own choice and weights.

transformers' ``sparsemixer`` (inference) weights each of its two experts by a softmax
over only the experts within 2 * jitter_eps (relative) of that round's maximum; the
CPU kernel of onnxruntime 1.32 accepts ``use_sparse_mixer=1`` and routes exactly as
without it (softmax over every expert, top 2). The first tests pin that fact with
identity experts that write each routing weight into a column of their own (it is why
the attribute is never emitted). A sparsemixer block as the exporters write it keeps
its router and becomes one MoE fed log of the router's weights scattered over the
experts (``_any_router.py``), the outputs unchanged: rtol = 1e-4, atol = 1e-5, on
scores close enough that both weights differ from the kernel's own softmax.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_mixture_of_experts import _PLAIN, HIDDEN, Spelling, _batched, _Graph, kernel_routing

from autofusion.fusion_core.testing import optimize_quiet, run_both

JITTER_EPS = 0.01  # PhimoeConfig.router_jitter_noise's default


def sparsemixer(scores: np.ndarray, eps: float = JITTER_EPS) -> np.ndarray:
    """transformers' sparsemixer (training=False) in numpy: the routing weight of each
    expert per token, [tokens, experts] (zero where not chosen)."""
    s = scores.astype(np.float64)
    rows = np.arange(len(s))
    weights = np.zeros_like(s)
    masked_scores = s
    for _ in range(2):
        top = masked_scores.max(-1, keepdims=True)
        chosen = masked_scores.argmax(-1)
        far = (top - s) / np.maximum(np.abs(s), top) > 2 * eps
        gates = np.where(far, -np.inf, masked_scores)
        p = np.exp(gates - gates.max(-1, keepdims=True))
        weights[rows, chosen] = (p / p.sum(-1, keepdims=True))[rows, chosen]
        masked_scores = masked_scores.copy()
        masked_scores[rows, chosen] = -np.inf
    return weights


def softmax_top2(scores: np.ndarray) -> np.ndarray:
    s = scores.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :2]
    weights = np.zeros_like(p)
    np.put_along_axis(weights, top, np.take_along_axis(p, top, -1), -1)
    return weights


@pytest.mark.slow  # importing transformers' PhiMoE (and torch): about 15 s
def test_our_sparsemixer_is_transformers() -> None:
    phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")
    import torch

    scores = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    scores[::2] *= 0.01  # close scores: several experts within 2 eps of the maximum
    weights, chosen = phimoe.sparsemixer(torch.from_numpy(scores), JITTER_EPS, training=False)
    expected = np.zeros(scores.shape)
    np.put_along_axis(expected, chosen.numpy(), weights.double().numpy(), -1)
    np.testing.assert_allclose(sparsemixer(scores), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("experts", [4, 8, 16])
def test_the_cpu_kernel_routes_as_if_use_sparse_mixer_were_off(experts) -> None:
    rng = np.random.default_rng(experts)
    scores = rng.standard_normal((32, experts)).astype(np.float32)
    scores[::2] *= 0.01
    sparse = kernel_routing(scores, 2, 0, use_sparse_mixer=1)
    plain = kernel_routing(scores, 2, 0)
    np.testing.assert_array_equal(sparse, plain)  # the attribute changes nothing
    np.testing.assert_allclose(sparse, softmax_top2(scores), rtol=1e-5, atol=1e-6)
    assert np.abs(sparse - sparsemixer(scores)).max() > 0.1  # not PhiMoE's routing


def _sparsemixer_router(g: _Graph, scores: str) -> tuple[str, str]:
    """(weights [T, 2], chosen [T, 2]) as the exporters write sparsemixer."""
    threshold = g.const(np.array(2 * JITTER_EPS, np.float32), "threshold")
    minus_inf = g.const(np.array(-np.inf, np.float32), "minus_inf")
    magnitude = g.one("Abs", scores)
    masked_scores, weights, chosen = scores, [], []
    for _ in range(2):
        top = g.one("ReduceMax", masked_scores, g.ints(-1), keepdims=1)
        choice = g.one("ArgMax", masked_scores, axis=-1, keepdims=1)
        gap = g.one("Div", g.one("Sub", top, scores), g.one("Max", magnitude, top))
        gates = g.one("Where", g.one("Greater", gap, threshold), minus_inf, masked_scores)
        weights.append(g.one("GatherElements", g.one("Softmax", gates, axis=-1), choice, axis=-1))
        chosen.append(choice)
        fill = g.one("Expand", minus_inf, g.one("Shape", choice))
        masked_scores = g.one("ScatterElements", masked_scores, choice, fill, axis=-1)
    return g.one("Concat", *weights, axis=-1), g.one("Concat", *chosen, axis=-1)


def phimoe_block(close: bool = False) -> onnx.ModelProto:
    """A sparsemixer block; ``close``: scores 10 + small ones (a router bias), so that
    several experts are within 2 eps (relative) of each round's maximum and the
    weights are softmaxes over more than one expert."""
    g = _Graph(seed=5)
    weight = g.weight(HIDDEN, 4) * np.float32(0.03 if close else 1.0)
    scores = g.one("MatMul", "hidden", g.const(weight, "router"))
    if close:
        scores = g.one("Add", scores, g.const(np.full(4, 10.0, np.float32), "router_bias"))
    weights, chosen = _sparsemixer_router(g, scores)
    spelling = Spelling(**{**_PLAIN.__dict__, "experts": 4, "k": 2})
    out = g.one("Add", _batched(g, spelling, "hidden", weights, chosen), "hidden")
    shape = ["tokens", HIDDEN]
    return g.model("phimoe", out, shape)


@pytest.mark.parametrize("close", [False, True], ids=["spread-scores", "close-scores"])
def test_a_sparsemixer_block_becomes_one_moe_exactly(close) -> None:
    model = phimoe_block(close)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    reasons = [m.reason for m in result.near_misses if m.pattern == "moe_sparse_mixer"]
    assert ops.count("MoE") == 1 and "Log" in ops, (ops, reasons)
    (moe,) = [n for n in fused.graph.node if n.op_type == "MoE"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in moe.attribute}
    assert attrs.get("use_sparse_mixer", 0) == 0 and attrs["k"] == 2
    feeds = {"hidden": np.random.default_rng(2).standard_normal((7, HIDDEN)).astype(np.float32)}
    run_both(model, fused, feeds=feeds, rtol=1e-4, atol=1e-5)


def test_a_classifier_picking_its_top_probability_is_no_mixture_of_experts() -> None:
    """ArgMax of a linear head and the Softmax's value there: the pattern's shape, but no
    experts after it (nothing with the hidden states' width): no MoE, and the near miss
    says what is missing."""
    g = _Graph(seed=6)
    logits = g.one("MatMul", "hidden", g.const(g.weight(HIDDEN, 4), "head"))
    choice = g.one("ArgMax", logits, axis=-1, keepdims=1)
    picked = g.one("GatherElements", g.one("Softmax", logits, axis=-1), choice, axis=-1)
    picked = g.one("Neg", picked)  # read on, as the routing weights are
    graph = helper.make_graph(
        g.nodes,
        "classifier",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["tokens", HIDDEN])],
        [helper.make_tensor_value_info(picked, TensorProto.FLOAT, ["tokens", 1])],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = optimize_quiet(model, target="onnxruntime")
    assert "MoE" not in [n.op_type for n in result.to_proto().graph.node]
    reasons = [m.reason for m in result.near_misses if m.pattern == "moe_sparse_mixer"]
    assert reasons and all("hidden states' shape" in r for r in reasons), reasons
