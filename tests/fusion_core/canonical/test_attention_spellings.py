"""Generated spellings of a decoder's attention block: each fuses exactly once, exactly.

A generator (hypothesis) writes one causal attention block with ``onnx`` text, drawing
independently how each part is spelled, the ways the families and exporters of issue 24
write them:

* the projections: three MatMuls; GPTBigCode's ``qkv.unsqueeze(1).split(...)`` with
  one KV head ``[B, 1, S, H]`` repeated by repeat_kv; one fused ``query_key_value`` split per head
  (GPT-NeoX: ``[B, S, N, 3H]``, transposed, then sliced on the last axis, by ``Slice``
  or one ``Split``); one fused projection split by heads (Falcon: ``[B, S, N + 2 KV, H]``
  sliced on the heads axis, one KV head by ``Gather``);
* a per-head RMSNorm of q and k between the head split and the Transpose (Qwen3) or
  after the Transpose (Gemma-3, Persimmon);
* the rotary embedding on the whole head, or on its first half with the rest passed
  through and concatenated back (Phi); rotate-half, the pairs ``(x_2i, x_2i+1)`` with
  each angle repeated (Cohere, on the transposed heads), or the two halves rotated with
  one angle per pair (gpt-oss: ``cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)``, the
  halves cut by two Slices or one Split);
* a Reshape of Q to its own shape, computed from shapes at run time (Falcon);
* the scale as a constant on the scores (Mul by ``1 / sqrt(H)`` or Div by ``sqrt(H)``),
  or as ``1 / sqrt(sqrt(H))`` on Q and K^T read from Q's shape (TorchScript's SDPA),
  with the NaN guard after the Softmax;
* on eager scores, Gemma-2's soft-cap ``c * tanh(s / c)`` (Div by c or Mul by 1 / c);
* on eager scores, gpt-oss's attention sinks: a logit per head concatenated as one more
  column, each row's max subtracted, the Softmax, the column dropped;
* the key/value heads: as many as the queries, fewer with repeat_kv (Unsqueeze, Expand,
  Reshape), or one broadcast by the MatMuls (multi-query);
* with or without a KV cache; the heads, head size and batch.

Every block must come out as one attention op (``GroupQueryAttention`` with a cache,
grouped KV heads or sinks, else ``GroupQueryAttention`` or ``MultiHeadAttention``) and two
``RotaryEmbedding``s on the onnxruntime target, and compute what the original computes
(onnxruntime, its optimizations off) on several shapes and on a left-padded batch:
rtol = atol = 1e-5, as in tests/fusion_core/rewriters/test_group_query_attention.py (the
kernels sum in another order; at these sizes outputs differ by about 1e-6).

The example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``, 200 in
``make test-corpus``, which ``.ci/run`` runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.decoder_text import (
    ANGLES,
    CAUSAL,
    MERGE,
    PADDING,
    TEXT_CONSTANTS,
    graph_model,
    kv_cache,
    positions,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 32
# One attention op: GroupQueryAttention for a decoder's (a cache or grouped KV heads),
# MultiHeadAttention for a block with neither (the rewriters choose, and say why).
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention")
ROTARY = "RotaryEmbedding"


@dataclass(frozen=True)
class Spelling:
    heads: int
    kv_heads: int
    size: int
    projection: str  # "separate", "per_head" (GPT-NeoX), "by_heads" (Falcon)
    per_head_split: str  # GPT-NeoX's parts: "slice" or "split"
    qk_norm: bool
    norm_after_transpose: bool  # Gemma-3, Persimmon: the q/k norm on the transposed heads
    partial_rotary: bool  # Phi: the first half of each head rotated, the rest passed on
    interleaved: bool  # Cohere: the pairs (x_2i, x_2i+1) rotated, each angle repeated
    identity_reshape: bool
    sdpa: bool  # the scale split over Q and K^T from Q's shape, and the NaN guard
    scale_by_div: bool  # eager: the scores divided by sqrt(H) rather than times 1 / sqrt(H)
    softcap: float  # eager: c of c * tanh(s / c) on the scores, 0 for none
    softcap_by_mul: bool  # s * (1 / c) rather than s / c into the tanh
    repeat: str  # "none" (as many KV heads), "repeat_kv", "broadcast" (one KV head)
    cache: bool
    # repeat_kv written as Expand (transformers), Tile or Concat of the unsqueezed heads,
    # or a Gather of each query head's KV head (repeat_interleave)
    repeat_by: str = "expand"
    # the mask: Where(allowed, 0, lowest) added to the scores; Where(blocked, lowest, 0)
    # added; masked_fill of the scores themselves, Where(allowed, scores, lowest) (GPT-2,
    # GPT-J, Falcon eager); the float mask (1 - allowed) * lowest added (BERT-era); or
    # "converter": transformers' older AttentionMaskConverter (optimum's Falcon), a Trilu
    # of the lowest float times key > query, the padding written in by a ScatterND
    mask: str = "where"
    # eager: where the scale is, on the scores, on Q's projection (OPT, BART, Whisper:
    # q_proj(x) * scaling) or nowhere (T5: folded into the weights at training)
    scale_at: str = "scores"
    sinks: bool = False  # eager: gpt-oss's attention sinks
    # not interleaved: "rotate_half", its mirror "rotate_half_negated" (nanochat's
    # Concat(x2, -x1): the rotation by minus the angle), or gpt-oss's two halves cut by
    # "halves_slice" or "halves_split"
    rotary: str = "rotate_half"


@st.composite
def spellings(draw) -> Spelling:
    heads = draw(st.sampled_from([2, 4]))
    size = draw(st.sampled_from([8, 16]))
    projection = draw(st.sampled_from(["separate", "per_head", "by_heads", "unsqueezed"]))
    if projection == "per_head":  # one head's q, k and v side by side: as many KV heads
        repeat = "none"
    elif projection == "unsqueezed":  # GPTBigCode: one KV head, repeated by repeat_kv
        repeat = "repeat_kv"
    else:
        repeat = draw(st.sampled_from(["none", "repeat_kv", "broadcast"]))
    kv_heads = {"none": heads, "repeat_kv": heads // 2, "broadcast": 1}[repeat]
    if projection == "unsqueezed":
        kv_heads = 1
    sdpa = draw(st.booleans())  # SDPA cannot soft-cap: transformers runs Gemma-2 eager
    repeat_by = draw(st.sampled_from(["expand", "tile", "concat", "gather"]))
    interleaved = draw(st.booleans())
    halves = ["rotate_half", "rotate_half_negated", "halves_slice", "halves_split"]
    return Spelling(
        heads=heads,
        kv_heads=kv_heads,
        size=size,
        projection=projection,
        per_head_split=draw(st.sampled_from(["slice", "split"])),
        # GPT-NeoX and GPTBigCode have none
        qk_norm=projection in ("separate", "by_heads") and draw(st.booleans()),
        norm_after_transpose=draw(st.booleans()),
        partial_rotary=draw(st.booleans()),
        interleaved=interleaved,
        identity_reshape=draw(st.booleans()),
        sdpa=sdpa,
        scale_by_div=draw(st.booleans()),
        softcap=0.0 if sdpa else draw(st.sampled_from([0.0, 2.0, 5.0])),
        softcap_by_mul=draw(st.booleans()),
        repeat=repeat,
        cache=draw(st.booleans()),
        repeat_by=repeat_by if repeat == "repeat_kv" and projection != "unsqueezed" else "expand",
        mask=draw(
            st.sampled_from(["where", "where_blocked", "masked_fill", "additive", "converter"])
        ),
        scale_at="scores" if sdpa else draw(st.sampled_from(["scores", "projection", "none"])),
        sinks=not sdpa and draw(st.booleans()),  # no SDPA has sinks: gpt-oss runs eager
        rotary="rotate_half" if interleaved else draw(st.sampled_from(halves)),
    )


def _projections(s: Spelling, rng: np.random.Generator, inits: dict) -> list[str]:
    """Lines computing ``qr``, ``kr``, ``vr`` (``[B, S, heads, H]``) from ``x``; for
    GPT-NeoX ``qt``, ``kt``, ``vt`` (already transposed) instead."""
    n, kv, h = s.heads, s.kv_heads, s.size
    if s.projection == "separate":
        body = []
        for p, count in (("q", n), ("k", kv), ("v", kv)):
            inits[f"w{p}"] = rng.standard_normal((HIDDEN, count * h)) * 0.3
            inits[f"{p}_split"] = np.array([0, 0, count, h], np.int64)
            body.append(f"{p}m = MatMul (x, w{p})")
            if p == "q" and s.scale_at == "projection":  # OPT: q_proj(x) * scaling
                body += ["qm_s = Mul (qm, scale)", "qr = Reshape (qm_s, q_split)"]
                continue
            body.append(f"{p}r = Reshape ({p}m, {p}_split)")
        return body
    if s.projection == "per_head":
        inits["wqkv"] = rng.standard_normal((HIDDEN, n * 3 * h)) * 0.3
        inits["qkv_split"] = np.array([0, 0, n, 3 * h], np.int64)
        body = [
            "qkv = MatMul (x, wqkv)",
            "qkv_r = Reshape (qkv, qkv_split)",
            "qkv_t = Transpose <perm = [0, 2, 1, 3]> (qkv_r)",
        ]
        if s.per_head_split == "split":
            inits["parts"] = np.array([h, h, h], np.int64)
            return [*body, "qt, kt, vt = Split <axis = -1> (qkv_t, parts)"]
        for index, p in enumerate("qkv"):
            inits[f"{p}_from"] = np.array([index * h], np.int64)
            inits[f"{p}_to"] = np.array([(index + 1) * h], np.int64)
            body.append(f"{p}t = Slice (qkv_t, {p}_from, {p}_to, axis_last)")
        return body
    if s.projection == "unsqueezed":  # GPTBigCode: qkv.unsqueeze(1).split(..., dim=3)
        inits["wqkv"] = rng.standard_normal((HIDDEN, (n + 2) * h)) * 0.3
        inits["parts"] = np.array([n * h, h, h], np.int64)
        inits["q_heads_tail"] = np.array([n, h], np.int64)
        return [
            "qkv = MatMul (x, wqkv)",
            "qkv_u = Unsqueeze (qkv, axis_1)",
            "qu, kt, vt = Split <axis = 3> (qkv_u, parts)",
            "xs = Shape (x)",
            "xb = Gather <axis = 0> (xs, zero)",
            "xq = Gather <axis = 0> (xs, one)",
            "q_target = Concat <axis = 0> (xb, xq, q_heads_tail)",
            "qr = Reshape (qu, q_target)",
        ]
    total = n + 2 * kv  # by_heads: Falcon's [B, S, N + 2 KV, H]
    inits["wqkv"] = rng.standard_normal((HIDDEN, total * h)) * 0.3
    inits["qkv_split"] = np.array([0, 0, total, h], np.int64)
    inits["heads_axis"] = np.array([2], np.int64)
    body = ["qkv = MatMul (x, wqkv)", "qkv_r = Reshape (qkv, qkv_split)"]
    for p, (first, last) in (("q", (0, n)), ("k", (n, n + kv)), ("v", (n + kv, total))):
        if last - first == 1 and p != "q":  # one head picked by index, as Falcon does
            inits[f"{p}_index"] = np.array([first], np.int64)
            body.append(f"{p}r = Gather <axis = 2> (qkv_r, {p}_index)")
            continue
        inits[f"{p}_from"] = np.array([first], np.int64)
        inits[f"{p}_to"] = np.array([last], np.int64)
        body.append(f"{p}r = Slice (qkv_r, {p}_from, {p}_to, heads_axis)")
    return body


def _norm(
    p: str, source: str, rng: np.random.Generator, s: Spelling, inits: dict, out: str
) -> list[str]:
    """An RMSNorm of each head (over its last axis) of ``source``, into ``out``."""
    inits[f"{p}_gamma"] = rng.uniform(0.5, 1.5, s.size)
    return [
        f"{p}_sq = Pow ({source}, two)",
        f"{p}_ms = ReduceMean <keepdims = 1> ({p}_sq, axis_last)",
        f"{p}_eps = Add ({p}_ms, eps)",
        f"{p}_rms = Sqrt ({p}_eps)",
        f"{p}_unit = Div ({source}, {p}_rms)",
        f"{out} = Mul ({p}_unit, {p}_gamma)",
    ]


def attention_block(s: Spelling, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    n, kv, h = s.heads, s.kv_heads, s.size
    r = h // 2 if s.partial_rotary else h  # the rotated features of each head
    inits: dict[str, np.ndarray] = {
        "inv_freq": 1.0 / (10000 ** (np.arange(0, r, 2) / r)),
        "zero": np.array([0], np.int64),
        "half": np.array([r // 2], np.int64),
        "rotated": np.array([r], np.int64),
        "one": np.array([1], np.int64),
        "two_step": np.array([2], np.int64),
        "pair_shape": np.array([1, 1, 1, 2], np.int64),
        "emb_shape": np.array([0, 0, r], np.int64),
        "rot_shape": np.array([0, 0, 0, r], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "axis_1": np.array([1], np.int64),
        "axis_2": np.array([2], np.int64),
        "axis_last": np.array([-1], np.int64),
        **TEXT_CONSTANTS,
        "column": np.array([-1, 1], np.int64),
        "index_0": np.array(0, np.int64),
        # the index grid of the converter's mask: Range(0, dims[k]) viewed on axis k
        **{f"grid_view_{k}": np.array([-1] + [1] * (3 - k), np.int64) for k in range(4)},
        "index_3": np.array(3, np.int64),
        "two": np.array(2.0, np.float32),
        "one_f": np.array(1.0, np.float32),
        "eps": np.array(1e-6, np.float32),
        "zero_f": np.array(0.0, np.float32),
        # (1 - allowed) * -inf is NaN where allowed: the float mask takes the lowest
        "masked": np.array(
            -np.inf
            if s.sdpa and s.mask not in ("additive", "converter")
            else np.finfo(np.float32).min,
            np.float32,
        ),
        "scale": np.array(h**-0.5, np.float32),
        "root_h": np.array(h**0.5, np.float32),
        "cap": np.array(s.softcap, np.float32),
        "inverse_cap": np.array(1 / s.softcap if s.softcap else 0, np.float32),
        "merge": np.array([0, 0, n * h], np.int64),
        "wo": rng.standard_normal((n * h, HIDDEN)) * 0.3,
    }
    inputs = ["float[batch, seq, 32] x", "int64[batch, seq] position_ids"]
    # the key length named as optimum names it, so shape inference sees the mask's
    # length is the cache's (tests/fusion_core/rewriters/test_group_query_attention.py)
    total = '"past + seq"' if s.cache else "seq"
    inputs.append(f"int64[batch, {total}] attention_mask")
    outputs = ["float[batch, seq, 32] y"]
    body = [
        *ANGLES,
        *(
            [  # repeat_interleave(freqs, 2, -1)
                "freqs_u = Unsqueeze (freqs, axis_last)",
                "freqs_pairs = Expand (freqs_u, pair_shape)",
                "emb = Reshape (freqs_pairs, emb_shape)",
            ]
            if s.interleaved
            else ["emb = Concat <axis = -1> (freqs, freqs)"]
        ),
        "cos = Cos (emb)",
        "sin = Sin (emb)",
        "cos_u = Unsqueeze (cos, axis_1)",
        "sin_u = Unsqueeze (sin, axis_1)",
        *(
            [  # gpt-oss: one angle per pair, [B, 1, S, r / 2]
                "cos_half = Cos (freqs)",
                "sin_half = Sin (freqs)",
                "cos_h = Unsqueeze (cos_half, axis_1)",
                "sin_h = Unsqueeze (sin_half, axis_1)",
            ]
            if s.rotary.startswith("halves")
            else []
        ),
        *_projections(s, rng, inits),
    ]
    if s.projection == "unsqueezed":  # its one KV head is [B, 1, S, H] already
        body.append("qt = Transpose <perm = [0, 2, 1, 3]> (qr)")
    elif s.projection != "per_head":  # GPT-NeoX's parts are transposed already
        for p in "qkv":
            normed = s.qk_norm and p != "v"
            if normed and s.norm_after_transpose:
                body.append(f"{p}t0 = Transpose <perm = [0, 2, 1, 3]> ({p}r)")
                body += _norm(p, f"{p}t0", rng, s, inits, out=f"{p}t")
                continue
            source = f"{p}r"
            if normed:
                body += _norm(p, source, rng, s, inits, out=f"{p}n")
                source = f"{p}n"
            body.append(f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({source})")
    q_heads, k_heads = "qt", "kt"
    if s.identity_reshape:  # Falcon: Q reshaped to [B, N, S, H] from its own shape
        body += [
            f"q_shape = Shape ({q_heads})",
            "q_same = Reshape (" + q_heads + ", q_shape)",
        ]
        q_heads = "q_same"
    for p, heads in (("q", q_heads), ("k", k_heads)):
        source, rotated = heads, f"{p}_emb"
        if s.partial_rotary:  # Phi: cat((rotate(x[..., :r]), x[..., r:]), -1)
            body += [
                f"{p}_part = Slice ({heads}, zero, rotated, axis_last)",
                f"{p}_pass = Slice ({heads}, rotated, end, axis_last)",
            ]
            source, rotated = f"{p}_part", f"{p}_turned"
        if s.rotary.startswith("halves"):  # gpt-oss: cat(x1 * c - x2 * s, x2 * c + x1 * s)
            body += [
                *_halves(p, source, s.rotary),
                f"{rotated} = Concat <axis = -1> ({p}_x1c_x2s, {p}_x2c_x1s)",
            ]
        elif s.interleaved:  # stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
            body += [
                f"{p}_even = Slice ({source}, zero, rotated, axis_last, two_step)",
                f"{p}_odd = Slice ({source}, one, rotated, axis_last, two_step)",
                f"{p}_neg = Neg ({p}_odd)",
                f"{p}_neg_u = Unsqueeze ({p}_neg, axis_last)",
                f"{p}_even_u = Unsqueeze ({p}_even, axis_last)",
                f"{p}_pairs = Concat <axis = -1> ({p}_neg_u, {p}_even_u)",
                f"{p}_rot = Reshape ({p}_pairs, rot_shape)",
            ]
        else:
            negated = s.rotary == "rotate_half_negated"  # Concat(x2, -x1)
            body += [
                f"{p}_lo = Slice ({source}, zero, half, axis_last)",
                f"{p}_hi = Slice ({source}, half, end, axis_last)",
                f"{p}_neg = Neg ({p}_lo)" if negated else f"{p}_neg = Neg ({p}_hi)",
                f"{p}_rot = Concat <axis = -1> ({p}_hi, {p}_neg)"
                if negated
                else f"{p}_rot = Concat <axis = -1> ({p}_neg, {p}_lo)",
            ]
        if not s.rotary.startswith("halves"):
            body += [
                f"{p}_c = Mul ({source}, cos_u)",
                f"{p}_s = Mul ({p}_rot, sin_u)",
                f"{rotated} = Add ({p}_c, {p}_s)",
            ]
        if s.partial_rotary:
            body.append(f"{p}_emb = Concat <axis = -1> ({p}_turned, {p}_pass)")
    cached = kv_cache(s.cache, kv, h, total)
    inputs, outputs, body = inputs + cached.inputs, outputs + cached.outputs, body + cached.body
    key, value = cached.key, cached.value
    for p, source in (("k", key), ("v", value)):
        body += _repeat_kv(s, p, source, inits)
    body += [
        *positions(),
        CAUSAL,
        *PADDING,
        "allowed = And (causal, padding)",
        "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
    ]
    if s.scale_at == "projection" and s.projection != "separate":
        body.append("q_scores = Mul (q_emb, scale)")  # the scale on the rotated heads
    else:
        body.append("q_scores = Identity (q_emb)")
    if s.sdpa:  # TorchScript's SDPA: 1 / sqrt(sqrt(H)) on Q and K^T, from Q's shape
        body += [
            "qe_shape = Shape (q_scores)",
            "head_size = Gather <axis = 0> (qe_shape, index_3)",
            "head_f = Cast <to = 1> (head_size)",
            "root = Sqrt (head_f)",
            "inverse = Div (one_f, root)",
            "root_scale = Sqrt (inverse)",
            "qs = Mul (q_scores, root_scale)",
            "ks = Mul (kT, root_scale)",
            "scores = MatMul (qs, ks)",
            *_masked(s, "scores", "biased"),
            "p = Softmax <axis = -1> (biased)",
            "nan = IsNaN (p)",
            "probs = Where (nan, zero_f, p)",
        ]
    else:
        body.append("qk = MatMul (q_scores, kT)")
        if s.scale_at != "scores":  # on Q already, or nowhere
            body.append("scaled = Identity (qk)")
        else:
            body.append(
                "scaled = Div (qk, root_h)" if s.scale_by_div else "scaled = Mul (qk, scale)"
            )
        if s.softcap:  # Gemma-2: c * tanh(s / c) before the mask
            body += [
                "cap_in = Mul (scaled, inverse_cap)"
                if s.softcap_by_mul
                else "cap_in = Div (scaled, cap)",
                "capped = Tanh (cap_in)",
                "scores = Mul (capped, cap)",
            ]
        else:
            body.append("scores = Identity (scaled)")
        body += _masked(s, "scores", "biased")
        if s.sinks:
            body += _sink_softmax(s, "biased", inits, rng)
        else:
            body.append("probs = Softmax <axis = -1> (biased)")
    body += [
        *MERGE,
    ]
    return graph_model(inputs, outputs, body, inits)


def _halves(p: str, source: str, rotary: str) -> list[str]:
    """gpt-oss's ``first * cos - second * sin`` and ``second * cos + first * sin`` of
    the two halves of ``source`` (``chunk(x, 2, -1)``: two Slices or one Split)."""
    if rotary == "halves_split":
        cut = [f"{p}_x1, {p}_x2 = Split <axis = -1, num_outputs = 2> ({source})"]
    else:
        cut = [
            f"{p}_x1 = Slice ({source}, zero, half, axis_last)",
            f"{p}_x2 = Slice ({source}, half, end, axis_last)",
        ]
    return [
        *cut,
        f"{p}_x1c = Mul ({p}_x1, cos_h)",
        f"{p}_x2s = Mul ({p}_x2, sin_h)",
        f"{p}_x1c_x2s = Sub ({p}_x1c, {p}_x2s)",
        f"{p}_x2c = Mul ({p}_x2, cos_h)",
        f"{p}_x1s = Mul ({p}_x1, sin_h)",
        f"{p}_x2c_x1s = Add ({p}_x2c, {p}_x1s)",
    ]


def _sink_softmax(s: Spelling, biased: str, inits: dict, rng: np.random.Generator) -> list[str]:
    """``probs``: gpt-oss's eager softmax with attention sinks, ``Slice(Softmax(c -
    max(c)), :-1)`` of ``c = Concat(biased, sinks)``, one learned logit per head."""
    inits["sinks"] = rng.standard_normal((1, s.heads, 1, 1)) * 2
    inits["sink_heads"] = np.array([s.heads], np.int64)
    inits["minus_one"] = np.array([-1], np.int64)
    return [
        "sink_batch = Gather <axis = 0> (x_shape, zero)",
        "sink_seq = Unsqueeze (seq_len, zero)",
        "sink_rows = Concat <axis = 0> (sink_batch, sink_heads, sink_seq, one)",
        "sink_column = Expand (sinks, sink_rows)",
        f"with_sinks = Concat <axis = -1> ({biased}, sink_column)",
        "peak = ReduceMax <keepdims = 1> (with_sinks, axis_last)",
        "shifted = Sub (with_sinks, peak)",
        "p_all = Softmax <axis = -1> (shifted)",
        "probs = Slice (p_all, zero, minus_one, axis_last)",
    ]


def _repeat_kv(s: Spelling, p: str, source: str, inits: dict) -> list[str]:
    """``{p}_rep``: the ``[B, N, L, H]`` heads each query head reads, from ``source``'s
    ``[B, KV, L, H]``: query head ``i`` reads KV head ``i // (N / KV)``."""
    n, kv, h = s.heads, s.kv_heads, s.size
    if s.repeat != "repeat_kv":  # as many heads, or one broadcast by the MatMuls
        return [f"{p}_rep = Identity ({source})"]
    group = n // kv
    inits["kv_merge"] = np.array([0, n, -1, h], np.int64)
    if s.repeat_by == "gather":  # torch.repeat_interleave(x, group, dim=1)
        inits["kv_of_head"] = np.arange(n, dtype=np.int64) // group
        return [f"{p}_rep = Gather <axis = 1> ({source}, kv_of_head)"]
    repeated = {
        "expand": f"{p}_e = Expand ({p}_u, repeat)",
        "tile": f"{p}_e = Tile ({p}_u, repeat)",
        "concat": f"{p}_e = Concat <axis = 2> ({', '.join([f'{p}_u'] * group)})",
    }[s.repeat_by]
    inits["repeat"] = np.array([1, 1, group, 1, 1], np.int64)
    return [
        f"{p}_u = Unsqueeze ({source}, axis_2)",
        repeated,
        f"{p}_rep = Reshape ({p}_e, kv_merge)",
    ]


