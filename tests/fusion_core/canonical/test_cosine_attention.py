"""Generated cosine attention blocks, Swin-V2's (canonical rules ``cosine_heads``,
``head_scale`` and ``window_mask``).

A generator (hypothesis) writes one block, drawing:

* the heads and the head size;
* the L2 norm of the query and key heads after their Transpose: ``ReduceL2``,
  ``Sqrt(ReduceSum(x * x))``, ``Pow(ReduceSum(Pow(x, 2)), 0.5)`` or
  ``Sqrt(ReduceSumSquare(x))``; clamped by ``Clip(n, eps)``, ``Max(n, eps)`` or
  ``Max(eps, n)``; expanded to ``Shape(x)`` (TorchScript's ``expand_as``) or not; the
  quotient ``Div(x, n)`` or ``Mul(x, Reciprocal(n))``;
* the scale per head of the scores: a constant ``[N, 1, 1]`` or ``[1, N, 1, 1]``, or
  ``Exp(Min(logit_scale, log 100))`` of a constant (Swin-V2's learned logit scale);
* no bias, a position bias ``[1, N, S, S]``, or a mask per window added on the 5-D view
  ``[B / W, W, N, S, S]`` of the scores and viewed back (Swin-V2's shifted windows).

Every block must come out as exactly one attention op with no Softmax left, and compute
what the original computes (onnxruntime, its optimizations off): rtol = atol = 1e-5 (the
scale multiplies the query instead of the scores, and the fused kernel sums in another
order; outputs differ by about 1e-6). A scale computed from the query is no constant per
head: nothing fuses, a near miss names the scale, and the values are the original's bit
for bit (the norm moved across the Transpose is exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import canonical_twice, fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, SEQ, WINDOWS = 16, 6, 2
ATTENTION = ("MultiHeadAttention", "GroupQueryAttention", "Attention")
NORMS = ("l2", "sum_mul", "sum_pow", "sum_square")
CLAMPS = ("clip", "max", "max_first", "none")
SCALES = ("heads", "heads_4d", "exp_min", "query")  # "query": computed from q, no constant
BIASES = ("none", "position", "window")


@dataclass(frozen=True)
class Block:
    heads: int
    size: int
    norm: str
    clamp: str
    expand: bool  # the clamped norm expanded to Shape(x)
    reciprocal: bool  # Mul(x, Reciprocal(n)), not Div(x, n)
    scale: str
    bias: str
    eps: float = 1e-12


@st.composite
def blocks(draw) -> Block:
    return Block(
        heads=draw(st.sampled_from([2, 4])),
        size=draw(st.sampled_from([4, 8, 16])),
        norm=draw(st.sampled_from(NORMS)),
        clamp=draw(st.sampled_from(CLAMPS)),
        expand=draw(st.booleans()),
        reciprocal=draw(st.booleans()),
        scale=draw(st.sampled_from(SCALES[:3])),
        bias=draw(st.sampled_from(BIASES)),
        eps=draw(st.sampled_from([1e-12, 1e-6])),
    )


def _normalized(name: str, x: str, s: Block) -> list[str]:
    """``{name}``: ``x`` [B, N, S, H] over its rows' clamped L2 norm, as drawn."""
    square = {
        "sum_mul": [f"{name}_sq = Mul ({x}, {x})"],
        "sum_pow": [f"{name}_sq = Pow ({x}, two)"],
    }.get(s.norm, [])
    norm = {
        "l2": [f"{name}_n = ReduceL2 <keepdims = 1> ({x}, axis_last)"],
        "sum_mul": [
            f"{name}_ss = ReduceSum <keepdims = 1> ({name}_sq, axis_last)",
            f"{name}_n = Sqrt ({name}_ss)",
        ],
        "sum_pow": [
            f"{name}_ss = ReduceSum <keepdims = 1> ({name}_sq, axis_last)",
            f"{name}_n = Pow ({name}_ss, half)",
        ],
        "sum_square": [
            f"{name}_ss = ReduceSumSquare <keepdims = 1> ({x}, axis_last)",
            f"{name}_n = Sqrt ({name}_ss)",
        ],
    }[s.norm]
    clamp = {
        "clip": f"{name}_c = Clip ({name}_n, eps)",
        "max": f"{name}_c = Max ({name}_n, eps)",
        "max_first": f"{name}_c = Max (eps, {name}_n)",
        "none": f"{name}_c = Identity ({name}_n)",
    }[s.clamp]
    lines = [*square, *norm, clamp]
    divisor = f"{name}_c"
    if s.expand:
        lines += [f"{name}_shape = Shape ({x})", f"{name}_e = Expand ({divisor}, {name}_shape)"]
        divisor = f"{name}_e"
    if s.reciprocal:
        return [*lines, f"{name}_r = Reciprocal ({divisor})", f"{name} = Mul ({x}, {name}_r)"]
    return [*lines, f"{name} = Div ({x}, {divisor})"]


