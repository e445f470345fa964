"""Inkling's router: routed weights normalized over the chosen experts AND the shared
experts' gates becomes one com.microsoft.MoE fed the router's own weights, exactly; the
shared experts stay outside it, weighted by their gates.

InklingTopkRouter (E routed experts, S shared ones, one logit each) as TorchScript
writes it: ``l = x W_r``, the choice the top k of ``Sigmoid(l)[:, :E]`` (+ a selection
bias), ``g = Concat(GatherElements(l[:, :E], chosen), l[:, E:])``, ``a = Log(Sigmoid(g))``,
``w = Exp(a - ReduceLogSumExp(a)) * route_scale``: the first k columns weigh the routed
experts, the others the shared experts' outputs. A generator (hypothesis) draws E, k, S
(1 or 2), the selection bias (none, zeros, trained values that move the choice), the
scale and the experts' spelling; each block must become one MoE (the shared experts'
MLPs left after it) and compute what the original computes (onnxruntime, its
optimizations off) on 1, 5 and 17 tokens: rtol = 1e-4, atol = 1e-5 (the kernel sums the
experts in another order). Drawn too, as the TorchScript export writes it: the block reads
[B, S, D], the router and the experts its flattening, and each sum is shaped back to
[B, S, D] before the routed and the shared experts' are added. A negative scale
(weights the kernel's softmax cannot give) stays with a near miss.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_mixture_of_experts import _PLAIN, HIDDEN, Spelling, _batched, _Graph, generated

from autofusion.fusion_core.testing import fuse_quiet, run_both

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-4, atol=1e-5)


@dataclass(frozen=True)
class Inkling:
    shared: int  # the shared experts, each gated by a logit of the router
    bias: str  # "none", "zero" or "trained" (moves the choice)
    scale: float  # route_scale * global_scale
    # as the TorchScript export writes it: the block reads [B, S, D], the router and the
    # experts its flattening [B * S, D], and the routed and each shared expert's sum are
    # shaped back to [B, S, D] before they are added
    three_d: bool = False


@st.composite
def blocks(draw) -> tuple[Inkling, Spelling]:
    experts = draw(st.sampled_from([4, 6, 8]))
    inkling = Inkling(
        shared=draw(st.integers(1, 2)),
        bias=draw(st.sampled_from(["none", "zero", "trained"])),
        scale=draw(st.sampled_from([1.0, 2.0])),
        three_d=draw(st.booleans()),
    )
    spelling = replace(
        _PLAIN,
        experts=experts,
        k=draw(st.integers(1, min(3, experts))),
        inter=draw(st.sampled_from([4, 8])),
        weight_first=draw(st.booleans()),
        fused_gate_up=draw(st.booleans()),
        gather_nd=draw(st.booleans()),
    )
    return inkling, spelling


def _router(g: _Graph, r: Inkling, s: Spelling, x: str) -> tuple[str, str, str]:
    """(routed weights [T, k], chosen [T, k], the shared gates [T, S])."""
    classes, e = s.experts + r.shared, s.experts
    logits = g.one("MatMul", x, g.const(g.weight(HIDDEN, classes), "router"))
    zero, cut, last = g.ints(0), g.ints(e), g.ints(1)
    routed_scores = g.one("Slice", g.one("Sigmoid", logits), zero, cut, last)
    if r.bias != "none":
        bias = np.zeros(e, np.float32)
        if r.bias == "trained":
            bias = np.random.default_rng(5).uniform(-0.3, 0.3, e).astype(np.float32)
        routed_scores = g.one("Add", routed_scores, g.const(bias, "e_score_correction_bias"))
    chosen = g.op("TopK", routed_scores, g.ints(s.k), outputs=2, axis=-1)[1]
    picked = g.one("GatherElements", g.one("Slice", logits, zero, cut, last), chosen, axis=-1)
    shared_logits = g.one("Slice", logits, cut, g.ints(classes), last)
    log_s = g.one("Log", g.one("Sigmoid", g.one("Concat", picked, shared_logits, axis=-1)))
    total = g.one("ReduceLogSumExp", log_s, g.ints(-1), keepdims=1)
    w = g.one("Exp", g.one("Sub", log_s, total))
    w = g.one("Mul", w, g.const(np.array(r.scale, np.float32), "route_scale"))
    weights = g.one("Slice", w, g.ints(0), g.ints(s.k), last)
    gates = g.one("Slice", w, g.ints(s.k), g.ints(s.k + r.shared), last)
    return weights, chosen, gates


def _shared_expert(g: _Graph, s: Spelling, gate: str, x: str) -> str:
    """A SwiGLU MLP on every token, times its gate [T, 1]."""
    up = g.one("MatMul", x, g.const(g.weight(HIDDEN, s.inter), "shared_up"))
    v = g.one("MatMul", x, g.const(g.weight(HIDDEN, s.inter), "shared_gate"))
    h = g.one("Mul", g.one("Mul", g.one("Mul", v, g.one("Sigmoid", v)), up), gate)
    return g.one("MatMul", h, g.const(g.weight(s.inter, HIDDEN), "shared_down"))


def inkling_block(r: Inkling, s: Spelling, seed: int = 0):
    g = _Graph(seed)
    x = g.one("Reshape", "hidden", g.ints(-1, HIDDEN)) if r.three_d else "hidden"

    def unflattened(value: str) -> str:  # [T, D] back to [B, S, D]
        return g.one("Reshape", value, g.one("Shape", "hidden")) if r.three_d else value

    weights, chosen, gates = _router(g, r, s, x)
    y = unflattened(_batched(g, s, x, weights, chosen))
    for j in range(r.shared):
        gate = g.one("Slice", gates, g.ints(j), g.ints(j + 1), g.ints(1))
        y = g.one("Add", y, unflattened(_shared_expert(g, s, gate, x)))
    shape = ["batch", "seq", HIDDEN] if r.three_d else ["tokens", HIDDEN]
    return g.model("inkling_moe", g.one("Add", y, "hidden"), shape)


def feeds(tokens: int, seed: int = 1, *, three_d: bool = False) -> dict[str, np.ndarray]:
    """The hidden states: ``tokens`` rows, or two sequences of them (``three_d``)."""
    shape = (2, tokens, HIDDEN) if three_d else (tokens, HIDDEN)
    return {"hidden": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


_INKLING = Inkling(shared=1, bias="trained", scale=2.0)


@generated()
@example((_INKLING, _PLAIN))
@example((replace(_INKLING, three_d=True), _PLAIN))
@example((replace(_INKLING, shared=2, bias="none"), replace(_PLAIN, k=3, experts=6)))
@given(blocks())
def test_every_inkling_router_becomes_one_moe_exactly(block) -> None:
    r, s = block
    model = inkling_block(r, s)
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1, f"{r} {s}: {done.misses_about('moe')}"
    shared = done.ops[done.ops.index("MoE") :].count("MatMul")
    assert shared == r.shared, f"{r} {s}: the shared experts' MLPs: {done.ops}"
    for tokens in (1, 5, 17):
        run_both(model, done.model, feeds=feeds(tokens, three_d=r.three_d), **TOL)


def test_the_shared_gates_read_the_routers_copy() -> None:
    """The kernel is fed the router's own weights (ScatterElements(add), Log), and the
    shared expert's gate is the router copy's: one Sigmoid of the Concat, one
    ReduceLogSumExp, no second router beside it."""
    model = inkling_block(_INKLING, _PLAIN)
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1, done.misses_about("moe")
    assert done.ops.count("ReduceLogSumExp") == 1 and done.ops.count("TopK") == 1, done.ops
    assert "ScatterElements" in done.ops and "Log" in done.ops, done.ops
    assert done.misses_about("moe") == [], done.misses_about("moe")
    run_both(model, done.model, feeds=feeds(33, seed=3), **TOL)


def test_a_negative_scale_is_a_near_miss() -> None:
    """Weights times -1: the kernel weighs by a softmax, never negative; the block stays."""
    model = inkling_block(replace(_INKLING, scale=-1.0), _PLAIN)
    done = fuse_quiet(model)
    assert "MoE" not in done.ops, done.ops
    assert any("may be negative" in m for m in done.misses_about("moe")), done.misses_about("moe")
    run_both(model, done.model, feeds=feeds(9), rtol=1e-5, atol=1e-6)


def test_inkling_as_exported_shapes_its_sums_back_before_adding_them() -> None:
    """TorchScript's Inkling: the router and the experts read the hidden states
    flattened, the routed and the shared experts' sums are added as [B, S, D]: the
    routed term is the block, its kernel reads the hidden states [B, S, D] merged and
    its output is shaped back (exact on two sequences of 1, 5 and 17 tokens)."""
    r = replace(_INKLING, three_d=True)
    model = inkling_block(r, _PLAIN)
    done = fuse_quiet(model)
    assert done.ops.count("MoE") == 1, done.misses_about("moe")
    after = done.ops[done.ops.index("MoE") :]
    assert after.count("MatMul") == r.shared and "Reshape" in after, done.ops
    for tokens in (1, 5, 17):
        run_both(model, done.model, feeds=feeds(tokens, seed=3, three_d=True), **TOL)
