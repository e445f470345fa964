"""Generated spellings of a query that reaches the scores as ``Concat(q_nope, rot(q_rope))``
of the head-first layout (Dots3's latent attention, issue 24): each fuses exactly once,
exactly (canonical rule ``concat_heads``, its layout ``_heads_layout.py``).

A generator (hypothesis) writes one attention block whose query is a projection viewed
``[B, S, N, D]``, its head Transpose ``[0, 2, 1, 3]``, a Split of the last axis into a
part without position (``nope``) and a rotary part (``rope``) at drawn widths, the rope
part rotated, and the two joined again (nope first, as the models, or rope first),
drawing:

* the head count, the two widths, the value's head size;
* the query's rotary: written out (rotate_half's Mul/Add, which the rotary pattern fuses
  first) or already fused (``com.microsoft.RotaryEmbedding`` on the ``[B, N, S, r]``
  part);
* the key: latent (Dots3, DeepSeek: ``k_nope`` and ``v`` split from one projection's
  heads, the rope part one head ``view(B, 1, S, r)`` shared by every head, expanded, and
  joined to ``k_nope`` in the query's order) or grouped (a head split of its own with
  fewer heads, 1 or 2, repeated as repeat_kv);
* the latent key's one head: normed or not (Dots3's ``k_rope_only_layernorm``, an RMS
  norm written out) and rotated by a written-out rotate_half, the fused op, or the
  interleaved spelling Dots3 writes (``cat(x1 * c - x2 * s, x2 * c + x1 * s)`` of
  ``x[..., 0::2]`` and ``x[..., 1::2]``);
* with or without the causal and padding mask.

Every block must come out as one attention op with no Softmax left, the query's rotary
fused, and compute what the original computes (onnxruntime, its optimizations off) on
two shapes, with and without a left-padded row: rtol = atol = 1e-5, as
test_concat_heads.py (the kernel sums in another order; at these sizes outputs differ by
about 1e-6). Before the layout viewed one head whatever formed it, every latent block
with a normed key head (``DOTS3`` below, the example) left its Softmax: its query read
as the Concat ("expected Transpose 'q_t' ...; found Concat").

Near-alikes that must not fuse: the rope part from another Transpose (``[0, 3, 1, 2]`` of
a ``[B, S, r, N]`` view) and a per-part op that does not commute with the head Transpose
(a Softmax over the heads): the Concat stays, the near miss names it, the values are
the original's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet, run_both
from tests.fusion_core.decoder_text import CAUSAL, HALF_TABLES, PADDING, TEXT_CONSTANTS, positions
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 32
POSITIONS = 64  # the fused rotary's table rows: every position the feeds draw
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention", "Attention")
T = "Transpose <perm = [0, 2, 1, 3]>"
# the merges change nothing here; SimplifiedLayerNormalization (the key head's norm) is an
# onnxruntime op in the ONNX domain, which onnx's checker does not know
EXCLUDED = ["qkv_merge", "kv_merge", "rms_norm", "rms_norm_unscaled"]


@dataclass(frozen=True)
class Query:
    heads: int
    nope: int
    rope: int
    value: int  # the value's head size (latent key; a grouped key's values are D wide)
    nope_first: bool
    fused_query: bool  # the query's rotary a com.microsoft.RotaryEmbedding already
    kv_heads: int  # the key's heads: ``heads`` for the latent key, 1 or 2 for a grouped one
    key_norm: bool  # the latent key's one rope head normed (Dots3)
    key_rotary: str  # "written", "fused" or "interleaved": the latent key's rope head
    mask: bool


@st.composite
def queries(draw) -> Query:
    heads = draw(st.sampled_from([2, 4]))
    latent = draw(st.booleans())
    return Query(
        heads=heads,
        nope=draw(st.sampled_from([2, 4, 6, 8])),
        rope=draw(st.sampled_from([4, 8])),
        value=draw(st.sampled_from([4, 6, 8])),
        nope_first=draw(st.booleans()),
        fused_query=draw(st.booleans()),
        kv_heads=heads if latent else draw(st.sampled_from([1, 2])),
        key_norm=draw(st.booleans()),
        key_rotary=draw(st.sampled_from(["written", "fused", "interleaved"])),
        mask=draw(st.booleans()),
    )


DOTS3 = Query(  # Dots3's own spelling (dynamo): nope first, its key head normed, interleaved
    heads=4, nope=8, rope=4, value=8, nope_first=True, fused_query=True, kv_heads=4,
    key_norm=True, key_rotary="interleaved", mask=True,
)  # fmt: skip


def _inits(s: Query, rng: np.random.Generator) -> dict:
    n, d, r, kv = s.heads, s.nope + s.rope, s.rope, s.kv_heads
    inv_freq = 1.0 / (10000 ** (np.arange(0, r, 2) / r))
    angles = np.arange(POSITIONS)[:, None] * inv_freq[None, :]
    value = s.value if kv == n else d
    return {
        "inv_freq": inv_freq.astype(np.float32),
        "cos_cache": np.cos(angles).astype(np.float32),
        "sin_cache": np.sin(angles).astype(np.float32),
        "wq": rng.standard_normal((HIDDEN, n * d)) * 0.3,
        "wkv": rng.standard_normal((HIDDEN, n * (s.nope + s.value))) * 0.3,
        "wk": rng.standard_normal((HIDDEN, kv * d)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, kv * d)) * 0.3,
        "wk_rope": rng.standard_normal((HIDDEN, r)) * 0.3,
        "k_norm_w": rng.uniform(0.5, 1.5, r),
        "eps": np.array(1e-6, np.float32),
        "wo": rng.standard_normal((n * value, HIDDEN)) * 0.3,
        "q_split": np.array([0, 0, n, d], np.int64),
        "wq_rope": rng.standard_normal((HIDDEN, n * r)) * 0.3,
        "q_flip": np.array([0, 0, r, n], np.int64),
        "kv_split": np.array([0, 0, n, s.nope + s.value], np.int64),
        "k_split": np.array([0, 0, kv, d], np.int64),
        "parts": np.array([s.nope, r] if s.nope_first else [r, s.nope], np.int64),
        "kv_parts": np.array([s.nope, s.value], np.int64),
        "rope_heads": np.array([1, n, 1, 1], np.int64),
        "repeat": np.array([1, 1, n // kv, 1, 1], np.int64),
        "k_kv_merge": np.array([0, n, -1, d], np.int64),
        "v_kv_merge": np.array([0, n, -1, d], np.int64),
        "one_head": np.array([r], np.int64),
        "merge": np.array([0, 0, n * value], np.int64),
        **{name: np.array([v], np.int64) for name, v in _SCALARS.items()},
        **TEXT_CONSTANTS,
        "index_0": np.array(0, np.int64),
        "zero_f": np.array(0.0, np.float32),
        "lowest": np.array(np.finfo(np.float32).min, np.float32),
        "scale": np.array(d**-0.5, np.float32),
        "half": np.array([r // 2], np.int64),
    }


_SCALARS = {"zero": 0, "one": 1, "two": 2, "end": np.iinfo(np.int64).max}
_SCALARS |= {"axis_1": 1, "axis_2": 2, "axis_last": -1}


def _rotated(p: str, source: str, how: str) -> list[str]:
    """``{p}_rot``: ``source`` ([B, *, S, r]) rotated by position, spelled ``how``."""
    if how == "fused":
        tables = "position_ids, cos_cache, sin_cache"
        return [f"{p}_rot = com.microsoft.RotaryEmbedding ({source}, {tables})"]
    if how == "interleaved":  # Dots3: the pairs (x0, x1), ... out as two halves
        return [
            f"{p}_1 = Slice ({source}, zero, end, axis_last, two)",
            f"{p}_2 = Slice ({source}, one, end, axis_last, two)",
            f"{p}_1c = Mul ({p}_1, cos_half)",
            f"{p}_2s = Mul ({p}_2, sin_half)",
            f"{p}_lo = Sub ({p}_1c, {p}_2s)",
            f"{p}_2c = Mul ({p}_2, cos_half)",
            f"{p}_1s = Mul ({p}_1, sin_half)",
            f"{p}_hi = Add ({p}_2c, {p}_1s)",
            f"{p}_rot = Concat <axis = -1> ({p}_lo, {p}_hi)",
        ]
    return [  # rotate_half: x * cos + cat(-x2, x1) * sin
        f"{p}_a = Slice ({source}, zero, half, axis_last)",
        f"{p}_b = Slice ({source}, half, end, axis_last)",
        f"{p}_neg = Neg ({p}_b)",
        f"{p}_turn = Concat <axis = -1> ({p}_neg, {p}_a)",
        f"{p}_c = Mul ({source}, cos_u)",
        f"{p}_s = Mul ({p}_turn, sin_u)",
        f"{p}_rot = Add ({p}_c, {p}_s)",
    ]


def _tables() -> list[str]:
    """``cos_u``/``sin_u`` ``[B, 1, S, r]`` (rotate_half's) and their first halves."""
    return [
        *HALF_TABLES,
        "cos_f = Cos (freqs)",
        "sin_f = Sin (freqs)",
        "cos_half = Unsqueeze (cos_f, axis_1)",
        "sin_half = Unsqueeze (sin_f, axis_1)",
    ]


def _query(s: Query) -> list[str]:
    """``q_cat``: the head-first query split, its rope part rotated, joined again."""
    lines = ["qm = MatMul (x, wq)", "qr = Reshape (qm, q_split)", f"qt = {T} (qr)"]
    lines.append("qa, qb = Split <axis = -1> (qt, parts)")
    q_nope, q_pe = ("qa", "qb") if s.nope_first else ("qb", "qa")
    lines += _rotated("q", q_pe, "fused" if s.fused_query else "written")
    joined = (q_nope, "q_rot") if s.nope_first else ("q_rot", q_nope)
    return [*lines, f"q_cat = Concat <axis = -1> ({', '.join(joined)})"]


def _latent_key(s: Query) -> list[str]:
    """``k_cat`` and ``v_heads``: Dots3's key, its one rope head shared by every head."""
    lines = [
        "kv = MatMul (x, wkv)",
        "kv_r = Reshape (kv, kv_split)",
        f"kv_t = {T} (kv_r)",
        "k_nope, v_heads = Split <axis = -1> (kv_t, kv_parts)",
        "kp = MatMul (x, wk_rope)",
        "one_b = Gather <axis = 0> (x_shape, index_0)",
        "one_s = Gather <axis = 0> (x_shape, index_1)",
        "one_bu = Unsqueeze (one_b, zero)",
        "one_su = Unsqueeze (one_s, zero)",
        "one_target = Concat <axis = 0> (one_bu, one, one_su, one_head)",
        "k_one = Reshape (kp, one_target)",
    ]
    k_pe = "k_one"
    if s.key_norm:  # an RMS norm of the one head, written out
        lines += [
            "kn_sq = Mul (k_one, k_one)",
            "kn_ms = ReduceMean <keepdims = 1> (kn_sq, axis_last)",
            "kn_eps = Add (kn_ms, eps)",
            "kn_rt = Sqrt (kn_eps)",
            "kn_inv = Reciprocal (kn_rt)",
            "kn_x = Mul (k_one, kn_inv)",
            "k_normed = Mul (kn_x, k_norm_w)",
        ]
        k_pe = "k_normed"
    lines += [*_rotated("k", k_pe, s.key_rotary), "k_all = Expand (k_rot, rope_heads)"]
    joined = ("k_nope", "k_all") if s.nope_first else ("k_all", "k_nope")
    return [*lines, f"k_cat = Concat <axis = -1> ({', '.join(joined)})"]


def _grouped_key(s: Query) -> list[str]:
    """``k_cat`` and ``v_heads``: head splits of their own, ``kv_heads < heads`` of them
    repeated."""
    lines = []
    for p, weight in (("k", "wk"), ("v", "wv")):
        lines += [f"{p}m = MatMul (x, {weight})", f"{p}r = Reshape ({p}m, k_split)"]
        lines.append(f"{p}t = {T} ({p}r)")
        lines += [
            f"{p}_u = Unsqueeze ({p}t, axis_2)",
            f"{p}_e = Expand ({p}_u, repeat)",
            f"{p}_rep = Reshape ({p}_e, {p}_kv_merge)",
        ]
    return [*lines, "k_cat = Identity (k_rep)", "v_heads = Identity (v_rep)"]


def _scores(s: Query) -> list[str]:
    """The scores of ``q_cat`` and ``k_cat``, the optional mask, the context, ``y``."""
    lines = ["kT = Transpose <perm = [0, 1, 3, 2]> (k_cat)", "qk = MatMul (q_cat, kT)"]
    lines.append("scaled = Mul (qk, scale)")
    if s.mask:
        lines += [CAUSAL, *PADDING, "allowed = And (causal, padding)"]
        lines += ["bias = Where (allowed, zero_f, lowest)", "biased = Add (scaled, bias)"]
    else:
        lines.append("biased = Identity (scaled)")
    return [
        *lines,
        "probs = Softmax <axis = -1> (biased)",
        "context = MatMul (probs, v_heads)",
        f"ct = {T} (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]


def query_block(s: Query, query: list[str] | None = None, seed: int = 0) -> onnx.ModelProto:
    """The block of ``s``; ``query`` (lines that compute ``q_cat``) replaces its query."""
    latent = s.kv_heads == s.heads
    body = [
        "past_len = Identity (start)",
        *positions(),
        *_tables(),
        *(query if query is not None else _query(s)),
        *(_latent_key(s) if latent else _grouped_key(s)),
        *_scores(s),
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
    g (float[batch, seq, {HIDDEN}] x, int64[batch, seq] position_ids,
       int64[batch, seq] attention_mask) => (float[batch, seq, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    inits = _inits(s, np.random.default_rng(seed))
    return build_model(text, {k: np.asarray(v) for k, v in inits.items()})


def feeds(batch: int, seq: int, *, padded: bool) -> dict:
    rng = np.random.default_rng(batch * 10 + seq)
    mask = np.ones((batch, seq), np.int64)
    if padded:  # the last row padded on the left, as batched generation pads
        mask[-1, : min(2, seq - 1)] = 0
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": rng.integers(0, POSITIONS, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
    }


def _assert_same_values(model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    for batch, seq in [(1, 3), (2, 5)]:
        for padded in (False, True):
            run_both(model, fused, feeds=feeds(batch, seq, padded=padded), **TOL)


@SPELLINGS
@given(queries())
@example(DOTS3)
@example(replace(DOTS3, key_rotary="written", fused_query=False, nope_first=False))
def test_every_concat_query_fuses_into_one_attention_exactly(s: Query) -> None:
    model = query_block(s)
    done = fuse_quiet(model, exclude=EXCLUDED)
    fused_attention = done.ops_among(ATTENTION)
    reasons = done.misses_about("attention")[:3]
    assert len(fused_attention) == 1, f"{s}: {fused_attention}; {reasons}"
    assert "Softmax" not in done.ops, s
    rotaries = done.ops.count("RotaryEmbedding")
    if s.kv_heads != s.heads:
        assert rotaries == 1, f"{s}: {rotaries} rotary"  # the query's alone
    else:  # interleaved picks behind a norm too: gathered in order (interleaved_columns)
        assert rotaries == 2, f"{s}: {rotaries} rotary"
    onnx.checker.check_model(done.model, full_check=True)
    _assert_same_values(model, done.model)


def _assert_left_with_near_miss(model: onnx.ModelProto) -> None:
    done = fuse_quiet(model, exclude=EXCLUDED)
    assert "Softmax" in done.ops and not done.ops_among(ATTENTION), done.ops
    reasons = done.misses_about("attention")
    assert any("expected Transpose 'q_t'" in r and "Concat" in r for r in reasons), reasons
    _assert_same_values(model, done.model)


def test_a_rope_part_of_another_transpose_keeps_the_concat() -> None:
    """The rope part ``Transpose(view(B, S, r, N), [0, 3, 1, 2])``: ``[B, N, S, r]`` as
    the nope part is, but from no head Transpose ``[0, 2, 1, 3]``: not laid out."""
    s = replace(DOTS3, key_norm=False, key_rotary="written")
    query = _query(s)
    at = query.index("qa, qb = Split <axis = -1> (qt, parts)")
    query[at + 1 : at + 1] = [
        "qf = MatMul (x, wq_rope)",
        "qf_r = Reshape (qf, q_flip)",
        "qf_t = Transpose <perm = [0, 3, 1, 2]> (qf_r)",
    ]
    query = [line.replace("(qb, position_ids", "(qf_t, position_ids") for line in query]
    _assert_left_with_near_miss(query_block(s, query))


def test_a_rope_part_mixed_across_heads_keeps_the_concat() -> None:
    """A Softmax over the heads axis of the rope part does not commute with the head
    Transpose (it would need axis 2 after it): the rule leaves the Concat."""
    s = replace(DOTS3, key_norm=False, key_rotary="written")
    query = _query(s)
    query = [line.replace("(qb, position_ids", "(q_mixed, position_ids") for line in query]
    at = query.index("qa, qb = Split <axis = -1> (qt, parts)")
    query.insert(at + 1, "q_mixed = Softmax <axis = 1> (qb)")
    _assert_left_with_near_miss(query_block(s, query))