def _scaled(s: Block) -> list[str]:
    """``scaled`` = the scores ``qk`` times the drawn scale of each head."""
    if s.scale == "exp_min":
        return ["clamped = Min (logit_scale, log_100)", "ls = Exp (clamped)"]
    if s.scale == "query":  # one number per head and image, computed from the query
        return ["qmax = ReduceMax <keepdims = 1> (qn, axes_23)", "ls = Exp (qmax)"]
    return ["ls = Identity (scale_4d)" if s.scale == "heads_4d" else "ls = Identity (scale)"]


def _biased(s: Block) -> list[str]:
    """``biased`` = ``scaled`` with the drawn bias."""
    if s.bias == "none":
        return ["biased = Identity (scaled)"]
    if s.bias == "position":
        return ["biased = Add (scaled, position)"]
    if s.bias == "head_halves":  # a view that splits the heads, not the batch
        return [
            "view = Reshape (scaled, halves_view)",
            "masked = Add (view, halves_mask)",
            "biased = Reshape (masked, scores_view)",
        ]
    return [  # Swin-V2's mask per window, on the scores viewed [B / W, W, N, S, S]
        "wm_1 = Unsqueeze (window_mask, axis_1)",
        "wm = Unsqueeze (wm_1, axis_0)",
        "view = Reshape (scaled, windows_view)",
        "masked = Add (view, wm)",
        "biased = Reshape (masked, scores_view)",
    ]


def block_model(s: Block, seed: int = 0) -> onnx.ModelProto:
    body = [
        "qm = MatMul (x, wq)",
        "qr = Reshape (qm, split)",
        "qt = Transpose <perm = [0, 2, 1, 3]> (qr)",
        *_normalized("qn", "qt", s),
        "km = MatMul (x, wk)",
        "kr = Reshape (km, split)",
        "kt = Transpose <perm = [0, 2, 1, 3]> (kr)",
        *_normalized("kn", "kt", s),
        "kT = Transpose <perm = [0, 1, 3, 2]> (kn)",
        "qk = MatMul (qn, kT)",
        *_scaled(s),
        "scaled = Mul (qk, ls)",
        *_biased(s),
        "probs = Softmax <axis = -1> (biased)",
        "vm = MatMul (x, wv)",
        "vr = Reshape (vm, split)",
        "vt = Transpose <perm = [0, 2, 1, 3]> (vr)",
        "context = MatMul (probs, vt)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    return graph_model(
        [f"float[B, {SEQ}, {HIDDEN}] x"],
        [f"float[B, {SEQ}, {HIDDEN}] y"],
        body,
        _inits(s, np.random.default_rng(seed)),
    )


