"""Generated spellings of a mixture-of-experts MLP: each becomes one com.microsoft.MoE,
exactly; what computes anything else stays, with a near miss that says why.

A generator (hypothesis) writes one sparse MoE block with ``onnx.helper``, drawing
independently how each part is spelled, the ways transformers' experts and the torch
exporters write them (bench/corpus: Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE, GraniteMoE):

* the router: ``x @ W_r`` as a MatMul or a Gemm (transB), then Softmax and TopK, with a
  Cast to float between them (TorchScript), the top weights renormalized or not; or
  TopK of the logits then Softmax of those (GraniteMoE);
* the experts, **batched** (transformers 5's ``batched_mm``): every token repeated k
  times (Unsqueeze + Expand or Tile, then Reshape), the chosen experts' weights gathered
  (Gather, or GatherND as dynamo writes it) from stacked [E, out, in] weights, or
  [E, in, out] multiplied from the other side; gate and up one fused weight split by
  Split or two Slices, gate first or second, or two weights; or **dense**: every
  expert's own 2-D weights on every token, weighted by the routing matrix the chosen
  weights are scattered into (ScatterElements) and summed;
* the hidden states as [tokens, hidden] or [batch, seq, hidden] reshaped; the experts,
  k, and the sizes.

Each block must come out as exactly one MoE on the onnxruntime target with no TopK left,
and compute what the original computes (onnxruntime, its optimizations off) on several
token counts: rtol = 1e-4, atol = 1e-5 (the kernel sums the experts in another order).
The example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``, 200 in
``make test-corpus``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from autofusion.fusion_core.testing import (
    GraphWriter,
    build_model,
    fuse_quiet,
    make_session,
    optimize_quiet,
    run_both,
)
from tests.fusion_core.spelling_settings import EXAMPLES, SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-4, atol=1e-5)
HIDDEN = 16


@dataclass(frozen=True)
class Spelling:
    experts: int
    k: int
    inter: int
    router: str  # "softmax_topk", "softmax_cast_topk", "topk_softmax"
    gemm_router: bool
    normalize: bool  # softmax first: the top weights divided by their sum
    layout: str  # "batched" or "dense"
    gather_nd: bool  # batched: GatherND of [ids, 1] rather than Gather
    weight_first: bool  # batched: weights [E, out, in] times a column, else [E, in, out]
    fused_gate_up: bool  # batched: one [E, 2I, H] weight, split
    split_by_slices: bool
    gate_second: bool  # the fused weight's second half is the gate
    repeat_by_tile: bool
    three_d: bool  # the block reads [batch, seq, hidden] and reshapes it


@st.composite
def spellings(draw) -> Spelling:
    experts = draw(st.integers(2, 6))
    router = draw(st.sampled_from(["softmax_topk", "softmax_cast_topk", "topk_softmax"]))
    return Spelling(
        experts=experts,
        k=draw(st.integers(1, min(3, experts))),
        inter=draw(st.sampled_from([4, 8, 12])),
        router=router,
        gemm_router=draw(st.booleans()),
        normalize=router == "topk_softmax" or draw(st.booleans()),
        layout=draw(st.sampled_from(["batched", "dense"])),
        gather_nd=draw(st.booleans()),
        weight_first=draw(st.booleans()),
        fused_gate_up=draw(st.booleans()),
        split_by_slices=draw(st.booleans()),
        gate_second=draw(st.booleans()),
        repeat_by_tile=draw(st.booleans()),
        three_d=draw(st.booleans()),
    )


_Graph = GraphWriter  # the name the MoE tests import


def kernel_routing(
    router: np.ndarray, k: int, normalize: int, *, use_sparse_mixer: int = 0
) -> np.ndarray:
    """The CPU MoE kernel's routing weights per expert ``[tokens, experts]`` for its
    input ``router``: identity experts, expert e copying the token's first feature into
    output column e + 1 (fc2 symmetric: either weight layout reads the same)."""
    tokens, experts = router.shape
    width = experts + 1
    fc1 = np.zeros((experts, width, width), np.float32)
    fc1[:, 0, 0] = 1
    fc2 = np.zeros((experts, width, width), np.float32)
    for e in range(experts):
        fc2[e, e + 1, 0] = fc2[e, 0, e + 1] = 1
    node = helper.make_node(
        "MoE", ["x", "router", "fc1", "", "fc2"], ["y"], domain="com.microsoft", k=k,
        activation_type="identity", normalize_routing_weights=normalize,
        use_sparse_mixer=use_sparse_mixer,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "routing",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, width]),
            helper.make_tensor_value_info("router", TensorProto.FLOAT, [tokens, experts]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, width])],
        [numpy_helper.from_array(fc1, "fc1"), numpy_helper.from_array(fc2, "fc2")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    x = np.zeros((tokens, width), np.float32)
    x[:, 0] = 1
    return make_session(helper.make_model(graph, opset_imports=opsets)).run(
        None, {"x": x, "router": router.astype(np.float32)}
    )[0][:, 1:]


def group_mask(
    g: _Graph, choice: str, experts: int, groups: tuple[int, int], *, score: str, fill: float
) -> str:
    """``choice`` with the experts of the groups not kept at ``fill`` (-inf, or 0 where
    the weights are the TopK's values), as dynamo writes transformers' group-limited
    routing: ``groups`` is (G, the groups kept), each scored by the sum of its top 2
    (``score="top2"``: DeepSeek-V3) or by its max (``"max"``: V2)."""
    count, kept_groups = groups
    size = experts // count
    grouped = g.one("Reshape", choice, g.ints(-1, count, size))
    if score == "max":
        scores = g.one("ReduceMax", grouped, g.ints(-1), keepdims=0)  # [T, G]
    else:
        top2 = g.op("TopK", grouped, g.ints(min(2, size)), outputs=2, axis=-1)[0]
        scores = g.one("ReduceSum", top2, g.ints(-1), keepdims=0)
    kept = g.op("TopK", scores, g.ints(kept_groups), outputs=2, axis=-1, sorted=0)[1]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    zeros = g.one("ConstantOfShape", g.one("Shape", scores), value=zero)
    ones = g.one("Expand", g.const(np.array(1.0, np.float32), "one"), g.one("Shape", kept))
    mask = g.one("ScatterElements", zeros, kept, ones, axis=1)
    spread = g.one("Expand", g.one("Unsqueeze", mask, g.ints(-1)), g.ints(1, count, size))
    flat = g.one("Reshape", spread, g.ints(-1, experts))
    dropped = g.one("Not", g.one("Cast", flat, to=TensorProto.BOOL))
    return g.one("Where", dropped, g.const(np.array(fill, np.float32), "fill"), choice)


def scaled_weights(g: _Graph, weights: str, *, normalize: bool, epsilon: bool, scale: float) -> str:
    """The routing weights as transformers' routers finish them: divided by their sum
    (TorchScript adds 1e-20 to it: ``epsilon``), then times ``routed_scaling_factor``."""
    if normalize:
        total = g.one("ReduceSum", weights, g.ints(-1), keepdims=1)
        if epsilon:
            total = g.one("Add", total, g.const(np.array(1e-20, np.float32), "eps"))
        weights = g.one("Div", weights, total)
    if scale != 1.0:
        weights = g.one("Mul", weights, g.const(np.array(scale, np.float32), "scale"))
    return weights


def _silu(g: _Graph, value: str) -> str:
    return g.one("Mul", value, g.one("Sigmoid", value))


def _router(g: _Graph, s: Spelling, x: str) -> tuple[str, str]:
    """(top weights [T, k], chosen experts [T, k])."""
    if s.gemm_router:
        logits = g.one("Gemm", x, g.const(g.weight(s.experts, HIDDEN), "router"), transB=1)
    else:
        logits = g.one("MatMul", x, g.const(g.weight(HIDDEN, s.experts), "router"))
    k = g.ints(s.k)
    if s.router == "topk_softmax":
        values, chosen = g.op("TopK", logits, k, outputs=2, axis=-1)
        return g.one("Softmax", values, axis=-1), chosen
    probs = g.one("Softmax", logits, axis=-1)
    if s.router == "softmax_cast_topk":
        probs = g.one("Cast", probs, to=TensorProto.FLOAT)
    values, chosen = g.op("TopK", probs, k, outputs=2, axis=-1)
    if s.normalize:
        values = g.one("Div", values, g.one("ReduceSum", values, g.ints(-1), keepdims=1))
    return values, chosen


def _batched(g: _Graph, s: Spelling, x: str, weights: str, chosen: str) -> str:
    ids = g.one("Reshape", chosen, g.ints(-1))
    if s.repeat_by_tile:
        tiled = g.one("Tile", g.one("Unsqueeze", x, g.ints(1)), g.ints(1, s.k, 1))
    else:
        tiled = g.one("Expand", g.one("Unsqueeze", x, g.ints(1)), g.ints(1, s.k, 1))
    rows = g.one("Reshape", tiled, g.ints(-1, HIDDEN))  # repeat_interleave(x, k)

    def gathered(array: np.ndarray) -> str:
        stacked = array if s.weight_first else np.swapaxes(array, 1, 2).copy()
        name = g.const(stacked, "experts")
        if s.gather_nd:
            return g.one("GatherND", name, g.one("Unsqueeze", ids, g.ints(-1)))
        return g.one("Gather", name, ids, axis=0)

    def linear(value: str, array: np.ndarray) -> str:  # [S, in] by the chosen [out, in]
        if s.weight_first:
            column = g.one("Unsqueeze", value, g.ints(-1))
            return g.one("Squeeze", g.one("MatMul", gathered(array), column), g.ints(-1))
        row = g.one("Unsqueeze", value, g.ints(1))
        return g.one("Squeeze", g.one("MatMul", row, gathered(array)), g.ints(1))

    gate_w = g.weight(s.experts, s.inter, HIDDEN)
    up_w = g.weight(s.experts, s.inter, HIDDEN)
    if s.fused_gate_up:
        halves = [up_w, gate_w] if s.gate_second else [gate_w, up_w]
        both = linear(rows, np.concatenate(halves, axis=1))
        if s.split_by_slices:
            first = g.one("Slice", both, g.ints(0), g.ints(s.inter), g.ints(-1))
            second = g.one("Slice", both, g.ints(s.inter), g.ints(2 * s.inter), g.ints(-1))
        else:
            first, second = g.op("Split", both, outputs=2, axis=-1, num_outputs=2)
        gate, up = (second, first) if s.gate_second else (first, second)
    else:
        gate, up = linear(rows, gate_w), linear(rows, up_w)
    down = linear(g.one("Mul", _silu(g, gate), up), g.weight(s.experts, HIDDEN, s.inter))
    weighted = g.one(
        "Mul", down, g.one("Unsqueeze", g.one("Reshape", weights, g.ints(-1)), g.ints(-1))
    )
    per_token = g.one("Reshape", weighted, g.ints(-1, s.k, HIDDEN))
    return g.one("ReduceSum", per_token, g.ints(1), keepdims=0)


def _dense(g: _Graph, s: Spelling, x: str, weights: str, chosen: str) -> str:
    tokens = g.one("Slice", g.one("Shape", x), g.ints(0), g.ints(1))
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    zeros = g.one("ConstantOfShape", g.one("Concat", tokens, g.ints(s.experts), axis=0), value=zero)
    routing = g.one("ScatterElements", zeros, chosen, weights, axis=1)  # [T, E]
    total = None
    for e in range(s.experts):
        gate = g.one("MatMul", x, g.const(g.weight(HIDDEN, s.inter), "gate"))
        up = g.one("MatMul", x, g.const(g.weight(HIDDEN, s.inter), "up"))
        out = g.one(
            "MatMul", g.one("Mul", _silu(g, gate), up), g.const(g.weight(s.inter, HIDDEN), "down")
        )
        share = g.one("Slice", routing, g.ints(e), g.ints(e + 1), g.ints(1))
        out = g.one("Mul", out, share)
        total = out if total is None else g.one("Add", total, out)
    return total


def moe_block(s: Spelling) -> onnx.ModelProto:
    g = _Graph()
    shape = ["batch", "seq", HIDDEN] if s.three_d else ["tokens", HIDDEN]
    x = "hidden"
    if s.three_d:
        x = g.one("Reshape", x, g.ints(-1, HIDDEN))
    weights, chosen = _router(g, s, x)
    build = _batched if s.layout == "batched" else _dense
    y = build(g, s, x, weights, chosen)
    if s.three_d:
        y = g.one("Reshape", y, g.one("Shape", "hidden"))
    out = g.one("Add", y, "hidden")  # the residual
    return g.model("moe", out, shape)


def token_feeds(tokens: int, seed: int = 1, *, three_d: bool = False) -> dict[str, np.ndarray]:
    """Random hidden states of ``tokens`` tokens, ``[T, HIDDEN]`` (or ``[1, T, HIDDEN]``)."""
    rng = np.random.default_rng(seed)
    shape = (1, tokens, HIDDEN) if three_d else (tokens, HIDDEN)
    return {"hidden": rng.standard_normal(shape).astype(np.float32)}


def feeds(s: Spelling, tokens: int, seed: int = 1) -> dict[str, np.ndarray]:
    return token_feeds(tokens, seed, three_d=s.three_d)


def ops_of(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def generated(examples: int = EXAMPLES) -> settings:
    """The MoE generators' hypothesis settings: the spelling tests' shared ones
    (``spelling_settings.SPELLINGS``) with ``examples`` drawn."""
    return settings(SPELLINGS, max_examples=examples)


@generated()
@given(spellings())
def test_every_spelling_becomes_one_moe_exactly(s: Spelling) -> None:
    model = moe_block(s)
    done = fuse_quiet(model)
    fused, ops = done.model, done.ops
    assert ops.count("MoE") == 1, f"{s}: {done.misses_about('moe')}"
    assert "TopK" not in ops and "Softmax" not in ops, f"{s}: {ops}"
    (moe,) = [n for n in fused.graph.node if n.op_type == "MoE"]
    attrs = {a.name: helper.get_attribute_value(a) for a in moe.attribute}
    assert attrs["k"] == s.k, s
    if s.k < s.experts:  # with every expert chosen the weights sum to 1 either way
        assert attrs["normalize_routing_weights"] == int(s.normalize), s
    for tokens in (1, 5, 17):
        run_both(model, fused, feeds=feeds(s, tokens), **TOL)


_PLAIN = Spelling(
    experts=4, k=2, inter=8, router="softmax_topk", gemm_router=False, normalize=True,
    layout="batched", gather_nd=False, weight_first=True, fused_gate_up=True,
    split_by_slices=False, gate_second=False, repeat_by_tile=False, three_d=False,
)  # fmt: skip


def _near_misses(result) -> list[str]:
    return [m.reason for m in result.near_misses if m.pattern.startswith("moe_")]


def test_tokens_repeated_whole_rather_than_each_k_times_are_not_fused() -> None:
    """Tile of the whole [T, H] k times pairs token t with another token's choice: it
    reads like the batched experts, but the proof by running it says no."""
    model = moe_block(_PLAIN)
    (unsqueeze,) = [
        n for n in model.graph.node if n.op_type == "Unsqueeze" and n.input[0] == "hidden"
    ]
    axes = [t for t in model.graph.initializer if t.name == unsqueeze.input[1]][0]
    axes.CopyFrom(numpy_helper.from_array(np.array([0], np.int64), axes.name))  # [1, T, H]
    expand = next(n for n in model.graph.node if n.op_type == "Expand")
    shape = [t for t in model.graph.initializer if t.name == expand.input[1]][0]
    shape.CopyFrom(numpy_helper.from_array(np.array([_PLAIN.k, 1, 1], np.int64), shape.name))
    result = optimize_quiet(model, target="onnxruntime")
    assert "MoE" not in ops_of(result.to_proto())
    assert any(
        "does not compute softmax, top-k and SwiGLU experts" in r for r in _near_misses(result)
    ), _near_misses(result)


def test_gelu_experts_are_a_near_miss() -> None:
    """An expert MLP with another activation is not the SwiGLU the CPU kernel runs."""
    model = moe_block(_PLAIN)
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.op_type = "Tanh"  # x * tanh(x): no silu
    result = optimize_quiet(model, target="onnxruntime")
    assert "MoE" not in ops_of(result.to_proto())
    assert any("SwiGLU" in r for r in _near_misses(result)), _near_misses(result)


def test_experts_not_found_name_the_block_end() -> None:
    """Dense experts with another activation: none of the three kinds of experts is
    found, and the near miss says at which value the block it searched ends (a block
    ending somewhere unexpected is the first thing to look at)."""
    model = moe_block(dataclasses.replace(_PLAIN, layout="dense"))
    for node in model.graph.node:
        if node.op_type == "Sigmoid":
            node.op_type = "Tanh"
    producers = {out: node.op_type for node in model.graph.node for out in node.output}
    result = optimize_quiet(model, target="onnxruntime")
    assert "MoE" not in ops_of(result.to_proto())
    reasons = _near_misses(result)
    named = [
        re.search(r"the block ending at '([^']+)' \((\w+)\) has experts neither", r)
        for r in reasons
    ]
    ends = [m.groups() for m in named if m]
    assert ends, reasons
    for value, op in ends:  # a value of the model, with the op that computes it there
        assert producers.get(value) == op, (value, op)


def test_an_expert_op_reading_one_value_twice_is_a_near_miss_not_a_crash() -> None:
    """``Mul(g, g)`` (a squared activation as TorchScript writes it) reads one value
    twice: the walk from the router to the block's output once raised KeyError there."""
    model = moe_block(_PLAIN)
    sigmoids = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Sigmoid"}
    for node in model.graph.node:
        if node.op_type == "Mul" and node.input[1] in sigmoids:
            node.input[1] = node.input[0]  # g * g instead of g * sigmoid(g)
    result = optimize_quiet(model, target="onnxruntime")
    reasons = _near_misses(result)
    assert "MoE" not in ops_of(result.to_proto())
    assert not any("rolled back as a bug" in r for r in reasons), reasons
    assert any("SwiGLU" in r for r in reasons), reasons


def test_the_router_choice_read_outside_the_block_stays() -> None:
    model = moe_block(_PLAIN)
    topk = next(n for n in model.graph.node if n.op_type == "TopK")
    model.graph.output.append(
        helper.make_tensor_value_info(topk.output[1], TensorProto.INT64, None)
    )
    result = optimize_quiet(model, target="onnxruntime")
    assert "MoE" not in ops_of(result.to_proto())
    assert any(
        "read outside the block" in r or "graph output" in r for r in _near_misses(result)
    ), _near_misses(result)


def test_generic_keeps_the_block_and_says_why() -> None:
    result = optimize_quiet(moe_block(_PLAIN), target="generic")
    assert "MoE" not in ops_of(result.to_proto())
    assert any("ONNX has no mixture-of-experts op" in r for r in _near_misses(result)), (
        _near_misses(result)
    )


@pytest.mark.parametrize("experts", [3])
def test_dense_experts_out_of_order_are_not_fused(experts) -> None:
    """The i-th SwiGLU MLP is taken for expert i; when the graph computes them in another
    order the proof fails and nothing is fused."""
    s = Spelling(**{**_PLAIN.__dict__, "layout": "dense", "experts": experts})
    model = moe_block(s)
    slices = [n for n in model.graph.node if n.op_type == "Slice"]
    first, last = slices[0], slices[-1]
    first.input[1], last.input[1] = last.input[1], first.input[1]
    first.input[2], last.input[2] = last.input[2], first.input[2]
    result = optimize_quiet(model, target="onnxruntime")
    assert "MoE" not in ops_of(result.to_proto())
    assert _near_misses(result)


ROUTER_WITHOUT_TOPK = """<ir_version: 8, opset_import: ["" : 18]>
g (float[tokens, 16] x) => (float[tokens, 1] picked, float[tokens, 4] {probs}) {{
    logits = Gemm <transB = 1> (x, router)
    top = ReduceMax <keepdims = 1> (logits, last)
    gap = Sub (top, logits)
    far = Greater (gap, threshold)
    masked = Where (far, lowest, logits)
    probs = Softmax <axis = -1> (masked)
    {read}
}}"""
ROUTER_INITS = {
    "router": np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32),
    "last": np.array([-1], np.int64),
    "threshold": np.array(0.5, np.float32),
    "lowest": np.array(np.finfo(np.float32).min, np.float32),
    "choice": np.zeros((1, 1), np.int64),
}