def _masked(s: Spelling, scores: str, out: str) -> list[str]:
    """``out``: ``scores`` with the mask ``allowed`` applied, spelled as ``s.mask`` says."""
    if s.mask == "converter":
        return [*_converter_mask(), f"{out} = Add ({scores}, bias)"]
    if s.mask == "where":
        return ["bias = Where (allowed, zero_f, masked)", f"{out} = Add ({scores}, bias)"]
    if s.mask == "where_blocked":
        return [
            "blocked = Not (allowed)",
            "bias = Where (blocked, masked, zero_f)",
            f"{out} = Add ({scores}, bias)",
        ]
    if s.mask == "masked_fill":
        return [f"{out} = Where (allowed, {scores}, masked)"]
    return [  # "additive": (1 - allowed) * lowest
        "allowed_f = Cast <to = 1> (allowed)",
        "inverted = Sub (one_f, allowed_f)",
        "bias = Mul (inverted, masked)",
        f"{out} = Add ({scores}, bias)",
    ]


def _converter_mask() -> list[str]:
    """``bias``, as transformers' older AttentionMaskConverter builds it (and optimum's
    TorchScript export of Falcon writes it): ``triu(full((S, L), lowest), 1) * (kv_pos >
    q_pos)``, expanded to ``[B, 1, S, L]``, then ``mask[:, :, :, :L] =
    mask.masked_fill(mask + attention_mask == 0, lowest)`` as a ScatterND over the grid
    of every index."""
    lowest = float(np.finfo(np.float32).min)
    lines = [
        "seq_1 = Unsqueeze (seq_len, zero)",
        "total_1 = Unsqueeze (total_len, zero)",
        "square = Concat <axis = 0> (seq_1, total_1)",
        f"full = ConstantOfShape <value = float[1] {{{lowest!r}}}> (square)",
        "above = Trilu <upper = 1> (full, index_1)",
        "q_column = Reshape (q_pos, column)",
        "later = Greater (kv_pos, q_column)",
        "later_f = Cast <to = 1> (later)",
        "causal_f = Mul (above, later_f)",
        "causal_2 = Unsqueeze (causal_f, zero)",
        "causal_3 = Unsqueeze (causal_2, one)",
        "batch_1 = Gather <axis = 0> (x_shape, zero)",
        "four = Concat <axis = 0> (batch_1, one, seq_1, total_1)",
        "expanded = Expand (causal_3, four)",
        "am_f = Cast <to = 1> (mask_u)",
        "summed = Add (expanded, am_f)",
        "empty = Equal (summed, zero_f)",
        "padded = Where (empty, masked, expanded)",
        "grid = Shape (expanded)",
    ]
    parts = []
    for axis in range(4):
        lines += [
            f"n_{axis} = Gather <axis = 0> (grid, index_{axis})",
            f"r_{axis} = Range (start, n_{axis}, step)",
            f"c_{axis} = Reshape (r_{axis}, grid_view_{axis})",
            f"e_{axis} = Expand (c_{axis}, grid)",
            f"u_{axis} = Unsqueeze (e_{axis}, axis_last)",
        ]
        parts.append(f"u_{axis}")
    return [
        *lines,
        f"indices = Concat <axis = -1> ({', '.join(parts)})",
        "bias = ScatterND (expanded, indices, padded)",
    ]