def _inits(s: Block, rng: np.random.Generator) -> dict:
    n, h = s.heads, s.size
    f32 = np.float32
    logit = rng.uniform(np.log(2.0), np.log(200.0), (n, 1, 1)).astype(f32)  # some clamped
    mask = np.where(rng.random((WINDOWS, SEQ, SEQ)) < 0.3, -100.0, 0.0).astype(f32)
    return {
        "wq": rng.standard_normal((HIDDEN, n * h)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, n * h)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, n * h)) * 0.3,
        "wo": rng.standard_normal((n * h, HIDDEN)) * 0.3,
        "split": np.array([0, 0, n, h], np.int64),
        "merge": np.array([0, 0, n * h], np.int64),
        "axis_last": np.array([-1], np.int64),
        "axis_0": np.array([0], np.int64),
        "axis_1": np.array([1], np.int64),
        "axes_23": np.array([2, 3], np.int64),
        "two": np.array(2.0, f32),
        "half": np.array(0.5, f32),
        "eps": np.array(s.eps, f32),
        "scale": np.exp(logit).astype(f32),
        "scale_4d": np.exp(logit).reshape(1, n, 1, 1).astype(f32),
        "logit_scale": logit,
        "log_100": np.array(np.log(100.0), f32),
        "position": (16 / (1 + np.exp(-rng.standard_normal((1, n, SEQ, SEQ))))).astype(f32),
        "window_mask": mask,
        "windows_view": np.array([-1, WINDOWS, n, SEQ, SEQ], np.int64),
        "scores_view": np.array([-1, n, SEQ, SEQ], np.int64),
        "halves_view": np.array([-1, 2, n // 2, SEQ, SEQ], np.int64),
        "halves_mask": np.where(rng.random((1, 2, 1, SEQ, SEQ)) < 0.3, -100.0, 0.0).astype(f32),
    }


def _feeds(batch: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, SEQ, HIDDEN)).astype(np.float32)}


@SPELLINGS
@example(Block(2, 16, "l2", "clip", True, False, "exp_min", "window"))  # TorchScript's Swin-V2
@example(Block(4, 8, "l2", "clip", False, False, "heads", "position"))  # dynamo's
@example(Block(2, 8, "sum_mul", "max_first", False, True, "heads_4d", "none"))
@example(Block(4, 4, "sum_square", "none", True, True, "exp_min", "window", 1e-6))
@given(blocks())
def test_cosine_attention_fuses_exactly_once(s: Block) -> None:
    model = block_model(s)
    done = fuse_quiet(model)
    assert len(done.ops_among(ATTENTION)) == 1, (s, done.ops, done.misses_about("attention")[:2])
    assert "Softmax" not in done.ops, (s, done.ops)
    for batch in (WINDOWS, 3 * WINDOWS):  # whole images of W windows each
        run_both(model, done.model, feeds=_feeds(batch, batch), **TOL)


@pytest.mark.parametrize("bias", BIASES)
def test_a_scale_computed_from_the_query_stays(bias: str) -> None:
    """Scores scaled by ``exp(max(q))`` per head and image: not a constant per head, so
    no rule moves the scale, the attention pattern refuses it by name, and the model
    computes what it did, bit for bit."""
    model = block_model(Block(2, 8, "l2", "clip", True, False, "query", bias))
    done = fuse_quiet(model, patterns=["attention"])
    done.assert_refused(
        model,
        op="MultiHeadAttention",
        kind="attention",
        reason="scale.in1 ('ls') is not a constant initializer",
        feeds=_feeds(2 * WINDOWS, 0),
    )


@pytest.mark.parametrize("bias", BIASES)
def test_unfused_scale_goes_back_to_the_scores(bias: str) -> None:
    """Without the attention pattern the per-head scale is written on the scores again
    (``undo_head_scales``): a Mul by the ``[N, 1, 1]`` constant reads the scores, and
    every value is the original's, bit for bit (rtol = atol = 0)."""
    model = block_model(Block(2, 8, "l2", "clip", True, False, "heads", bias))
    fused = optimize_quiet(model, target="onnxruntime", patterns=["gelu_tanh"]).to_proto()
    producers = {o: n for n in fused.graph.node for o in n.output}
    inits = {i.name: i for i in fused.graph.initializer}
    scaled = [
        n
        for n in fused.graph.node
        if n.op_type == "Mul"
        and producers.get(n.input[0]) is not None
        and producers[n.input[0]].op_type == "MatMul"
        and n.input[1] in inits
        and list(inits[n.input[1]].dims) == [2, 1, 1]
    ]
    assert len(scaled) == 1, [(n.op_type, list(n.input)) for n in fused.graph.node]
    run_both(model, fused, feeds=_feeds(2 * WINDOWS, 1), rtol=0, atol=0)


def test_a_view_that_splits_the_heads_stays() -> None:
    """A mask added on ``[B, 2, N / 2, S, S]``, a view of the heads, not of windows in
    the batch: ``window_mask`` leaves it, the attention pattern names the view, and the
    values are the original's bit for bit."""
    model = block_model(Block(4, 8, "l2", "clip", True, False, "heads", "head_halves"))
    _, done, _, _ = canonical_twice(model)
    assert "window_mask" not in done, done
    fuse_quiet(model, patterns=["attention"]).assert_refused(
        model,
        op="MultiHeadAttention",
        kind="attention",
        reason="found an unnamed Reshape",
        feeds=_feeds(3, 0),
    )


