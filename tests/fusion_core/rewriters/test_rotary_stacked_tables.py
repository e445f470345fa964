"""Generated spellings of RoFormer's rotary: rotate-every-two on the transposed heads
``[B, N, S, H]``, its sin and cos two parts of ONE sinusoidal table gathered by position,
each stacked twice (``torch.stack([cos, cos], -1).reshape_as(...)``): each fuses exactly
once into an interleaved ``RotaryEmbedding`` and computes what the original computes;
tables that are no rotation, or a stack of two different values, do not fuse and say why.

A generator (hypothesis) writes one block with ``onnx.helper`` at a dynamic ``[B, S]``:
``T = Gather(W, Range(0, S))`` of a constant ``W`` ``[P, 2h]``, its parts ``W[:, :h]``
and ``W[:, h:]`` (the sine first as RoFormer's, or the cosine first, drawn) cut by
Slices or a Split, before or after the Unsqueezes to ``[1, 1, S, .]`` (one
``Unsqueeze(g, [0, 1])`` or two), each part stacked as ``Concat(u, u, -1)`` of one
Unsqueeze read twice (dynamo) or of two Unsqueezes of the part (TorchScript), and
flattened by a Reshape to ``Shape(T)`` or to ``[1, 1, -1, 2h]``; the heads ``N``, the
head size ``2h`` and the base drawn; the onnxruntime target or the generic one at
opset 23.

The fused op rotates the pairs by the cache ``W``'s parts: rtol = atol = 1e-5 (measured
about 1e-6). A table whose second part is no cosine of the first's angles (``cos^2 +
sin^2`` varies), or a stack of the cosine with the sine, does not fuse, a rotary near
miss says why, and the outputs are the original's bit for bit.

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
from tests.fusion_core.decoder_text import PICK_CONSTANTS
from tests.fusion_core.spelling_settings import SPELLINGS as SETTINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 16
POSITIONS = 24
# what a near-alike is and the words its near miss says
OFF = {"unpaired": "not the cosine and sine", "mixed": "stack of copies"}


@dataclass(frozen=True)
class Stacked:
    heads: int  # N
    half: int  # h: the head is 2h, all of it rotated
    base: float
    sin_first: bool  # RoFormer's table: [sin | cos]
    cut: str  # "slices", "split", "split_first" (the Split before the Unsqueezes)
    stack: str  # "one" (dynamo: one Unsqueeze read twice), "two" (TorchScript)
    unsqueeze: str  # "one" (axes [0, 1]), "two"
    flatten: str  # "shape" (Shape(T)), "constant" ([1, 1, -1, 2h])
    generic: bool = False  # the generic target at opset 23
    off: str = ""  # "", or a key of OFF


@st.composite
def stacked(draw, off: str = "") -> Stacked:
    return Stacked(
        heads=draw(st.integers(1, 4)),
        half=draw(st.integers(1, 8)),
        base=draw(st.sampled_from([10000.0, 500.0])),
        sin_first=draw(st.booleans()),
        cut=draw(st.sampled_from(["slices", "split", "split_first"])),
        stack=draw(st.sampled_from(["one", "two"])),
        unsqueeze=draw(st.sampled_from(["one", "two"])),
        flatten=draw(st.sampled_from(["shape", "constant"])),
        generic=draw(st.booleans()),
        off=off,
    )


def _table(t: Stacked) -> np.ndarray:
    """RoFormer's ``embed_positions`` weight: ``[sin | cos]`` of ``pos / base^(2i/2h)``."""
    inv_freq = 1.0 / (t.base ** (np.arange(t.half) * 2 / (2 * t.half)))
    angles = np.arange(POSITIONS, dtype=np.float64)[:, None] * inv_freq
    cos = np.cos(angles)
    if t.off == "unpaired":  # another table's cosine: cos^2 + sin^2 varies
        cos = np.cos(2 * angles + 0.3) * np.linspace(0.5, 1.0, t.half)
    parts = [np.sin(angles), cos] if t.sin_first else [cos, np.sin(angles)]
    return np.concatenate(parts, axis=1).astype(np.float32)


def _parts(t: Stacked) -> list[str]:
    """Lines making ``part_0``, ``part_1`` ``[1, 1, S, h]`` and ``t4`` ``[1, 1, S, 2h]``."""
    if t.unsqueeze == "one":
        lift = ["{dst} = Unsqueeze ({src}, axes_0_1)"]
    else:
        lift = ["{dst}_3 = Unsqueeze ({src}, zero)", "{dst} = Unsqueeze ({dst}_3, zero)"]
    lines = [line.format(src="g", dst="t4") for line in lift]
    if t.cut == "split_first":
        lines.append("g_0, g_1 = Split <axis = -1, num_outputs = 2> (g)")
        for k in (0, 1):
            lines += [line.format(src=f"g_{k}", dst=f"part_{k}") for line in lift]
    elif t.cut == "split":
        lines.append("part_0, part_1 = Split <axis = -1> (t4, halves)")
    else:
        lines += ["part_0 = Slice (t4, zero, half, last)", "part_1 = Slice (t4, half, end, last)"]
    return lines


