"""Generated spellings of DeepSeek's interleaved rotary on constant tables (Bailing-hybrid's
dynamo prefill, exported at one length): each fuses exactly once, exactly; tables that
are no cache of one row per position, or no cosine and sine of one angle, do not fuse
and say why.

A generator (hypothesis) writes one block with ``onnx.helper`` at a static ``[1, S]``:
the rope part ``x`` of the heads cut by strided Slices into ``x1 = x[..., 0::2]`` and
``x2 = x[..., 1::2]``, rotated as ``Concat(x1 * c - x2 * s, x2 * c + x1 * s)`` with
``c``, ``s`` constant ``[1, 1, S, r / 2]`` tables (what constant folding leaves of the
rotary embedding), drawing independently:

* the length ``S``, the heads ``N``, the nope and rope widths, the angles' base and a
  scaling of both tables (YaRN's attention scaling);
* the query, ``Concat(nope, rotated)`` of the transposed heads' parts cut by a Split or
  by two Slices, or the key, one head viewed ``[1, 1, S, r]`` from a Split of its
  projection (``k_rot.view(B, 1, S, r)``), expanded to the ``N`` heads after.

On the onnxruntime target (or the generic one at opset 23, drawn) the rotation becomes
one ``RotaryEmbedding`` (the canonical form computes the pairs' columns in halves in the
projection, as for the TorchScript export of the same model), nothing of the
written-out rotation left, and computes what the original computes: rtol = atol = 1e-5
(measured about 1e-6). With tables of a row per head, one row for every position, or a
sine of other positions than the cosine, nothing fuses, a rotary near miss names the
table, and the outputs are the original's bit for bit.

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
# what a near-alike's table is and the words its near miss says
OFF = {"per_head": "one row per position", "one_row": "one row", "shifted": "one angle"}


@dataclass(frozen=True)
class Tables:
    length: int  # S
    heads: int  # N (the query's)
    nope: int
    rotary: int  # r, even
    kind: str  # "query", "key"
    cut: str  # "split", "slices" (the query's nope and rope)
    base: float
    scale: float
    generic: bool = False  # the generic target at opset 23 (ONNX RotaryEmbedding)
    off: str = ""  # "", or a key of OFF


@st.composite
def tables(draw, off: str = "") -> Tables:
    kind = "query" if off == "per_head" else draw(st.sampled_from(["query", "key"]))
    return Tables(
        length=draw(st.integers(2, 12)),
        # the key's Expand to one head would be no op: its rotation the graph's output
        heads=draw(st.integers(1 if kind == "query" and not off else 2, 4)),
        nope=draw(st.integers(1, 16)),
        rotary=2 * draw(st.integers(2, 8)),
        kind=kind,
        cut=draw(st.sampled_from(["split", "slices"])),
        base=draw(st.sampled_from([10000.0, 50000.0])),
        scale=draw(st.sampled_from([1.0, 1.25])),
        generic=draw(st.booleans()),
        off=off,
    )


def _angle_tables(t: Tables) -> tuple[np.ndarray, np.ndarray]:
    half = t.rotary // 2
    inv_freq = 1.0 / (t.base ** (np.arange(0, t.rotary, 2) / t.rotary))
    positions = np.arange(t.length, dtype=np.float64)
    cos = np.cos(positions[:, None] * inv_freq)[None, None]
    shift = 1 if t.off == "shifted" else 0
    sin = np.sin((positions[:, None] + shift) * inv_freq)[None, None]
    if t.off == "per_head":  # another angle per head: heads rotate differently
        rows = (np.arange(t.heads, dtype=np.float64) + 1)[None, :, None, None]
        cos, sin = np.cos(rows * np.arccos(cos)), np.sin(rows * np.arccos(cos))
    if t.off == "one_row":
        cos, sin = cos[:, :, -1:], sin[:, :, -1:]
    assert cos.shape[-1] == half
    return (t.scale * cos).astype(np.float32), (t.scale * sin).astype(np.float32)


def _source(t: Tables) -> tuple[list[str], dict[str, np.ndarray], str]:
    """(lines making the rope part ``x``, their constants, the output's type)."""
    s, n, h = t.length, t.heads, t.nope + t.rotary
    if t.kind == "key":
        lines = ["kv = MatMul (h, w)", "kv_nope, k_rot = Split <axis = -1> (kv, parts)"]
        lines.append("x = Reshape (k_rot, one_head)")
        inits = {
            "one_head": np.array([1, 1, s, t.rotary], np.int64),
            "every_head": np.array([1, n, s, t.rotary], np.int64),
        }
        return lines, inits, f"float[1, {n}, {s}, {t.rotary}] y, float[1, {s}, {t.nope}] kv_nope"
    lines = [
        "q = MatMul (h, w)",
        "q_heads = Reshape (q, heads)",
        "q_t = Transpose <perm = [0, 2, 1, 3]> (q_heads)",
    ]
    if t.cut == "split":
        lines.append("nope, x = Split <axis = -1> (q_t, parts)")
    else:
        lines += [
            "nope = Slice (q_t, zero, pass_end, last)",
            "x = Slice (q_t, pass_end, end, last)",
        ]
    inits = {"heads": np.array([1, s, n, h], np.int64)}
    return lines, inits, f"float[1, {n}, {s}, {h}] y"


def tables_model(t: Tables) -> onnx.ModelProto:
    rng = np.random.default_rng(zlib.crc32(repr(t).encode()))
    width = t.nope + t.rotary if t.kind == "key" else t.heads * (t.nope + t.rotary)
    lines, inits, outputs = _source(t)
    cos, sin = _angle_tables(t)
    inits |= {
        "w": rng.standard_normal((HIDDEN, width)) / np.sqrt(HIDDEN),
        "cos": cos,
        "sin": sin,
        "parts": np.array([t.nope, t.rotary], np.int64),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "last": np.array([-1], np.int64),
        "end": np.array([2**62], np.int64),
        "pass_end": np.array([t.nope], np.int64),
    }
    lines += [
        "x1 = Slice (x, zero, end, last, two)",
        "x2 = Slice (x, one, end, last, two)",
        "x1_cos = Mul (x1, cos)",
        "x2_sin = Mul (x2, sin)",
        "x2_cos = Mul (x2, cos)",
        "x1_sin = Mul (x1, sin)",
        "first = Sub (x1_cos, x2_sin)",
        "second = Add (x2_cos, x1_sin)",
        "rotated = Concat <axis = -1> (first, second)",
        # the key's one head expanded to every query head (DeepSeek's k_pe.expand)
        "y = Expand (rotated, every_head)"
        if t.kind == "key"
        else "y = Concat <axis = -1> (nope, rotated)",
    ]
    text = f"""<ir_version: {_IR[t.generic]}, opset_import: ["" : {_OPSET[t.generic]}]>
    g (float[1, {t.length}, {HIDDEN}] h) => ({outputs}) {{
        {chr(10).join(lines)}
    }}"""
    return build_model(text, inits)


@SETTINGS
@given(tables())
def test_every_rotary_on_constant_tables_fuses_once_exactly(t: Tables) -> None:
    model = tables_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    assert fused.result.counts == {"rotary_embedding": 1}, f"{t}: {fused.misses_about('rotary')}"
    assert fused.ops.count("RotaryEmbedding") == 1, fused.ops
    assert "Sub" not in fused.ops and "Mul" not in fused.ops, fused.ops
    (rotary,) = [n for n in fused.model.graph.node if n.op_type == "RotaryEmbedding"]
    attrs = {a.name: a.i for a in rotary.attribute}
    assert attrs["rotary_embedding_dim"] == t.rotary and not attrs.get("interleaved"), attrs
    run_both(model, fused.model, **TOL)


@SETTINGS
@given(st.sampled_from(sorted(OFF)).flatmap(lambda off: tables(off=off)))
def test_tables_that_are_no_rotation_cache_do_not_fuse(t: Tables) -> None:
    model = tables_model(t)
    fused = fuse_quiet(model, target="generic" if t.generic else "onnxruntime")
    fused.assert_refused(model, op="RotaryEmbedding", kind="rotary", reason=OFF[t.off])
