"""Generated spellings of Pixtral's rotary: rotate_half on the transposed heads
``[B, N, S, H]`` by cos and sin ``Unsqueeze(c, 0)`` of a ``[S, r]`` table with no batch
axis (the angles of the patches, one table for the joined images), broadcast over the
batch: each fuses exactly once into a ``RotaryEmbedding`` whose cache is the table read
at positions ``0 .. S - 1``, and computes what the original computes; a table whose
halves differ, or of one row for every position, does not fuse and says why.

A generator (hypothesis) writes one block with ``onnx.helper`` at a dynamic ``[B, S]``:
the angles ``f`` ``[S, r / 2]`` a graph input, the table ``Cos(Concat(f, f))`` or
``Concat(u, u)`` of ``u = Cos(f)`` (and Sin), times a scalar (an attention scaling) or not; the
heads ``N``, ``r`` and the batch of the feeds drawn (the table is broadcast over it);
the onnxruntime target or the generic one at opset 23.

rtol = atol = 1e-5 (measured about 1e-6). The near-alikes' outputs are the original's
bit for bit.

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

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 16
# what a near-alike is and the words its near miss says
OFF = {"halves": "halves", "one_row": "is not [S,"}


@dataclass(frozen=True)
class Flat:
    heads: int  # N
    half: int  # r / 2; the head is r
    batch: int  # of the feeds
    cos_last: bool  # Cos(Concat(f, f)), else Concat(Cos(f), Cos(f))
    scale: bool  # times a scalar constant
    generic: bool = False  # the generic target at opset 23
    off: str = ""  # "", or a key of OFF


@st.composite
def flat(draw, off: str = "") -> Flat:
    return Flat(
        heads=draw(st.integers(1, 4)),
        # r = 2: a canonical rule writes Concat(u, u) of one column as an Expand
        half=draw(st.integers(2, 8)),
        batch=draw(st.integers(1, 3)),
        cos_last=draw(st.booleans()),
        scale=draw(st.booleans()),
        generic=draw(st.booleans()),
        off=off,
    )


def _table(t: Flat, op: str) -> list[str]:
    """``{op}_t`` ``[S, r]`` from the angles ``f`` (the sine of other angles ``g`` in its
    second half where ``off`` is ``halves``)."""
    name = op.lower()
    other = "g" if t.off == "halves" else "f"
    if t.cos_last:
        lines = [f"{name}_f = Concat <axis = -1> (f, {other})", f"{name}_c = {op} ({name}_f)"]
    else:  # one Cos read twice, as the exporters write torch.cat((emb, emb)).cos()'s fold
        second = f"{name}_b" if t.off == "halves" else f"{name}_a"
        lines = [
            f"{name}_a = {op} (f)",
            f"{name}_b = {op} ({other})",
            f"{name}_c = Concat <axis = -1> ({name}_a, {second})",
        ]
    scaled = f"{name}_t = Mul ({name}_c, scaling)" if t.scale else f"{name}_t = Identity ({name}_c)"
    return [*lines, scaled, f"{name} = Unsqueeze ({name}_t, zero)"]


def flat_model(t: Flat) -> onnx.ModelProto:
    rng = np.random.default_rng(zlib.crc32(repr(t).encode()))
    n, head = t.heads, 2 * t.half
    lines = [
        "q = MatMul (h, w)",
        "q_heads = Reshape (q, heads)",
        "x = Transpose <perm = [0, 2, 1, 3]> (q_heads)",
        *_table(t, "Cos"),
        *_table(t, "Sin"),
        "lo = Slice (x, zero, half, last)",
        "hi = Slice (x, half, end, last)",
        "neg_hi = Neg (hi)",
        "rot = Concat <axis = -1> (neg_hi, lo)",
        "x_cos = Mul (x, cos)",
        "rot_sin = Mul (rot, sin)",
        "y = Add (x_cos, rot_sin)",
    ]
    inits = {
        "w": rng.standard_normal((HIDDEN, n * head)) / np.sqrt(HIDDEN),
        "heads": np.array([0, 0, n, head], np.int64),
        "scaling": np.array(1.25, np.float32),
        "half": np.array([t.half], np.int64),
        "zero": np.array([0], np.int64),
        "last": np.array([-1], np.int64),
        "end": np.array([2**62], np.int64),
    }
    rows = "1" if t.off == "one_row" else "S"
    ir_version, opset = (10, 23) if t.generic else (8, 18)
    text = f"""<ir_version: {ir_version}, opset_import: ["" : {opset}]>
    g (float[B, S, {HIDDEN}] h, float[{rows}, {t.half}] f, float[{rows}, {t.half}] g)
        => (float[B, {n}, S, {head}] y) {{
        {chr(10).join(lines)}
    }}"""
    return build_model(text, inits)


def _feeds(t: Flat) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(repr(t).encode()) + 1)
    rows = 1 if t.off == "one_row" else 6
    return {
        "h": rng.standard_normal((t.batch, 6, HIDDEN)).astype(np.float32),
        "f": rng.uniform(-3, 3, (rows, t.half)).astype(np.float32),
        "g": rng.uniform(-3, 3, (rows, t.half)).astype(np.float32),
    }


@SETTINGS
@given(flat())
def test_every_flat_table_rotary_fuses_once_exactly(t: Flat) -> None:
    model = flat_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    assert fused.result.counts == {"rotary_embedding": 1}, f"{t}: {fused.misses_about('rotary')}"
    assert fused.ops.count("RotaryEmbedding") == 1, fused.ops
    assert "Neg" not in fused.ops, fused.ops
    run_both(model, fused.model, feeds=_feeds(t), **TOL)


@SETTINGS
@given(st.sampled_from(sorted(OFF)).flatmap(lambda off: flat(off=off)))
def test_flat_tables_that_are_no_cache_do_not_fuse(t: Flat) -> None:
    model = flat_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    fused.assert_refused(
        model, op="RotaryEmbedding", kind="rotary", reason=OFF[t.off], feeds=_feeds(t)
    )
