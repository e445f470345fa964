"""Generated attention blocks whose K^T is written over the heads folded into the batch,
``Reshape(Transpose(Reshape(k, [B * N, L, H]), [0, 2, 1]), [B, N, H, L])`` (MiniMax-M3's
decode step for any number of new tokens): each fuses exactly once, exactly (canonical
rule ``kt_of_folded_heads``, or ``kt_by_reshape`` where the inferred dims prove it).

A generator (hypothesis) draws:

* the query and key/value head counts (repeat_kv before K^T where they differ) and the
  head size;
* repeat_kv's targets read from the keys' Shape, or computed from the inputs' sizes
  with the repeated key's shape declared as torch.export declares it (its length ``past
  + seq``, where onnxruntime's inference names the merge's length after the mask: the
  labels differ, as in MiniMax-M3's graph, and ``kt_by_reshape`` proves nothing);
* the merge target: MiniMax's ``Concat(-1, Shape(k)[-2:-1], Shape(k)[-1:])``, the rows
  as ``Shape(k)[0:1] * N`` with the last size a constant, or all constants;
* the split target: MiniMax's ``Concat(Shape(k)[:-2], Shape(k)[-1:], Shape(k)[-2:-1])``,
  ``[B, -1, H, L]``, ``[-1, N, H, L]`` (its ``N`` a 0 that copies the Transpose's ``H``
  where the two are equal), or all constants;
* constants only where the model's sizes are fixed (its inputs declare numbers);
* the scale: SDPA's split over Q and K^T (MiniMax's), on the scores, or none;
* a KV cache (the key as long as the cache and the new tokens) and the causal and
  padding mask, or not.

Every block must come out as one attention op with no Softmax left and compute what the
original computes (onnxruntime, its optimizations off) on two shapes: rtol = atol = 1e-5,
as test_key_perms.py (the fused kernel sums in another order; the rule itself is exact:
test_folded_key_transpose_stays.py, with the merges and splits that are not the key's
swap and must stay).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.decoder_text import (
    CAUSAL,
    PADDING,
    TEXT_CONSTANTS,
    graph_model,
    padded_feeds,
    positions,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 32
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention")
STATIC = (2, 3, 4)  # batch, seq, past of a model whose inputs declare numbers


@dataclass(frozen=True)
class Folded:
    heads: int
    kv_heads: int  # fewer than heads: repeat_kv before K^T
    size: int
    merge: str  # "minimax", "rows", "constant"
    split: str  # "minimax", "lead_rest", "rest_heads", "constant"
    scale: str  # "split" (SDPA's, over Q and K^T), "scores", "none"
    cache: bool
    mask: bool
    static: bool  # the inputs declare numbers (STATIC): constant targets
    exported: bool = True  # repeat_kv's targets computed from the inputs' sizes


@st.composite
def folded_blocks(draw) -> Folded:
    heads = draw(st.sampled_from([2, 4]))
    static = draw(st.booleans())
    spelled = ["minimax", "rows", *(["constant"] if static else [])]
    return Folded(
        heads=heads,
        kv_heads=draw(st.sampled_from([1, heads // 2, heads])),
        size=draw(st.sampled_from([4, 8])),
        merge=draw(st.sampled_from(spelled)),
        split=draw(st.sampled_from(["minimax", "lead_rest", "rest_heads", *spelled[2:]])),
        scale=draw(st.sampled_from(["split", "scores", "none"])),
        cache=draw(st.booleans()),
        mask=draw(st.booleans()),
        static=static,
        exported=draw(st.booleans()),
    )


def _inits(s: Folded, rng: np.random.Generator) -> dict:
    n, kv, h = s.heads, s.kv_heads, s.size
    batch, seq, past = STATIC
    total = seq + past * s.cache
    return {
        "wq": rng.standard_normal((HIDDEN, n * h)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, kv * h)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, kv * h)) * 0.3,
        "wo": rng.standard_normal((n * h, HIDDEN)) * 0.3,
        "q_split": np.array([0, 0, n, h], np.int64),
        "kv_split": np.array([0, 0, kv, h], np.int64),
        "merge": np.array([0, 0, n * h], np.int64),
        "group": np.array([n // kv], np.int64),
        "rep_target": np.array([0, n, -1, h], np.int64),
        "axis_2": np.array([2], np.int64),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "three": np.array([3], np.int64),
        "four": np.array([4], np.int64),
        "kv_count": np.array([kv], np.int64),
        "minus_one": np.array([-1], np.int64),
        "minus_two": np.array([-2], np.int64),
        "end": np.array([2**63 - 1], np.int64),
        "heads": np.array([n], np.int64),
        "heads_or_zero": np.array([0 if n == h else n], np.int64),  # 0 copies H where N == H
        "size": np.array([h], np.int64),
        "fold_constant": np.array([batch * n, total, h], np.int64),
        "split_constant": np.array([batch, n, h, total], np.int64),
        **TEXT_CONSTANTS,
        "zero_f": np.array(0.0, np.float32),
        "lowest": np.array(np.finfo(np.float32).min, np.float32),
        "root_scale": np.array(h**-0.25, np.float32),
        "scale": np.array(h**-0.5, np.float32),
    }


# the key's Shape and its parts the targets read
SHAPE_READS = [
    "k_shape = Shape (k)",
    "k_lead = Slice (k_shape, zero, minus_two)",
    "k_batch = Slice (k_shape, zero, one)",
    "k_len = Slice (k_shape, minus_two, minus_one)",
    "k_size = Slice (k_shape, minus_one, end)",
]
MERGES = {
    "minimax": ["fold = Concat <axis = 0> (minus_one, k_len, k_size)"],
    "rows": ["rows = Mul (k_batch, heads)", "fold = Concat <axis = 0> (rows, k_len, size)"],
    "constant": ["fold = Identity (fold_constant)"],
}
SPLITS = {
    "minimax": ["unfold = Concat <axis = 0> (k_lead, k_size, k_len)"],
    "lead_rest": ["unfold = Concat <axis = 0> (k_batch, minus_one, size, k_len)"],
    "rest_heads": ["unfold = Concat <axis = 0> (minus_one, heads_or_zero, k_size, k_len)"],
    "constant": ["unfold = Identity (split_constant)"],
    # the negative cases, each turned back to [B, N, H, L] after the split so the model
    # runs at every size (another layout of the same elements: not the key's swap)
    "lead_swapped": [
        "unfold = Concat <axis = 0> (heads, k_batch, k_size, k_len)",
        "kt_raw = Transpose <perm = [1, 0, 2, 3]> (kt_split)",
    ],
    "tail_swapped": [
        "unfold = Concat <axis = 0> (k_lead, k_len, k_size)",
        "kt_raw = Transpose <perm = [0, 1, 3, 2]> (kt_split)",
    ],
}
MERGES["other_axes"] = [  # [B, N * L, H]: the heads merged with the length
    "spread = Mul (k_len, heads)",
    "fold = Concat <axis = 0> (k_batch, spread, k_size)",
]


def _key(s: Folded) -> list[str]:
    """``k``: the key heads (after the cache), repeated to ``heads`` by repeat_kv's
    Unsqueeze, Expand and Reshape where fewer: their targets read from the keys' Shape,
    or computed from the inputs' sizes as torch.export writes them (``exported``: the
    length ``past + seq``, the Reshape allowzero 1, as MiniMax-M3's)."""
    if s.kv_heads == s.heads:
        return ["k = Identity (keys)", "v = Identity (values)"]
    lines = ["in_shape = Shape (x)", "in_batch = Slice (in_shape, zero, one)"]
    if s.exported:
        lines += ["in_seq = Slice (in_shape, one, two)"]
        lines += (  # as scalars (torch's sym_size), made [1] again
            [
                "cached = Shape (past_key)",
                "cached_len = Slice (cached, two, three)",
                "past_n = Squeeze (cached_len)",
                "seq_n = Squeeze (in_seq)",
                "sum_n = Add (past_n, seq_n)",
                "key_len = Reshape (sum_n, minus_one)",
            ]
            if s.cache
            else ["key_len = Identity (in_seq)"]
        )
    for name, source in (("k", "keys"), ("v", "values")):
        if s.exported:
            lines += [
                f"{name}_grid = Concat <axis = 0> (in_batch, kv_count, group, key_len, size)",
                f"{name}_target = Concat <axis = 0> (in_batch, heads, key_len, size)",
            ]
        else:
            lines += [
                f"{name}_shape_kv = Shape ({source})",
                f"{name}_two = Slice ({name}_shape_kv, zero, two)",
                f"{name}_rest = Slice ({name}_shape_kv, two, four)",
                f"{name}_grid = Concat <axis = 0> ({name}_two, group, {name}_rest)",
                f"{name}_target = Identity (rep_target)",
            ]
        lines += [
            f"{name}_one = Unsqueeze ({source}, axis_2)",
            f"{name}_wide = Expand ({name}_one, {name}_grid)",
            f"{name} = Reshape <allowzero = {int(s.exported)}> ({name}_wide, {name}_target)",
        ]
    return lines


