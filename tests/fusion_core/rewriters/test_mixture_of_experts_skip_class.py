"""ZAYA's router: logits [B, S, E (+1)] computed before the flattening the experts read,
and a skip class, each becomes one com.microsoft.MoE, exactly.

A generator (hypothesis) writes the block as ZayaRouter and the batched or dense experts
of ``test_mixture_of_experts.py`` write it, drawing independently: the router on the
unflattened ``[B, S, D]`` hidden states (its logits 3-D, the batch symbolic or 1) or on
the flattened ``[T, D]``; E and k; a skip class or not (one more class: its weight set to
0 by ``Where(chosen == E, 0, w)`` and its index sent to expert 0); a balancing bias added
to the probabilities before the TopK (none, zeros, or trained values, the skip's high
enough that tokens pick it); the weights gathered from the probabilities or the TopK's
values; and what the real exports write: the router's own features before its logits
(ZayaRouter's down_proj to a narrower width, a norm, a linear and a GELU: the experts
read another tensor than the router), its axes written as 2 (dynamo, over [B, S, E]),
the Shape the output is shaped back with read again after the block. Each block must
become exactly one MoE with no expert MatMul left after it and
compute what the original computes (onnxruntime, its optimizations off) on 1, 5 and 17
tokens (two sequences where the batch is symbolic): rtol = 1e-4, atol = 1e-5 (the kernel
sums the experts in another order). A router step over another axis than the experts'
(which does not commute with merging the leading axes), a skip weight that may be
negative and dense experts whose routing matrix the skip's weight overwrites (a scatter
without a reduction: not the sum the kernel computes) stay, with a near miss. The
example budget is ``AUTOFUSION_SPELLING_EXAMPLES``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from onnx import TensorProto
from test_mixture_of_experts import _PLAIN, HIDDEN, Spelling, _batched, _dense, _Graph, generated

from autofusion.fusion_core.testing import fuse_quiet, run_both

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-4, atol=1e-5)
ROUTER_WIDTH = 8  # ZAYA's router_hidden_size: narrower than the hidden states


@dataclass(frozen=True)
class Zaya:
    three_d: bool  # the router reads [B, S, D]: its logits are [B, S, E (+1)]
    batch: str  # three_d: the batch axis, "batch" (symbolic) or "1"
    skip: bool  # one more class, the skip expert
    bias: str  # "none", "zero" or "trained" (the skip's: picked by some tokens)
    weights: str  # "gathered" from the probabilities, or the TopK's "values"
    softmax_axis: int = -1  # a router step over another axis: no MoE (a near miss)
    skip_fill: float = 0.0  # the skip's weight after the Where
    # as the real exports write it: the router's own features (a down_proj to
    # ROUTER_WIDTH, an RMS norm, a linear and an erf GELU) before its logits, so the
    # experts read another tensor than the router's logits do; the router's axes
    # written as 2 (dynamo) where its logits are [B, S, E]; the Shape of the hidden
    # states the output is shaped back with read again after the block
    features: bool = False
    positive_axis: bool = False
    shape_outside: bool = False


@st.composite
def blocks(draw) -> tuple[Zaya, Spelling]:
    experts = draw(st.sampled_from([4, 6, 8]))
    values = draw(st.booleans())
    zaya = Zaya(
        three_d=draw(st.booleans()),
        batch=draw(st.sampled_from(["batch", "1"])),
        skip=draw(st.booleans()),
        bias="none" if values else draw(st.sampled_from(["none", "zero", "trained"])),
        weights="values" if values else "gathered",
        features=draw(st.booleans()),
        positive_axis=draw(st.booleans()),
        shape_outside=draw(st.booleans()),
    )
    k = draw(st.integers(1, min(3, experts)))
    # dense experts weigh a routing matrix scattered without a reduction: the skip sent
    # to expert 0 overwrites expert 0's weight (test_a_scatter_that_overwrites_...)
    dense = ["dense"] if k == 1 or not zaya.skip else []
    spelling = replace(
        _PLAIN,
        experts=experts,
        k=k,
        inter=draw(st.sampled_from([4, 8])),
        layout=draw(st.sampled_from(["batched", *dense])),
        weight_first=draw(st.booleans()),
        fused_gate_up=draw(st.booleans()),
    )
    return zaya, spelling


def _features(g: _Graph, source: str) -> str:
    """ZayaRouter's down_proj and ZayaRouterMLP's norm and first linear with its GELU
    (erf), as TorchScript writes them: [.., ROUTER_WIDTH]."""

    def linear(x: str, rows: int, hint: str) -> str:
        product = g.one("MatMul", x, g.const(g.weight(rows, ROUTER_WIDTH), hint))
        return g.one("Add", g.const(g.weight(ROUTER_WIDTH) * 0.1, f"{hint}_bias"), product)

    r = linear(source, HIDDEN, "down_proj")
    square = g.one("Pow", r, g.const(np.array(2.0, np.float32), "two"))
    mean = g.one("ReduceMean", square, g.ints(-1), keepdims=1)
    eps = g.const(np.array(1e-6, np.float32), "eps")
    r = g.one("Mul", r, g.one("Reciprocal", g.one("Sqrt", g.one("Add", mean, eps))))
    h = linear(r, ROUTER_WIDTH, "fc1")
    erf = g.one("Erf", g.one("Div", h, g.const(np.array(np.sqrt(2), np.float32), "root2")))
    half = g.one("Mul", h, g.const(np.array(0.5, np.float32), "half"))
    return g.one("Mul", half, g.one("Add", erf, g.const(np.array(1.0, np.float32), "one")))


def _router(g: _Graph, z: Zaya, s: Spelling, source: str) -> tuple[str, str]:
    """(weights [T, k], chosen [T, k]) as ZayaRouter computes them from ``source``."""
    classes = s.experts + int(z.skip)
    width = ROUTER_WIDTH if z.features else HIDDEN
    source = _features(g, source) if z.features else source
    logits = g.one("MatMul", source, g.const(g.weight(width, classes), "router"))
    last = 2 if z.positive_axis and z.three_d else -1
    probs = g.one("Softmax", logits, axis=last if z.softmax_axis == -1 else z.softmax_axis)
    choice = probs
    if z.bias != "none":
        bias = np.zeros(classes, np.float32)
        if z.bias == "trained":
            bias = np.random.default_rng(3).uniform(-0.2, 0.2, classes).astype(np.float32)
            bias[-1] = 0.3 if z.skip else bias[-1]  # the skip is picked by some tokens
        choice = g.one("Add", probs, g.const(bias, "balancing_biases"))
    top, chosen = g.op("TopK", choice, g.ints(s.k), outputs=2, axis=last)
    weights = top if z.weights == "values" else g.one("GatherElements", probs, chosen, axis=last)
    if z.skip:
        is_skip = g.one("Equal", chosen, g.const(np.array(s.experts, np.int64), "skip_id"))
        fill = g.const(np.array(z.skip_fill, np.float32), "skip_weight")
        weights = g.one("Where", is_skip, fill, weights)
        chosen = g.one("Where", is_skip, g.const(np.array(0, np.int64), "expert_0"), chosen)
    flat = g.ints(-1, s.k)
    return g.one("Reshape", weights, flat), g.one("Reshape", chosen, flat)


def zaya_block(z: Zaya, s: Spelling, seed: int = 0):
    g = _Graph(seed)
    flat = g.one("Reshape", "hidden", g.ints(-1, HIDDEN))
    weights, chosen = _router(g, z, s, "hidden" if z.three_d else flat)
    build = _batched if s.layout == "batched" else _dense
    dims = g.one("Shape", "hidden")
    if z.shape_outside:  # TorchScript's [B, S, D]: each size gathered from the Shape
        sizes = [g.one("Gather", dims, g.const(np.array(i, np.int64), "axis")) for i in (0, 1)]
        axes = [g.one("Unsqueeze", size, g.ints(0)) for size in sizes]
        dims = g.one("Concat", *axes, g.ints(HIDDEN), axis=0)
    out = g.one("Add", g.one("Reshape", build(g, s, flat, weights, chosen), dims), "hidden")
    if z.shape_outside:  # what follows the block reads the sequence's length too
        out = g.one("Div", out, g.one("Cast", sizes[1], to=TensorProto.FLOAT))
    batch = 1 if z.batch == "1" else "batch"
    return g.model("zaya_moe", out, [batch, "seq", HIDDEN])


def feeds(z: Zaya, tokens: int, seed: int = 1) -> dict[str, np.ndarray]:
    batch = 1 if z.batch == "1" else 2
    shape = (batch, tokens, HIDDEN)
    return {"hidden": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


_ZAYA = Zaya(three_d=True, batch="batch", skip=True, bias="trained", weights="gathered")


# as the real graphs have it (ZAYA's TorchScript export, then dynamo's): top 1, the
# router's MLP on its own features, the output shaped back by a Shape read again after
_EXPORTED = replace(_ZAYA, features=True, shape_outside=True)
_DYNAMO = replace(_EXPORTED, positive_axis=True)
# the router's features as wide as there are experts (ROUTER_WIDTH of them) and dense
# experts: the routing matrix [T, E] is shaped like the features, and is no block's end
_AS_WIDE = (
    Zaya(three_d=False, batch="batch", skip=False, bias="none", weights="values", features=True),
    replace(_PLAIN, experts=ROUTER_WIDTH, k=1, inter=4, layout="dense", weight_first=False,
            fused_gate_up=False),
)  # fmt: skip


@generated()
@example((_ZAYA, _PLAIN))
@example((_EXPORTED, replace(_PLAIN, k=1)))
@example((_DYNAMO, replace(_PLAIN, k=1)))
@example((replace(_ZAYA, skip=False, bias="none", weights="values"), _PLAIN))
@example(_AS_WIDE)
@given(blocks())
def test_every_zaya_router_becomes_one_moe_exactly(block) -> None:
    z, s = block
    model = zaya_block(z, s)
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1, f"{z} {s}: {done.misses_about('moe')}"
    after = done.ops[done.ops.index("MoE") :]
    assert "MatMul" not in after, f"{z} {s}: the experts stay: {done.ops}"
    for tokens in (1, 5, 17):
        run_both(model, done.model, feeds=feeds(z, tokens), **TOL)


def test_the_kernel_routes_3d_logits_itself_merged() -> None:
    """Softmax then TopK of [B, S, E] logits, no skip, no bias: the kernel's own routing
    (no ScatterElements), fed the logits merged to [B * S, E] by a Reshape."""
    z = replace(_ZAYA, skip=False, bias="none", weights="values")
    model = zaya_block(z, _PLAIN)
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1 and "ScatterElements" not in done.ops, done.ops
    (moe,) = [n for n in done.model.graph.node if n.op_type == "MoE"]
    reshape = next(n for n in done.model.graph.node if n.output[0] == moe.input[1])
    assert reshape.op_type == "Reshape", reshape
    run_both(model, done.model, feeds=feeds(z, 9), **TOL)


def test_a_skip_class_is_picked_and_computes_nothing() -> None:
    """The trained bias makes tokens pick the skip class: the fused block gives what the
    original gives there (its weight 0, its index expert 0's), and the skip matters (a
    model whose skip weight is left in place computes something else)."""
    model = zaya_block(_ZAYA, _PLAIN)
    done = fuse_quiet(model)
    x = feeds(_ZAYA, 33, seed=4)
    run_both(model, done.model, feeds=x, **TOL)
    unzeroed = zaya_block(replace(_ZAYA, skip_fill=0.5), _PLAIN)
    from autofusion.fusion_core.testing import make_session

    (zeroed,) = make_session(model).run(None, x)
    (other,) = make_session(unzeroed).run(None, x)
    assert not np.allclose(zeroed, other, **TOL), "no token picked the skip class"


def test_a_skip_weight_left_in_place_is_computed_as_written() -> None:
    """The skip's index sent to expert 0 with a weight of its own (not zeroed): the
    router's own choice and weights are fed to the kernel, so expert 0 is weighted as
    the graph weighs it, exactly."""
    z = replace(_ZAYA, skip_fill=0.5)
    model = zaya_block(z, _PLAIN)
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1, done.misses_about("moe")
    run_both(model, done.model, feeds=feeds(z, 33, seed=4), **TOL)


def test_a_negative_skip_weight_is_a_near_miss() -> None:
    """A skip weight set to -1: the kernel weighs by a softmax, never negative."""
    z = replace(_ZAYA, skip_fill=-1.0)
    model = zaya_block(z, _PLAIN)
    done = fuse_quiet(model)
    assert "MoE" not in done.ops
    assert any("may be negative" in m for m in done.misses_about("moe")), done.misses_about("moe")
    run_both(model, done.model, feeds=feeds(z, 9), rtol=1e-5, atol=1e-6)


def test_a_softmax_over_the_sequence_is_not_merged() -> None:
    """Softmax over axis 1 of [B, S, E] logits (the sequence, not the experts) does not
    commute with merging B and S: run on the logits as the block reads them, the merged
    router gives other values, and the block stays with a near miss."""
    z = replace(_ZAYA, skip=False, softmax_axis=1)
    model = zaya_block(z, _PLAIN)
    done = fuse_quiet(model)
    assert "MoE" not in done.ops, done.ops
    assert done.misses_about("moe"), done.result.near_misses
    run_both(model, done.model, feeds=feeds(z, 9), rtol=1e-5, atol=1e-6)


def test_a_scatter_that_overwrites_expert_0s_weight_is_a_near_miss() -> None:
    """Dense experts weighted by ScatterElements (no reduction) of the choice: a token
    that picks the skip and expert 0 writes expert 0's weight and then the skip's 0 there
    (or the other way round). That is no sum of weighted experts; the proof's logits
    pick both in both orders and the block stays."""
    s = replace(_PLAIN, layout="dense")
    model = zaya_block(replace(_ZAYA, bias="zero"), s)
    done = fuse_quiet(model)
    assert "MoE" not in done.ops, done.ops
    assert any("does not compute" in m for m in done.misses_about("moe")), done.misses_about("moe")


@pytest.mark.parametrize("zaya", [_EXPORTED, _DYNAMO], ids=["torchscript", "dynamo"])
def test_zaya_as_exported_becomes_one_moe_beside_its_router_mlp(zaya: Zaya) -> None:
    """The router reads its own features (a down_proj to a narrower width, a norm, an
    MLP), the experts the hidden states: the hidden states are the router's linear's
    input with the output's width; the router's MLP stays and feeds the MoE its logits
    (its three linears before it), the Shape read again after the block stays."""
    model = zaya_block(zaya, replace(_PLAIN, k=1))
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1, done.misses_about("moe")
    assert done.ops[: done.ops.index("MoE")].count("MatMul") == 3, done.ops
    assert "Shape" in done.ops[done.ops.index("MoE") :], done.ops
    run_both(model, done.model, feeds=feeds(zaya, 33, seed=4), **TOL)
