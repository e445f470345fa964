"""Generated attention blocks whose K^T is merged into a Transpose of another perm and
whose key is written slab by slab in place, in dynamo's ``slice_scatter`` spelling
(HY-V4's latent attention): each fuses exactly once, exactly (canonical rules
``kt_of_heads`` and ``scatter_parts``, then ``concat_heads``).

The key ``[B, N, L, D]`` is built in an empty buffer as ``key[..., lo:hi].copy_(part)``
for its two parts (``k_nope``, cut with the value from a projection of a one-head latent,
and one shared rope head expanded to every head), which torch.export writes as a
ScatterND on the buffer transposed by ``t = [3, 1, 2, 0]`` (indices ``Unsqueeze(Range)``
of the leading axis, updates ``Transpose(part, t)``) and a Transpose back after each
copy; eager attention's ``key.transpose(2, 3)`` is merged into the last Transpose back,
``[3, 1, 0, 2]``. A generator (hypothesis) draws:

* the head count, the two parts' sizes, the value's head size;
* which part is written first (and so which slab comes first);
* the indices as a constant or as a Slice of ``Range(0, D)``;
* a latent cache appended to (the key's length the cache's plus the new tokens) or not;
* the causal and padding mask or none.

Every block must come out as one MultiHeadAttention (a key computed from a latent is no
cache GroupQueryAttention takes) with no Softmax and no ScatterND left, and compute what
the original computes (onnxruntime, its optimizations off) on two shapes, with a
left-padded row: rtol = atol = 1e-5, as test_concat_heads.py (the kernel sums in another
order; at these sizes outputs differ by about 1e-6). Slabs that leave a column of the
buffer unwritten, or overlap, are no Concat: the ScatterNDs stay and the model computes
what it did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, canonical_twice, fuse_quiet, run_both
from tests.fusion_core.decoder_text import (
    CAUSAL,
    PADDING,
    SINK_SOFTMAX,
    TEXT_CONSTANTS,
    graph_model,
    positions,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, LATENT = 32, 16
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention")
TURN = "Transpose <perm = [3, 1, 2, 0]>"  # t: the last axis leads (its own inverse)


@dataclass(frozen=True)
class Keyed:
    heads: int
    nope: int  # the key's part without position
    rope: int  # its one shared rotated head
    value: int  # v's head size
    nope_first: bool  # k_nope written at [0, nope), else at [rope, D)
    constant_indices: bool  # the indices a constant, else Unsqueeze(Slice(Range(0, D)))
    cache: bool  # the latent and rope head appended to a cache
    mask: bool
    gap: int = 0  # columns the second slab leaves unwritten (its part cut short)
    shift: int = 0  # how far the second slab starts before the first ends (an overlap)
    sinks: bool = False  # gpt-oss's attention sinks, as HY-V4 has them


@st.composite
def keyed_blocks(draw) -> Keyed:
    return Keyed(
        heads=draw(st.sampled_from([2, 4])),
        nope=draw(st.sampled_from([4, 8])),
        rope=draw(st.sampled_from([4, 8])),
        value=draw(st.sampled_from([4, 8])),
        nope_first=draw(st.booleans()),
        constant_indices=draw(st.booleans()),
        cache=draw(st.booleans()),
        mask=draw(st.booleans()),
    )


def _inits(s: Keyed, rng: np.random.Generator) -> dict:
    n, d = s.heads, s.nope + s.rope
    return {
        "wq": rng.standard_normal((HIDDEN, n * d)) * 0.3,
        "wc": rng.standard_normal((HIDDEN, LATENT)) * 0.3,
        "wkv": rng.standard_normal((LATENT, n * (s.nope + s.value))) * 0.3,
        "wkr": rng.standard_normal((HIDDEN, s.rope)) * 0.3,
        "wo": rng.standard_normal((n * s.value, HIDDEN)) * 0.3,
        "q_split": np.array([0, 0, n, d], np.int64),
        "kv_split": np.array([0, -1, n, s.nope + s.value], np.int64),
        "kv_parts": np.array([s.nope, s.value], np.int64),
        "rope_heads": np.array([1, n, 1, 1], np.int64),
        "merge": np.array([0, 0, n * s.value], np.int64),
        "width": np.array([d], np.int64),
        "zero": np.array([0], np.int64),
        "three": np.array([3], np.int64),
        "axis_1": np.array([1], np.int64),
        "axis_last": np.array([-1], np.int64),
        "cut": np.array([s.rope - s.gap], np.int64),
        **TEXT_CONSTANTS,
        "head_size": np.array(d, np.int64),
        "zero_f": np.array(0.0, np.float32),
        "lowest": np.array(np.finfo(np.float32).min, np.float32),
        "scale": np.array(d**-0.5, np.float32),
        "sinks": rng.standard_normal((1, n, 1, 1)).astype(np.float32),
        "sink_heads": np.array([n], np.int64),
        "one": np.array([1], np.int64),
        "minus_one": np.array([-1], np.int64),
    }


def _slabs(s: Keyed) -> list[tuple[str, int, int]]:
    """(part, lo, hi) of each copy, in the order written: the second slab starts
    ``shift`` before the first ends and is ``gap`` short (a well-formed key: 0, 0)."""
    first, second = ("k_nope", s.nope), ("k_pe_cut", s.rope - s.gap)
    if not s.nope_first:
        first, second = second, first
    start = first[1] - s.shift
    return [(first[0], 0, first[1]), (second[0], start, start + second[1])]


def _indices(s: Keyed, name: str, lo: int, hi: int, inits: dict) -> list[str]:
    """``{name}``: ``[hi - lo, 1]`` indices ``lo .. hi - 1`` of the leading axis."""
    if s.constant_indices:
        inits[name] = np.arange(lo, hi, dtype=np.int64).reshape(-1, 1)
        return []
    inits[f"{name}_lo"], inits[f"{name}_hi"] = (np.array([v], np.int64) for v in (lo, hi))
    return [
        f"{name}_all = Range (start, head_size, step)",
        f"{name}_cut = Slice ({name}_all, {name}_lo, {name}_hi, zero)",
        f"{name} = Unsqueeze ({name}_cut, axis_last)",
    ]


def _key(s: Keyed, inits: dict) -> list[str]:
    """``kt``: the key built in an empty buffer by dynamo's slice_scatters, K^T merged
    into the last Transpose back."""
    lines = [
        "kn_shape = Shape (k_nope)",
        "kn_lead = Slice (kn_shape, zero, three, zero)",
        "key_shape = Concat <axis = 0> (kn_lead, width)",
        "empty = ConstantOfShape <value = float[1] {0.0}> (key_shape)",
        f"buffer = {TURN} (empty)",
    ]
    data = "buffer"
    for k, (part, lo, hi) in enumerate(_slabs(s)):
        lines += _indices(s, f"slab_{k}", lo, hi, inits)
        lines += [
            f"update_{k} = {TURN} ({part})",
            f"written_{k} = ScatterND ({data}, slab_{k}, update_{k})",
        ]
        if k == 0:  # the copy's Transpose back, and the next copy's Transpose again
            lines += [f"back_{k} = {TURN} (written_{k})", f"again_{k} = {TURN} (back_{k})"]
            data = f"again_{k}"
    return [*lines, "kt = Transpose <perm = [3, 1, 0, 2]> (written_1)"]


def _latent(s: Keyed) -> tuple[list[str], list[str], list[str]]:
    """The lines of ``latent`` and ``rope_one`` (``[B, 1, L, *]``), with the cache's
    inputs and outputs where there is one."""
    lines = [
        "c = MatMul (x, wc)",
        "c_one = Unsqueeze (c, axis_1)",
        "kr = MatMul (x, wkr)",
        "kr_one = Unsqueeze (kr, axis_1)",
    ]
    if not s.cache:
        return [*lines, "latent = Identity (c_one)", "rope_one = Identity (kr_one)"], [], []
    lines += [
        "latent = Concat <axis = 2> (past_latent, c_one)",
        "rope_one = Concat <axis = 2> (past_rope, kr_one)",
    ]
    inputs = [
        f"float[batch, 1, past, {LATENT}] past_latent",
        f"float[batch, 1, past, {s.rope}] past_rope",
    ]
    outputs = [
        f"float[batch, 1, total, {LATENT}] latent",
        f"float[batch, 1, total, {s.rope}] rope_one",
    ]
    return lines, inputs, outputs


def keyed_block(s: Keyed, seed: int = 0) -> onnx.ModelProto:
    inits = _inits(s, np.random.default_rng(seed))
    latent, cache_inputs, cache_outputs = _latent(s)
    past = [
        "past_shape = Shape (past_latent)",
        "past_len = Gather <axis = 0> (past_shape, index_2)",
    ]
    body = [
        *latent,
        *(past if s.cache else ["past_len = Identity (start)"]),
        *positions(),
        "qm = MatMul (x, wq)",
        "qr = Reshape (qm, q_split)",
        "qt = Transpose <perm = [0, 2, 1, 3]> (qr)",
        "kv = MatMul (latent, wkv)",
        "kv_r = Reshape (kv, kv_split)",
        "kv_t = Transpose <perm = [0, 2, 1, 3]> (kv_r)",
        "k_nope, v_heads = Split <axis = -1> (kv_t, kv_parts)",
        "k_pe = Expand (rope_one, rope_heads)",
        "k_pe_cut = Slice (k_pe, zero, cut, axis_last)",
        *_key(s, inits),
        "qk = MatMul (qt, kt)",
        "scaled = Mul (qk, scale)",
    ]
    if s.mask:
        body += [
            CAUSAL,
            *PADDING,
            "allowed = And (causal, padding)",
            "bias = Where (allowed, zero_f, lowest)",
            "biased = Add (scaled, bias)",
        ]
    else:
        body.append("biased = Identity (scaled)")
    body += [
        *(SINK_SOFTMAX if s.sinks else ["probs = Softmax <axis = -1> (biased)"]),
        "context = MatMul (probs, v_heads)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    inputs = ["float[batch, seq, 32] x", "int64[batch, total] attention_mask", *cache_inputs]
    return graph_model(inputs, ["float[batch, seq, 32] y", *cache_outputs], body, inits)


def feeds(s: Keyed, batch: int, seq: int, past: int) -> dict:
    rng = np.random.default_rng(batch * 10 + seq)
    total = seq + (past if s.cache else 0)
    mask = np.ones((batch, total), np.int64)
    mask[-1, : min(2, total - 1)] = 0  # the last row padded on the left
    found = {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "attention_mask": mask,
    }
    if s.cache:
        found["past_latent"] = rng.standard_normal((batch, 1, past, LATENT)).astype(np.float32)
        found["past_rope"] = rng.standard_normal((batch, 1, past, s.rope)).astype(np.float32)
    return found


HY_V4 = Keyed(  # HY-V4's decode step: 8 heads of 32 + 16, a latent cache, the mask
    heads=8, nope=32, rope=16, value=32, nope_first=True, constant_indices=False,
    cache=True, mask=True,
)  # fmt: skip


@SPELLINGS
@given(keyed_blocks())
@example(HY_V4)
def test_every_key_written_in_place_and_transposed_fuses_exactly(s: Keyed) -> None:
    model = keyed_block(s)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    reasons = done.misses_about("attention")[:3]
    assert done.ops_among(ATTENTION) == ["MultiHeadAttention"], f"{s}: {done.ops}; {reasons}"
    assert "Softmax" not in done.ops and "ScatterND" not in done.ops, f"{s}: {done.ops}"
    onnx.checker.check_model(done.model, full_check=True)
    for batch, seq, past in [(1, 1, 4), (2, 3, 5)]:
        run_both(model, done.model, feeds=feeds(s, batch, seq, past), **TOL)


def test_a_column_no_slab_writes_keeps_the_scatters() -> None:
    """The second part cut one column short leaves that column of the key the buffer's
    zeros: no Concat is that key, so the ScatterNDs stay and the model computes what it
    did (the attention may still take the key's heads as they are)."""
    _assert_scatters_stay(replace(HY_V4, heads=2, nope=4, rope=4, value=4, gap=1))


def test_overlapping_slabs_keep_the_scatters() -> None:
    """The second slab starting one column before the first ends writes that column
    twice (the later write wins) and leaves the last one unwritten: no Concat."""
    _assert_scatters_stay(replace(HY_V4, heads=2, nope=4, rope=4, value=4, shift=1))


def _assert_scatters_stay(s: Keyed) -> None:
    model = keyed_block(s)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    assert done.ops.count("ScatterND") == 2, done.ops
    assert "Concat" not in [n.op_type for n in done.model.graph.node if "scatter_parts" in n.name]
    fused_or_missed = done.ops_among(ATTENTION) or done.misses_about("attention")
    assert fused_or_missed, f"neither an attention op nor a near miss: {done.ops}"
    onnx.checker.check_model(done.model, full_check=True)
    for batch, seq, past in [(1, 1, 4), (2, 3, 5)]:
        run_both(model, done.model, feeds=feeds(s, batch, seq, past), **TOL)


def test_the_rules_write_the_key_once_and_again_change_nothing() -> None:
    """K^T split off the written key and the slabs read as their Concat, once each per
    attention; a second run of the canonical form changes nothing (no ping-pong with
    ``transposes_composed``, which composes the copy's two Transposes back to none)."""
    _, done, again, _ = canonical_twice(keyed_block(HY_V4))
    assert done.get("kt_of_heads") == 1 and done.get("scatter_parts") == 1, done
    assert again == 0, done


def test_a_transposed_product_that_is_no_key_keeps_its_transpose() -> None:
    """``Transpose(a @ b, [3, 1, 0, 2])`` read as K^T: nothing proves ``a @ b`` laid out
    by ``[3, 1, 2, 0]`` is a key, so the rule leaves the one Transpose."""
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[1, 2, 3, 4] q, float[4, 2, 5, 6] a, float[6, 1] b) => (float[1, 2, 3, 5] p) {
        ab = MatMul (a, b)
        kt = Transpose <perm = [3, 1, 0, 2]> (ab)
        s = MatMul (q, kt)
        p = Softmax <axis = -1> (s)
    }"""
    _, done, _, _ = canonical_twice(build_model(text))
    assert "kt_of_heads" not in done, done


def test_sinks_over_a_key_computed_from_a_latent_cache_say_why_nothing_fuses() -> None:
    """HY-V4's block: with attention sinks MultiHeadAttention cannot take it, and the key
    (computed from the latent cache, as long as the cache and the new tokens) is no
    cache of keys GroupQueryAttention takes, nor as long as the query: the near miss
    says so, and the model computes what it did."""
    s = replace(HY_V4, heads=2, nope=4, rope=4, value=4, sinks=True)
    model = keyed_block(s)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    assert not done.ops_among(ATTENTION), done.ops
    reasons = done.misses_about("attention")
    assert any("must be as long as the query" in r for r in reasons), reasons
    for batch, seq, past in [(1, 1, 4), (2, 3, 5)]:
        run_both(model, done.model, feeds=feeds(s, batch, seq, past), **TOL)


def test_the_last_round_says_why_when_the_rounds_run_out() -> None:
    """A rewriter that refuses in the last round allowed (here the only one) still
    leaves its near miss in the result: the Softmax left is explained."""
    s = replace(HY_V4, heads=2, nope=4, rope=4, value=4, sinks=True)
    done = fuse_quiet(keyed_block(s), exclude=["qkv_merge", "kv_merge"], max_rounds=1)
    assert "Softmax" in done.ops
    assert any("attention sinks" in r for r in done.misses_about("attention")), done.ops