def _rows_model(perm: list[int], target: str) -> onnx.ModelProto:
    """``y = x' / max(||x'||, eps)`` over the last axis of ``x' = Transpose(x, perm)``,
    the norm expanded to ``Shape(x')`` ("own"), to a shape fed as an input ("fed") or not
    at all ("none")."""
    expand = {
        "own": ["sh = Shape (xt)", "d = Expand (c, sh)"],
        "fed": ["d = Expand (c, target)"],
        "none": [],
    }[target]
    body = [
        f"xt = Transpose <perm = {perm}> (x)",
        "n = ReduceL2 <keepdims = 1> (xt, axis_last)",
        "c = Clip (n, eps)",
        *expand,
        f"y = Div (xt, {'d' if expand else 'c'})",
    ]
    inputs = ["float[B, 5, 3, 8] x"] + (["int64[4] target"] if target == "fed" else [])
    inits = {"axis_last": np.array([-1], np.int64), "eps": np.array(1e-12, np.float32)}
    dims = ["B", 5, 3, 8]
    out = ", ".join(str(dims[p]) for p in perm)
    return graph_model(inputs, [f"float[{out}] y"], body, inits)


@pytest.mark.parametrize(
    "perm, target, moved",
    [
        ([0, 2, 1, 3], "own", True),  # the head Transpose, TorchScript's expand_as
        ([0, 2, 1, 3], "none", True),
        ([0, 2, 1, 3], "fed", False),  # the target may widen the norm: not proven
    ],
    ids=["own_shape", "no_expand", "fed_target"],
)
def test_cosine_heads_moves_rows_exactly(perm: list[int], target: str, moved: bool) -> None:
    """The normalization is computed before the Transpose only where the Expand's target
    is proven the rows' own shape (or there is none), and then computes the same values
    bit for bit (rtol = atol = 0)."""
    model = _rows_model(perm, target)
    out, done, again, _ = canonical_twice(model)
    assert (done.get("cosine_heads") == 1) is moved and again == 0, done
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 3, 8)).astype(np.float32)}
    if target == "fed":
        feeds["target"] = np.array([2, 3, 5, 8], np.int64)
    run_both(model, out, feeds=feeds, rtol=0, atol=0)


def test_a_transpose_that_moves_the_last_axis_keeps_its_norm() -> None:
    """``Transpose(x, [0, 1, 3, 2])`` changes the rows a last-axis norm reads: no move."""
    model = _rows_model([0, 1, 3, 2], "own")
    _, done, _, _ = canonical_twice(model)
    assert "cosine_heads" not in done, done


def test_a_scale_moved_onto_heads_read_as_given_goes_back() -> None:
    """Query heads fed as they are (no head Transpose to write the scale before): the
    scale multiplies them where the scores read them, and ``undo_unused`` writes it on the
    scores again, the values the original's bit for bit (rtol = atol = 0)."""
    body = [
        "kT = Transpose <perm = [0, 1, 3, 2]> (k)",
        "qk = MatMul (q, kT)",
        "scaled = Mul (scale, qk)",
        "probs = Softmax <axis = -1> (scaled)",
        "y = MatMul (probs, v)",
    ]
    heads = ", ".join(f"float[B, 2, {SEQ}, 8] {name}" for name in "qkv")
    scale = np.array([[[3.0]], [[0.7]]], np.float32)
    model = graph_model([heads], [f"float[B, 2, {SEQ}, 8] y"], body, {"scale": scale})
    _, done, again, work = canonical_twice(model)
    assert done.get("head_scale") == 1 and again == 0, done
    assert undo_unused(work.graph)["head_scale"] == 1
    back = ir.to_proto(work)
    assert [n.op_type for n in back.graph.node] == [n.op_type for n in model.graph.node]
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 2, SEQ, 8)).astype(np.float32) for n in "qkv"}
    run_both(model, back, feeds=feeds, rtol=0, atol=0)