def _stack(t: Stacked, name: str, first: str, second: str) -> list[str]:
    """``name = Reshape(Concat(Unsqueeze(first, -1), Unsqueeze(second, -1)))``."""
    if t.stack == "one" and first == second:
        lines = [f"{name}_u = Unsqueeze ({first}, last)"]
        pair = f"{name}_u, {name}_u"
    else:
        lines = [f"{name}_a = Unsqueeze ({first}, last)", f"{name}_b = Unsqueeze ({second}, last)"]
        pair = f"{name}_a, {name}_b"
    target = "t4_shape" if t.flatten == "shape" else "flat"
    return [
        *lines,
        f"{name}_p = Concat <axis = -1> ({pair})",
        f"{name} = Reshape ({name}_p, {target})",
    ]


def stacked_model(t: Stacked) -> onnx.ModelProto:
    rng = np.random.default_rng(zlib.crc32(repr(t).encode()))
    n, head = t.heads, 2 * t.half
    sin, cos = ("part_0", "part_1") if t.sin_first else ("part_1", "part_0")
    lines = [
        "q = MatMul (h, w)",
        "q_heads = Reshape (q, heads)",
        "x = Transpose <perm = [0, 2, 1, 3]> (q_heads)",
        "h_shape = Shape (h)",
        "length = Gather <axis = 0> (h_shape, one_scalar)",
        "ids = Range (zero_scalar, length, one_scalar)",
        "g = Gather <axis = 0> (table, ids)",
        *_parts(t),
        "t4_shape = Shape (t4)",
        *_stack(t, "cos2", cos, cos),
        *_stack(t, "sin2", sin, cos if t.off == "mixed" else sin),
        "even = Slice (x, zero, end, last, two)",
        "odd = Slice (x, one, end, last, two)",
        "neg_odd = Neg (odd)",
        "r_a = Unsqueeze (neg_odd, last)",
        "r_b = Unsqueeze (even, last)",
        "r_p = Concat <axis = -1> (r_a, r_b)",
        "x_shape = Shape (x)",
        "rot = Reshape (r_p, x_shape)",
        "x_cos = Mul (x, cos2)",
        "rot_sin = Mul (rot, sin2)",
        "y = Add (x_cos, rot_sin)",
    ]
    inits = {
        "w": rng.standard_normal((HIDDEN, n * head)) / np.sqrt(HIDDEN),
        "heads": np.array([0, 0, n, head], np.int64),
        "table": _table(t),
        "halves": np.array([t.half, t.half], np.int64),
        "half": np.array([t.half], np.int64),
        "flat": np.array([1, 1, -1, head], np.int64),
        **PICK_CONSTANTS,
    }
    ir_version, opset = (10, 23) if t.generic else (8, 18)
    text = f"""<ir_version: {ir_version}, opset_import: ["" : {opset}]>
    g (float[B, S, {HIDDEN}] h) => (float[B, {n}, S, {head}] y) {{
        {chr(10).join(lines)}
    }}"""
    return build_model(text, inits)


def _feeds(t: Stacked) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(repr(t).encode()) + 1)
    return {"h": rng.standard_normal((2, 7, HIDDEN)).astype(np.float32)}


@SETTINGS
@given(stacked())
def test_every_stacked_table_rotary_fuses_once_exactly(t: Stacked) -> None:
    model = stacked_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    counts = {"rotary_embedding_interleaved": 1}
    assert fused.result.counts == counts, f"{t}: {fused.misses_about('rotary')}"
    assert fused.ops.count("RotaryEmbedding") == 1, fused.ops
    assert "Neg" not in fused.ops and "Mul" not in fused.ops, fused.ops
    (rotary,) = [n for n in fused.model.graph.node if n.op_type == "RotaryEmbedding"]
    attrs = {a.name: a.i for a in rotary.attribute}
    assert attrs["interleaved"] == 1 and attrs.get("rotary_embedding_dim", 0) in (0, 2 * t.half)
    run_both(model, fused.model, feeds=_feeds(t), **TOL)


@SETTINGS
@given(st.sampled_from(sorted(OFF)).flatmap(lambda off: stacked(off=off)))
def test_stacks_that_are_no_rotation_do_not_fuse(t: Stacked) -> None:
    model = stacked_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    fused.assert_refused(
        model, op="RotaryEmbedding", kind="rotary", reason=OFF[t.off], feeds=_feeds(t)
    )