def feeds(s: Spelling, batch: int, seq: int, past: int, *, padded: bool) -> dict:
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    total = past + seq if s.cache else seq
    mask = np.ones((batch, total), np.int64)
    if padded:  # the last batch padded on the left, as batched generation pads
        mask[-1, : min(2, total - 1)] = 0
    found = {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
    }
    if s.cache:
        for name in ("past_key", "past_value"):
            shape = (batch, s.kv_heads, past, s.size)
            found[name] = rng.standard_normal(shape).astype(np.float32)
    return found


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@SPELLINGS
@given(spellings())
@example(  # nanochat's rotation by minus the angle: seen at every budget, not only 200
    Spelling(
        heads=4,
        kv_heads=2,
        size=16,
        projection="separate",
        per_head_split="slice",
        qk_norm=False,
        norm_after_transpose=False,
        partial_rotary=False,
        interleaved=False,
        identity_reshape=False,
        sdpa=True,
        scale_by_div=False,
        softcap=0.0,
        softcap_by_mul=False,
        repeat="repeat_kv",
        cache=False,
        repeat_by="expand",
        mask="where",
        scale_at="scores",
        sinks=False,
        rotary="rotate_half_negated",
    )  # fmt: skip
)
def test_every_spelling_fuses_into_one_group_query_attention_exactly(s: Spelling) -> None:
    model = attention_block(s)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    fused, ops, fused_attention = done.model, done.ops, done.ops_among(ATTENTION)
    reasons = done.misses_about("attention")[:3]
    assert len(fused_attention) == 1, f"{s}: {fused_attention}; {reasons}"
    if s.cache or s.kv_heads != s.heads or s.sinks:
        assert fused_attention == ["GroupQueryAttention"], s
    assert ops.count(ROTARY) == 2, f"{s}: {ops.count(ROTARY)} RotaryEmbedding"
    assert "Softmax" not in ops, s
    # No onnx.checker here: the fused q/k norms are onnxruntime's SimplifiedLayerNormalization,
    # which it registers in the ONNX domain and onnx's checker does not know; the sessions
    # of run_both load and check the model.
    shapes = [(1, 3, 2), (2, 1, 5)] if s.cache else [(1, 3, 0), (2, 4, 0)]
    for batch, seq, past in shapes:
        for padded in (False, True):
            run_both(model, fused, feeds=feeds(s, batch, seq, past, padded=padded), **TOL)


