"""JetMoE's layer: a mixture of attention heads, then a mixture of MLP experts, both
dispatched by sorting tokens (transformers' ``JetMoeParallelExperts``).

Both halves share the router (``JetMoeTopKGating``): ``logits = x @ W_r``, the top k of
the logits and the softmax of those; the (token, choice) slots sorted by expert, the
tokens read in that order (``order // k``), cut into one slab per expert by each
expert's count. The MLP: a fused gate/up linear per slab (gate first), SwiGLU, a down
linear per slab, the results times their gates added into their tokens (``index_add``,
ScatterND with reduction add), plus the block's bias. The mixture of attention heads
(MoA): a query linear per slab, the queries added back into their slots (each token's k
queries kept apart, as k groups of heads), an attention over the tokens (keys and values
of the token's own linear, repeated for the k groups, an additive mask), each slot's
output read in sorted order again, an output linear per slab, weighted and added into
its token.

A generator (hypothesis, ``onnx.helper``) draws the experts, k, the head count and size
and the MLP's width. With the rewriter's ``sorted_dispatch`` on, the layer must come out
with exactly one MoE (the MLP's) computing what the original computes on several token
counts (rtol = 1e-4, atol = 1e-5: the kernel sums the experts in another order), and
the MoA must stay with a near miss that says why no MoE computes it: the attention
between its projections mixes the tokens' rows, where the kernel applies an elementwise
activation to each row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from test_mixture_of_experts import generated, ops_of
from test_mixture_of_experts_sorted import fuse_sorted

from autofusion.fusion_core.testing import GraphWriter, optimize_quiet, run_both

TOL = dict(rtol=1e-4, atol=1e-5)
WIDTH = 16  # the hidden states'


@dataclass(frozen=True)
class Jet:
    experts: int
    k: int
    heads: int  # per slot (JetMoE's key/value heads; the queries have k times as many)
    head_size: int
    inter: int  # the MLP experts' width


@st.composite
def jets(draw) -> Jet:
    experts = draw(st.integers(2, 5))
    return Jet(
        experts=experts,
        k=draw(st.integers(1, min(3, experts))),
        heads=draw(st.sampled_from([1, 2])),
        head_size=draw(st.sampled_from([2, 4])),
        inter=draw(st.sampled_from([4, 8])),
    )


@dataclass
class _Slots:
    """The router's sorted slots: each slot's token, its gate, their sort and counts."""

    order: str  # the slots sorted by expert: flat indices t * k + j
    token: str  # order // k
    gates: str  # the softmax of the top logits, in sorted order
    counts: str  # the slots each expert got, [E] int64


def _route(g: _Writer, s: Jet, x: str) -> _Slots:
    logits = g.one("MatMul", x, g.const(g.weight(WIDTH, s.experts), "router"))
    values, chosen = g.op("TopK", logits, g.ints(s.k), outputs=2, axis=-1)
    gates = g.one("Softmax", values, axis=-1)
    flat = g.one("Reshape", chosen, g.ints(-1))
    order = g.op("TopK", flat, g.one("Shape", flat), outputs=2, axis=0, largest=0)[1]
    token = g.one("Div", order, g.const(np.array(s.k, np.int64), "k"))
    sorted_gates = g.one("Gather", g.one("Reshape", gates, g.ints(-1)), order, axis=0)
    tokens = g.one("Slice", g.one("Shape", chosen), g.ints(0), g.ints(1))
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    zeros = g.one("ConstantOfShape", g.one("Concat", tokens, g.ints(s.experts), axis=0), value=zero)
    ones = g.one("Expand", g.const(np.array(1.0, np.float32), "one"), g.one("Shape", chosen))
    one_hot = g.one("ScatterElements", zeros, chosen, ones, axis=1)
    counts = g.one("Cast", g.one("ReduceSum", one_hot, g.ints(0), keepdims=0), to=7)
    return _Slots(order, token, sorted_gates, counts)


class _Writer(GraphWriter):
    """A GraphWriter that also keeps the slabs' shapes: their rows a symbol each, as
    dynamo writes them (one unbacked size per expert's count). Unannotated, onnxruntime's
    symbolic inference would take a Split by computed sizes for an even one."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[onnx.ValueInfoProto] = []


def _slabs(g: _Writer, s: Jet, rows: str, counts: str, weights: np.ndarray) -> str:
    """Each expert's slab of ``rows`` times its row of the stacked [E, out, in] weight."""
    stacked = g.const(weights, "experts")
    products = []
    slabs = g.op("Split", rows, counts, outputs=s.experts, axis=0)
    width = weights.shape[-1]
    g.shapes += [
        helper.make_tensor_value_info(v, TensorProto.FLOAT, [f"{v}_rows", width]) for v in slabs
    ]
    for e, slab in enumerate(slabs):
        own = g.one("Gather", stacked, g.const(np.array(e, np.int64), "e"), axis=0)
        products.append(g.one("Gemm", slab, own, transB=1))
    return g.one("Concat", *products, axis=0)


def _add_into(g: _Writer, rows: str, where: str, like: str) -> str:
    """``zeros(like).index_add(0, where, rows)``."""
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    zeros = g.one("ConstantOfShape", g.one("Shape", like), value=zero)
    index = g.one("Unsqueeze", where, g.ints(-1))
    return g.one("ScatterND", zeros, index, rows, reduction="add")


def _heads(g: _Writer, value: str, heads: int, head_size: int) -> str:
    """[T, heads * head_size] as [heads, T, head_size]."""
    split = g.one("Reshape", value, g.ints(-1, heads, head_size))
    return g.one("Transpose", split, perm=[1, 0, 2])


def _attention(g: _Writer, s: Jet, x: str, queries: str) -> str:
    """Each token's k query groups over the keys and values of the tokens, [T * k, H]."""
    size = s.heads * s.head_size
    q = _heads(g, g.one("Reshape", queries, g.ints(-1, s.k * size)), s.k * s.heads, s.head_size)
    key, value = (
        g.one("MatMul", x, g.const(g.weight(WIDTH, size), hint)) for hint in ("key", "value")
    )
    # the key and value heads repeated in block order for the k query groups (JetMoE's)
    key, value = (
        g.one("Tile", _heads(g, v, s.heads, s.head_size), g.ints(s.k, 1, 1)) for v in (key, value)
    )
    scores = g.one("MatMul", q, g.one("Transpose", key, perm=[0, 2, 1]))
    scaled = g.one("Mul", scores, g.const(np.array(s.head_size**-0.5, np.float32), "scale"))
    probs = g.one("Softmax", g.one("Add", scaled, "attention_mask"), axis=-1)
    context = g.one("Transpose", g.one("MatMul", probs, value), perm=[1, 0, 2])
    return g.one("Reshape", context, g.ints(-1, size))


def _masked(g: _Writer, s: Jet, x: str, queries: str) -> str:
    """No attention: each slot's query scaled by the mask's largest entry, an
    elementwise step that still reads a value other than the tokens' rows."""
    return g.one("Mul", queries, g.one("ReduceMax", "attention_mask", keepdims=0))


def _moa(g: _Writer, s: Jet, x: str, between=_attention) -> str:
    """JetMoE's mixture of attention heads: map, attention, reduce, plus its bias."""
    slots, size = _route(g, s, x), s.heads * s.head_size
    rows = g.one("Gather", x, slots.token, axis=0)
    queries = _slabs(g, s, rows, slots.counts, g.weight(s.experts, size, WIDTH))
    context = between(g, s, x, _add_into(g, queries, slots.order, queries))
    again = g.one("Gather", context, slots.order, axis=0)
    out = _slabs(g, s, again, slots.counts, g.weight(s.experts, WIDTH, size))
    weighted = g.one("Mul", out, g.one("Unsqueeze", slots.gates, g.ints(-1)))
    summed = _add_into(g, weighted, slots.token, x)
    return g.one("Add", summed, g.const(g.weight(WIDTH), "bias"))


def _mlp(g: _Writer, s: Jet, x: str) -> str:
    """JetMoE's MLP experts: a fused gate/up (gate first), SwiGLU, down, plus its bias."""
    slots = _route(g, s, x)
    rows = g.one("Gather", x, slots.token, axis=0)
    both = _slabs(g, s, rows, slots.counts, g.weight(s.experts, 2 * s.inter, WIDTH))
    gate, up = g.op("Split", both, outputs=2, axis=-1, num_outputs=2)
    act = g.one("Mul", g.one("Mul", gate, g.one("Sigmoid", gate)), up)
    out = _slabs(g, s, act, slots.counts, g.weight(s.experts, WIDTH, s.inter))
    weighted = g.one("Mul", out, g.one("Unsqueeze", slots.gates, g.ints(-1)))
    summed = _add_into(g, weighted, slots.token, x)
    return g.one("Add", summed, g.const(g.weight(WIDTH), "bias"))


def jetmoe_layer(s: Jet, *, mlp: bool = True, between=_attention) -> onnx.ModelProto:
    """``h = x + MoA(x)``, then ``h + MLP(h)`` (``mlp``) over ``hidden`` [T, WIDTH] and
    the additive ``attention_mask`` [T, T]."""
    g = _Writer()
    h = g.one("Add", "hidden", _moa(g, s, "hidden", between))
    out = g.one("Add", h, _mlp(g, s, h)) if mlp else h
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        g.nodes,
        "jetmoe_layer",
        [
            helper.make_tensor_value_info("hidden", f32, ["tokens", WIDTH]),
            helper.make_tensor_value_info("attention_mask", f32, ["tokens", "tokens"]),
        ],
        [helper.make_tensor_value_info(out, f32, ["tokens", WIDTH])],
        g.inits,
        value_info=g.shapes,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def layer_feeds(tokens: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Random tokens and a causal mask (-1e9 above the diagonal)."""
    rng = np.random.default_rng(seed)
    mask = np.triu(np.full((tokens, tokens), -1e9, np.float32), 1)
    return {
        "hidden": rng.standard_normal((tokens, WIDTH)).astype(np.float32),
        "attention_mask": mask,
    }


def _reasons(result) -> list[str]:
    return [m.reason for m in result.near_misses if m.pattern.startswith("moe_")]


def _says_why_no_moe(reason: str) -> bool:
    """The MoA's near miss: what lies between its projections, and why that is no MoE."""
    return (
        "experts around an attention" in reason
        and "reading 'attention_mask'" in reason
        and "mixes the rows of different tokens" in reason
        and "elementwise activation" in reason
    )


@generated()
@given(jets())
def test_jetmoe_layer_fuses_its_mlp_experts_exactly_and_says_why_not_its_moa(s: Jet) -> None:
    model = jetmoe_layer(s)
    result = fuse_sorted(model)
    fused = result.to_proto()
    ops = ops_of(fused)
    assert ops.count("MoE") == 1, f"{s}: {_reasons(result)}"
    (moe,) = [n for n in fused.graph.node if n.op_type == "MoE"]
    attrs = {a.name: helper.get_attribute_value(a) for a in moe.attribute}
    assert attrs["k"] == s.k and attrs["activation_type"] == b"swiglu", (s, attrs)
    assert ops.count("Split") == 2, f"{s}: the MoA's two Splits stay, the MLP's go: {ops}"
    assert any(_says_why_no_moe(r) for r in _reasons(result)), _reasons(result)
    for tokens in (1, 4, 9):
        run_both(model, fused, feeds=layer_feeds(tokens), **TOL)


def test_the_builtin_patterns_keep_the_moa_and_say_why() -> None:
    """Without sorted_dispatch too (the default): the MoA's near miss is the same."""
    s = Jet(experts=4, k=2, heads=2, head_size=4, inter=8)
    result = optimize_quiet(jetmoe_layer(s, mlp=False), target="onnxruntime")
    assert "MoE" not in ops_of(result.to_proto())
    assert any(_says_why_no_moe(r) for r in _reasons(result)), _reasons(result)


def test_experts_around_an_elementwise_step_reading_more_say_so() -> None:
    """Between the projections an elementwise step that reads the mask, no attention:
    the near miss says what it reads, not that it mixes tokens."""
    s = Jet(experts=3, k=2, heads=1, head_size=4, inter=8)
    result = fuse_sorted(jetmoe_layer(s, mlp=False, between=_masked))
    assert "MoE" not in ops_of(result.to_proto())
    reasons = _reasons(result)
    assert any(
        "experts around another computation" in r
        and "reading 'attention_mask'" in r
        and "reads values other than the tokens' rows" in r
        and "mixes the rows" not in r
        for r in reasons
    ), reasons
