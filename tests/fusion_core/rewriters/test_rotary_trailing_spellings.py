"""Generated spellings of a rotary embedding on the trailing channels of each head
(DeepSeek-V4's ``apply_rotary_pos_emb``): each fuses exactly once, exactly; a rotation
whose own slices are off by one, or whose pairs are not a rotation, does not fuse and
says why.

A generator (hypothesis) writes one block with ``onnx.helper``: the heads
``x = Transpose(Reshape(h @ W, [B, S, N, H]), [0, 2, 1, 3])``, their last ``r``
channels rotated and joined back after the others, ``Concat(nope, rope * cos +
rot(rope) * sin)``, drawing independently:

* the heads ``N``, the head size ``H`` and the rotary part ``r`` (even, ``r < H``);
* how the parts are cut: ``x[..., :-r]`` and ``x[..., -r:]`` (negative bounds, as
  transformers writes them), ``x[..., :H-r]`` and ``x[..., H-r:]``, or one Split;
* the rotation: rotate_half (``Concat(-x2, x1)`` of the halves, the angles repeated
  by a Concat), or V4's interleaved pairs (``stack(-x_odd, x_even).flatten(-2)``, the
  angles by ``repeat_interleave``);
* the angles' batch: position ids ``[B, S]`` or ``[1, S]``.

On the onnxruntime target (or the generic one at opset 23, drawn) the rotation becomes
one ``RotaryEmbedding`` (interleaved for the pairs) of the rope part, nothing of the
written-out rotation left, and computes what the original computes: rtol = atol = 1e-5
(measured about 1e-6). With the rotate_half's upper half cut from ``h - 1``
(overlapping the lower) or the pairs negated the other way round (``stack(-x_even,
x_odd)``), nothing fuses, a rotary near miss names the slices, and the outputs are the
original's bit for bit. With a query and a key so rotated, the attention reads them
as head splits and fuses (the rope part's rotation laid out by ``concat_heads``).

The example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``, 200 in
the corpus tier).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS as SETTINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

_OPSET = {False: 18, True: 23}  # ONNX RotaryEmbedding is opset 23's
_IR = {False: 8, True: 10}
TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 32


@dataclass(frozen=True)
class Trailing:
    heads: int
    size: int  # H
    rotary: int  # r, even, < H
    cut: str  # "negative", "positive", "split"
    rotation: str  # "half", "pairs"
    batched: bool  # position ids [B, S] (else [1, S])
    generic: bool = False  # the generic target at opset 23 (ONNX RotaryEmbedding)
    off: bool = False  # the rotation's own slices are not a rotation


@st.composite
def trailings(draw, off: bool = False) -> Trailing:
    size = draw(st.integers(6, 40))
    return Trailing(
        heads=draw(st.integers(1, 4)),
        size=size,
        rotary=2 * draw(st.integers(2, (size - 1) // 2)),
        cut=draw(st.sampled_from(["negative", "positive", "split"])),
        rotation=draw(st.sampled_from(["half", "pairs"])),
        batched=draw(st.booleans()),
        generic=draw(st.booleans()),
        off=off,
    )


def _cut(t: Trailing, p: str) -> list[str]:
    if t.cut == "split":
        return [f"{p}nope, {p}rope = Split <axis = -1> ({p}x, parts)"]
    if t.cut == "negative":
        return [
            f"{p}nope = Slice ({p}x, zero, minus_r, last)",
            f"{p}rope = Slice ({p}x, minus_r, end, last)",
        ]
    return [
        f"{p}nope = Slice ({p}x, zero, pass_end, last)",
        f"{p}rope = Slice ({p}x, pass_end, end, last)",
    ]


def _rotation(t: Trailing, p: str) -> list[str]:
    if t.rotation == "half":
        low = "hi_start" if t.off else "half"  # off: the upper half from h - 1
        return [
            f"{p}lo = Slice ({p}rope, zero, half, last)",
            f"{p}hi = Slice ({p}rope, {low}, {'hi_end' if t.off else 'end'}, last)",
            f"{p}neg = Neg ({p}hi)",
            f"{p}rot = Concat <axis = -1> ({p}neg, {p}lo)",
        ]
    negated, kept = ("even", "odd") if t.off else ("odd", "even")
    return [
        f"{p}even = Slice ({p}rope, zero, end, last, two)",
        f"{p}odd = Slice ({p}rope, one, end, last, two)",
        f"{p}neg = Neg ({p}{negated})",
        f"{p}neg_u = Unsqueeze ({p}neg, last)",
        f"{p}kept_u = Unsqueeze ({p}{kept}, last)",
        f"{p}pairs = Concat <axis = -1> ({p}neg_u, {p}kept_u)",
        f"{p}rot = Reshape ({p}pairs, rope_shape)",
    ]


def _angles(t: Trailing) -> list[str]:
    if t.rotation == "half":
        repeated = ["f_r = Concat <axis = -1> (freqs, freqs)"]
    else:  # repeat_interleave(2)
        repeated = [
            "f_u = Unsqueeze (freqs, last)",
            "f_e = Expand (f_u, pair)",
            "f_r = Reshape (f_e, angle_shape)",
        ]
    return [
        "positions = Cast <to = 1> (position_ids)",
        "positions_u = Unsqueeze (positions, last)",
        "freqs = Mul (positions_u, inv_freq)",
        *repeated,
        "cos_t = Cos (f_r)",
        "sin_t = Sin (f_r)",
        "cos = Unsqueeze (cos_t, axis_1)",
        "sin = Unsqueeze (sin_t, axis_1)",
    ]


def _heads(t: Trailing, p: str) -> list[str]:
    """The heads ``{p}y`` of projection ``{p}w``, their trailing channels rotated."""
    return [
        f"{p}q = MatMul (h, {p}w)",
        f"{p}q_heads = Reshape ({p}q, heads)",
        f"{p}x = Transpose <perm = [0, 2, 1, 3]> ({p}q_heads)",
        *_cut(t, p),
        *_rotation(t, p),
        f"{p}rope_cos = Mul ({p}rope, cos)",
        f"{p}rot_sin = Mul ({p}rot, sin)",
        f"{p}rotated = Add ({p}rope_cos, {p}rot_sin)",
        f"{p}y = Concat <axis = -1> ({p}nope, {p}rotated)",
    ]


def _constants(t: Trailing, weights: str) -> dict[str, np.ndarray]:
    n, h, r = t.heads, t.size, t.rotary
    rng = np.random.default_rng(zlib.crc32(repr(t).encode()))
    return {
        **{w: rng.standard_normal((HIDDEN, n * h)) / np.sqrt(HIDDEN) for w in weights},
        "inv_freq": 1.0 / (10000 ** (np.arange(0, r, 2) / r)),
        "heads": np.array([0, 0, n, h], np.int64),
        "parts": np.array([h - r, r], np.int64),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "last": np.array([-1], np.int64),
        "axis_1": np.array([1], np.int64),
        "end": np.array([2**62], np.int64),
        "minus_r": np.array([-r], np.int64),
        "pass_end": np.array([h - r], np.int64),
        "half": np.array([r // 2], np.int64),
        "hi_start": np.array([r // 2 - 1], np.int64),
        "hi_end": np.array([r - 1], np.int64),
        "pair": np.array([1, 1, 1, 2], np.int64),
        "angle_shape": np.array([0, 0, r], np.int64),
        "rope_shape": np.array([0, n, 0, r], np.int64),
        "merge": np.array([0, 0, n * h], np.int64),
        "scale": np.array(h**-0.5, np.float32),
    }


def trailing_model(t: Trailing) -> onnx.ModelProto:
    ids = "batch" if t.batched else "1"
    text = f"""<ir_version: {_IR[t.generic]}, opset_import: ["" : {_OPSET[t.generic]}]>
    g (float[batch, seq, {HIDDEN}] h, int64[{ids}, seq] position_ids)
        => (float[batch, {t.heads}, seq, {t.size}] y) {{
        {chr(10).join(_angles(t) + _heads(t, ""))}
    }}"""
    return build_model(text, _constants(t, ["w"]))


def v4_attention(t: Trailing) -> onnx.ModelProto:
    """Query and key rotated on their trailing channels, then softmax attention."""
    attention = [
        "k_t = Transpose <perm = [0, 1, 3, 2]> (k_y)",
        "scores = MatMul (y, k_t)",
        "scaled = Mul (scores, scale)",
        "probs = Softmax <axis = -1> (scaled)",
        "v = MatMul (h, v_w)",
        "v_heads = Reshape (v, heads)",
        "v_t = Transpose <perm = [0, 2, 1, 3]> (v_heads)",
        "context = MatMul (probs, v_t)",
        "context_t = Transpose <perm = [0, 2, 1, 3]> (context)",
        "out = Reshape (context_t, merge)",
    ]
    lines = _angles(t) + _heads(t, "") + _heads(t, "k_") + attention
    ids = "batch" if t.batched else "1"
    text = f"""<ir_version: {_IR[t.generic]}, opset_import: ["" : {_OPSET[t.generic]}]>
    g (float[batch, seq, {HIDDEN}] h, int64[{ids}, seq] position_ids)
        => (float[batch, seq, {t.heads * t.size}] out) {{
        {chr(10).join(lines)}
    }}"""
    return build_model(text, _constants(t, ["w", "k_w", "v_w"]))


def _feeds(t: Trailing, batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    rows = batch if t.batched else 1
    return {
        "h": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": rng.integers(0, 64, (rows, seq)).astype(np.int64),
    }


@SETTINGS
@given(trailings())
def test_every_trailing_rotary_fuses_once_exactly(t: Trailing) -> None:
    model = trailing_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    pattern = "rotary_embedding" + ("_interleaved" if t.rotation == "pairs" else "")
    assert fused.result.counts == {pattern: 1}, f"{t}: {fused.misses_about('rotary')}"
    assert fused.ops.count("RotaryEmbedding") == 1 and "Neg" not in fused.ops, fused.ops
    (rotary,) = [n for n in fused.model.graph.node if n.op_type == "RotaryEmbedding"]
    attrs = {a.name: a.i for a in rotary.attribute}
    assert attrs["rotary_embedding_dim"] == t.rotary, attrs
    assert attrs.get("interleaved", 0) == (t.rotation == "pairs"), attrs
    run_both(model, fused.model, feeds=_feeds(t), **TOL)


@SETTINGS
@given(trailings(off=True))
def test_a_trailing_rotation_off_by_one_does_not_fuse(t: Trailing) -> None:
    model = trailing_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    step = "halves" if t.rotation == "half" else "even and odd"
    fused.assert_refused(model, op="RotaryEmbedding", kind="rotary", reason=step, feeds=_feeds(t))


@pytest.mark.parametrize("rotation", ["pairs", "half"])
def test_the_attention_reads_queries_and_keys_rotated_on_their_trailing_channels(rotation):
    t = Trailing(heads=4, size=24, rotary=8, cut="negative", rotation=rotation, batched=True)
    model = v4_attention(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    pattern = "rotary_embedding" + ("_interleaved" if rotation == "pairs" else "")
    assert fused.result.counts.get(pattern) == 2, fused.result.counts
    assert fused.result.counts.get("attention") == 1, fused.misses_about("attention")
    assert "Softmax" not in fused.ops and "Neg" not in fused.ops, fused.ops
    run_both(model, fused.model, feeds=_feeds(t), **TOL)