def _kt(s: Folded) -> list[str]:
    """``kt``: K^T over the heads folded into the batch (scaled where SDPA splits it)."""
    split, *after = SPLITS[s.split]
    lines = [*SHAPE_READS, *MERGES[s.merge], split]
    lines += [
        "k3 = Reshape (k, fold)",
        "kt3 = Transpose <perm = [0, 2, 1]> (k3)",
        "kt_split = Reshape (kt3, unfold)",
        *(after or ["kt_raw = Identity (kt_split)"]),
    ]
    if s.scale == "split":
        return [*lines, "kt = Mul (kt_raw, root_scale)", "qs = Mul (qt, root_scale)"]
    return [*lines, "kt = Identity (kt_raw)", "qs = Identity (qt)"]


def _cache(s: Folded) -> tuple[list[str], list[str], list[str]]:
    """(lines, inputs, outputs): ``keys``/``values`` ``[B, KV, L, H]``, ``past_len``."""
    if not s.cache:
        return (
            ["keys = Identity (kh)", "values = Identity (vh)", "past_len = Identity (start)"],
            [],
            [],
        )
    b, _, past = _dims(s)
    lines = [
        "keys = Concat <axis = 2> (past_key, kh)",
        "values = Concat <axis = 2> (past_value, vh)",
        "past_shape = Shape (past_key)",
        "past_len = Gather <axis = 0> (past_shape, index_2)",
    ]
    kv, h, total = s.kv_heads, s.size, _total(s)
    inputs = [f"float[{b}, {kv}, {past}, {h}] past_{p}" for p in ("key", "value")]
    outputs = [f"float[{b}, {kv}, {total}, {h}] {p}" for p in ("keys", "values")]
    return lines, inputs, outputs