@pytest.mark.parametrize("target", ["onnxruntime", "generic"])
def test_a_tanh_scaled_by_two_values_is_no_softcap(target) -> None:
    """``3 * tanh(s / 2)`` is no ``c * tanh(s / c)``: the block stays, the near miss says
    why (with one c it fuses: the generator above)."""
    s = Spelling(
        heads=4, kv_heads=2, size=8, projection="separate", per_head_split="slice",
        qk_norm=False, norm_after_transpose=False, partial_rotary=False, interleaved=False,
        identity_reshape=False, sdpa=False, scale_by_div=False,
        softcap=2.0, softcap_by_mul=True, repeat="repeat_kv", cache=True,
    )  # fmt: skip
    model = attention_block(s)
    (inverse,) = [t for t in model.graph.initializer if t.name == "inverse_cap"]
    inverse.CopyFrom(onnx.numpy_helper.from_array(np.array(1 / 3, np.float32), "inverse_cap"))
    result = optimize_quiet(model, target=target, upgrade_opset=23 if target == "generic" else None)
    ops = _ops(result.to_proto())
    assert "Softmax" in ops and not set(ops) & {"GroupQueryAttention", "Attention"}
    reasons = [m.reason for m in result.near_misses if m.pattern == "attention"]
    assert any("not a soft-cap c * tanh(s / c)" in r for r in reasons), reasons


def test_a_softcap_becomes_onnx_attention_softcap_on_the_generic_target() -> None:
    s = Spelling(
        heads=4, kv_heads=2, size=8, projection="separate", per_head_split="slice",
        qk_norm=False, norm_after_transpose=False, partial_rotary=False, interleaved=False,
        identity_reshape=False, sdpa=False, scale_by_div=True,
        softcap=2.0, softcap_by_mul=False, repeat="repeat_kv", cache=True,
    )  # fmt: skip
    model = attention_block(s)
    result = optimize_quiet(model, target="generic", upgrade_opset=23)
    fused = result.to_proto()
    (attention,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    caps = [a.f for a in attention.attribute if a.name == "softcap"]
    assert caps == [pytest.approx(2.0, rel=1e-7)]
    for batch, seq, past in [(1, 3, 2), (2, 1, 5)]:
        for padded in (False, True):
            run_both(model, fused, feeds=feeds(s, batch, seq, past, padded=padded), **TOL)