def test_a_router_no_pattern_binds_gets_a_near_miss() -> None:
    """PhiMoE's sparsemixer picks its experts without a TopK: the router's Softmax, read
    by a GatherElements of the chosen weight, is named with the step that found no TopK."""
    text = ROUTER_WITHOUT_TOPK.format(
        probs="unused",
        read="picked = GatherElements <axis = 1> (probs, choice)\n    unused = Neg (probs)",
    )
    result = optimize_quiet(build_model(text, ROUTER_INITS), target="onnxruntime")
    misses = [m for m in result.near_misses if m.pattern.startswith("moe_")]
    assert misses, result.near_misses
    assert any(
        "expected TopK 'topk' reading output 0 of softmax" in m.reason
        and "found an unnamed GatherElements" in m.reason
        for m in misses
    ), [m.reason for m in misses]


def test_a_classifier_softmax_gets_no_router_near_miss() -> None:
    """The same Softmax returned as the model's probabilities, nothing selecting from it:
    not a router, no mixture-of-experts near miss."""
    text = ROUTER_WITHOUT_TOPK.format(
        probs="probs", read="picked = ReduceMax <keepdims = 1> (probs, last)"
    )
    result = optimize_quiet(build_model(text, ROUTER_INITS), target="onnxruntime")
    assert not [m for m in result.near_misses if m.pattern.startswith("moe_")]