def _dims(s: Folded) -> tuple:
    return STATIC if s.static else ("batch", "seq", "past")


def _total(s: Folded) -> int | str:
    """The keys' length as the inputs declare it (the mask's)."""
    if s.static:
        return STATIC[1] + STATIC[2] * s.cache
    return "total" if s.cache else "seq"


def folded_block(s: Folded, seed: int = 0) -> onnx.ModelProto:
    """The block, its mask (where it has one) built before the key is repeated, as
    torch.export orders it; with ``exported``, the key's shape declared as torch.export
    declares it (its length ``past + seq``), so the merge's inferred length is another
    symbol than the key's, as in MiniMax-M3's graph."""
    cache, cache_inputs, cache_outputs = _cache(s)
    mask = [*positions(), CAUSAL, *PADDING, "allowed = And (causal, padding)"]
    body = [
        *(f"{p}m = MatMul (x, w{p})" for p in "qkv"),
        "qr = Reshape (qm, q_split)",
        "qt = Transpose <perm = [0, 2, 1, 3]> (qr)",
        "kr = Reshape (km, kv_split)",
        "kh = Transpose <perm = [0, 2, 1, 3]> (kr)",
        "vr = Reshape (vm, kv_split)",
        "vh = Transpose <perm = [0, 2, 1, 3]> (vr)",
        *cache,
        *(mask if s.mask else []),
        *_key(s),
        *_kt(s),
        "qk = MatMul (qs, kt)",
        f"scaled = {'Mul (qk, scale)' if s.scale == 'scores' else 'Identity (qk)'}",
    ]
    if s.mask:
        body += ["bias = Where (allowed, zero_f, lowest)", "biased = Add (scaled, bias)"]
    else:
        body.append("biased = Identity (scaled)")
    body += [
        "probs = Softmax <axis = -1> (biased)",
        "context = MatMul (probs, v)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    b, seq, _ = _dims(s)
    inputs = [f"float[{b}, {seq}, {HIDDEN}] x", f"int64[{b}, {_total(s)}] attention_mask"]
    inits = _inits(s, np.random.default_rng(seed))
    out = [f"float[{b}, {seq}, {HIDDEN}] y", *cache_outputs]
    model = graph_model([*inputs, *cache_inputs], out, body, inits)
    if s.exported and not s.static:  # torch.export's shapes on the repeated key and value
        length = "past + seq" if s.cache else "seq"
        model.graph.value_info.extend(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)
            for name, dims in (("k", ["batch", s.heads, length, s.size]),)
        )
    return model


def feeds(s: Folded, batch: int, seq: int, past: int) -> dict:
    """``x``, the mask (the last row padded on the left) and the cache where there is one."""
    cache = (s.kv_heads, s.size) if s.cache else None
    return padded_feeds(
        (batch, seq, past), "last", hidden=HIDDEN, cache=cache, seed=batch * 10 + seq
    )


def shapes_run(s: Folded) -> list[tuple[int, int, int]]:
    return [STATIC] if s.static else [(1, 1, 4), (3, 2, 5)]


MINIMAX = Folded(  # MiniMax-M3's decode step: 8 heads of 32 over 2, repeat_kv, SDPA's scale
    heads=8, kv_heads=2, size=32, merge="minimax", split="minimax", scale="split",
    cache=True, mask=True, static=False,
)  # fmt: skip


@SPELLINGS
@given(folded_blocks())
@example(MINIMAX)
def test_every_folded_key_transpose_fuses_exactly_once(s: Folded) -> None:
    model = folded_block(s)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    reasons = done.misses_about("attention")[:3]
    assert len(done.ops_among(ATTENTION)) == 1, f"{s}: {done.ops}; {reasons}"
    assert "Softmax" not in done.ops, f"{s}: {done.ops}"
    onnx.checker.check_model(done.model, full_check=True)
    for shape in shapes_run(s):
        run_both(model, done.model, feeds=feeds(s, *shape), **TOL)
