"""Generated spellings of an encoder's attention block: each fuses into one attention op
exactly once, and computes what the original computes.

A generator (hypothesis) writes one bidirectional attention block with ``onnx`` text,
drawing independently how each part is spelled, the ways BERT, ViT, T5, Whisper, OPT,
ModernBERT and both torch exporters write them:

* the projections: three MatMuls with biases, or one packed projection viewed as
  ``[B, S, 3, N, H]`` (ModernBERT) with q, k and v picked by ``Split`` and ``Squeeze``,
  by ``Gather`` or by ``Slice`` and ``Squeeze``;
* K^T: one ``Transpose [0, 2, 3, 1]`` of the head split (TorchScript, dynamo's
  optimizer), the key heads swapped by a second Transpose (dynamo unoptimized), or
  dynamo's SDPA ``Reshape [B * N, L, H]``, ``Transpose [0, 2, 1]``, ``Reshape [B, N, H, L]``;
* the scale: on the scores (Mul by ``1 / sqrt(H)`` or Div by ``sqrt(H)``), split over Q
  and K^T (SDPA), on the query projection (OPT, BART, Whisper) or nowhere (T5);
* the mask: none, a padding mask ``Where(keep, 0, lowest)`` added, the float mask
  ``(1 - keep) * lowest`` added (BERT), ``masked_fill`` of the scores, and with or
  without T5's relative position bias added before it;
* the heads in their own axis, or folded into the batch for the products and the
  Softmax (``[B * N, S, H]``, bmm: XGLM, BART-era exports), the finitely masked scores
  clamped at the lowest float (XGLM);
* the heads, head size and batch.

Every block must come out as one attention op on the onnxruntime target
(``MultiHeadAttention``, or com.microsoft's packed ``Attention`` where it takes the three
separate projections; the Q/K/V merges are left out, they have tests of their own) with
no Softmax left, and match the original (onnxruntime, its
optimizations off) at rtol = atol = 1e-5 on two shapes with a padded row.
``AUTOFUSION_SPELLING_EXAMPLES`` sets the example budget (25 in ``make test``, 200 in
``make test-corpus``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 16
LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Spelling:
    heads: int
    projection: str  # "separate", "split", "gather", "slice" (the last three packed)
    kt: str  # "direct", "twice", "sdpa_reshape"
    scale_at: str  # "scores_mul", "scores_div", "split", "projection", "none"
    mask: str  # "none", "where", "additive", "masked_fill"
    position_bias: bool  # T5: a per-head bias added before the mask
    # the heads folded into the batch for the products and the Softmax ([B * N, S, H],
    # bmm: XGLM and BART-era exports, the query projection scaled or nothing), the mask
    # added on the unfolded scores and clamped at the lowest float (XGLM)
    in_batch: bool = False
    # bmm: the probabilities unfolded and folded again after the Softmax (XGLM's
    # attention weights as the model returns them)
    probs_unfolded: bool = False


@st.composite
def spellings(draw) -> Spelling:
    kt = draw(st.sampled_from(["direct", "twice", "sdpa_reshape"]))
    projection = draw(st.sampled_from(["separate", "split", "gather", "slice"]))
    scale_at = draw(st.sampled_from(["scores_mul", "scores_div", "split", "projection", "none"]))
    if scale_at == "projection" and projection != "separate":
        scale_at = "scores_mul"  # a packed projection is scaled on its q part: "split"
    mask = draw(st.sampled_from(["none", "where", "additive", "masked_fill"]))
    in_batch = draw(st.booleans())
    if in_batch:  # bmm: the scale before the fold, on the projection, or none
        scale_at = "projection" if projection == "separate" else "none"
    return Spelling(
        heads=draw(st.sampled_from([2, 4])),
        projection=projection,
        kt=kt,
        scale_at=scale_at,
        mask=mask,
        # T5 adds its position bias with the mask; without a mask it is the one bias
        position_bias=mask != "none" and draw(st.booleans()),
        in_batch=in_batch,
        probs_unfolded=in_batch and draw(st.booleans()),
    )


def _heads(s: Spelling, rng: np.random.Generator, inits: dict) -> list[str]:
    """Lines computing ``qh``, ``kh``, ``vh``: ``[B, S, N, H]`` head splits."""
    n, h = s.heads, HIDDEN // s.heads
    inits["split"] = np.array([0, 0, n, h], np.int64)
    if s.projection == "separate":
        body = []
        for p in "qkv":
            inits[f"w{p}"] = rng.standard_normal((HIDDEN, HIDDEN)) * 0.3
            inits[f"b{p}"] = rng.standard_normal(HIDDEN) * 0.1
            body += [f"{p}m = MatMul (x, w{p})", f"{p}a = Add ({p}m, b{p})"]
            if p == "q" and s.scale_at == "projection":  # Whisper: q_proj(x) * scaling
                body.append("qa_s = Mul (qa, scale)")
                body.append("qh = Reshape (qa_s, split)")
                continue
            body.append(f"{p}h = Reshape ({p}a, split)")
        return body
    inits["wqkv"] = rng.standard_normal((HIDDEN, 3 * HIDDEN)) * 0.3
    inits["view"] = np.array([0, 0, 3, n, h], np.int64)
    inits["parts_axis"] = np.array([2], np.int64)
    body = ["qkv = MatMul (x, wqkv)", "qkv_v = Reshape (qkv, view)"]
    if s.projection == "split":
        return [
            *body,
            "qp, kp, vp = Split <axis = 2, num_outputs = 3> (qkv_v)",
            *[f"{p}h = Squeeze ({p}p, parts_axis)" for p in "qkv"],
        ]
    for index, p in enumerate("qkv"):
        inits[f"{p}_index"] = np.array(index, np.int64)
        inits[f"{p}_from"] = np.array([index], np.int64)
        inits[f"{p}_to"] = np.array([index + 1], np.int64)
        if s.projection == "gather":
            body.append(f"{p}h = Gather <axis = 2> (qkv_v, {p}_index)")
        else:
            body += [
                f"{p}p = Slice (qkv_v, {p}_from, {p}_to, parts_axis)",
                f"{p}h = Squeeze ({p}p, parts_axis)",
            ]
    return body


def _kt(s: Spelling, inits: dict) -> list[str]:
    """``kT``: ``[B, N, H, L]`` from ``kh``."""
    if s.kt == "direct":
        return ["kT = Transpose <perm = [0, 2, 3, 1]> (kh)"]
    body = ["kt = Transpose <perm = [0, 2, 1, 3]> (kh)"]
    if s.kt == "twice":
        return [*body, "kT = Transpose <perm = [0, 1, 3, 2]> (kt)"]
    n, h = s.heads, HIDDEN // s.heads  # dynamo's SDPA: through [B * N, L, H]
    inits["flat"] = np.array([-1, 5, h], np.int64)
    inits["unflat_tail"] = np.array([n, h, -1], np.int64)
    inits["first"] = np.array([0], np.int64)
    inits["one"] = np.array([1], np.int64)
    return [
        *body,
        "k_flat = Reshape (kt, flat)",
        "k_swap = Transpose <perm = [0, 2, 1]> (k_flat)",
        "k_shape = Shape (kt)",
        "k_batch = Slice (k_shape, first, one)",
        "unflat = Concat <axis = 0> (k_batch, unflat_tail)",
        "kT = Reshape (k_swap, unflat)",
    ]


def _scores(s: Spelling) -> list[str]:
    """``scaled``: the scaled scores from ``qt`` and ``kT``."""
    if s.scale_at == "split":  # SDPA: sqrt of the scale on each side
        return [
            "qs = Mul (qt, root_scale)",
            "ks = Mul (kT, root_scale)",
            "scaled = MatMul (qs, ks)",
        ]
    body = ["qk = MatMul (qt, kT)"]
    if s.scale_at == "scores_mul":
        return [*body, "scaled = Mul (qk, scale)"]
    if s.scale_at == "scores_div":
        return [*body, "scaled = Div (qk, root_h)"]
    return [*body, "scaled = Identity (qk)"]  # on the projection already, or nowhere


def _in_batch(s: Spelling, inits: dict) -> list[str]:
    """``context``: ``[B, N, S, H]``, with the products and the Softmax over ``[B * N, S,
    H]`` as bmm writes them; the scores unfolded for the mask (and clamped, XGLM)."""
    n, h = s.heads, HIDDEN // s.heads
    inits["fold"] = np.array([-1, 5, h], np.int64)
    inits["fold_scores"] = np.array([-1, 5, 5], np.int64)
    inits["unfold_tail"] = np.array([n, 5, 5], np.int64)
    inits["unfold_context_tail"] = np.array([n, 5, h], np.int64)
    inits["batch_axis"] = np.array([0], np.int64)
    body = [
        "kt = Transpose <perm = [0, 2, 1, 3]> (kh)",
        "q3 = Reshape (qt, fold)",
        "k3 = Reshape (kt, fold)",
        "v3 = Reshape (vt, fold)",
        "kT3 = Transpose <perm = [0, 2, 1]> (k3)",
        "scores3 = MatMul (q3, kT3)",
        "x_shape = Shape (x)",
        "batch = Gather (x_shape, batch_axis)",
        "unfold = Concat <axis = 0> (batch, unfold_tail)",
        "scaled = Reshape (scores3, unfold)",
        *_masked(s),
    ]
    clamped = "masked"
    if s.mask == "where":  # XGLM: its finite Where mask, which the clamp cannot change
        body.append("clamped = Max (masked, lowest)")
        clamped = "clamped"
    return [
        *body,
        f"masked3 = Reshape ({clamped}, fold_scores)",
        "softmax3 = Softmax <axis = -1> (masked3)",
        *(
            ["probs4 = Reshape (softmax3, unfold)", "probs3 = Reshape (probs4, fold_scores)"]
            if s.probs_unfolded
            else ["probs3 = Identity (softmax3)"]
        ),
        "context3 = MatMul (probs3, v3)",
        "unfold_context = Concat <axis = 0> (batch, unfold_context_tail)",
        "context = Reshape (context3, unfold_context)",
    ]


def _masked(s: Spelling) -> list[str]:
    """``masked``: the scores with the position bias and the padding mask."""
    body, scores = [], "scaled"
    if s.position_bias:
        body.append("positioned = Add (scaled, position)")
        scores = "positioned"
    keep = ["keep_u = Unsqueeze (attention_mask, pad_axes)", "keep = Cast <to = 9> (keep_u)"]
    if s.mask == "none":
        return [f"masked = Identity ({scores})"]
    if s.mask == "where":
        return [
            *keep,
            "bias = Where (keep, zero_f, lowest)",
            *body,
            f"masked = Add ({scores}, bias)",
        ]
    if s.mask == "additive":  # BERT: (1 - mask) * lowest
        return [
            "keep_u = Unsqueeze (attention_mask, pad_axes)",
            "keep_f = Cast <to = 1> (keep_u)",
            "inverted = Sub (one_f, keep_f)",
            "bias = Mul (inverted, lowest)",
            *body,
            f"masked = Add ({scores}, bias)",
        ]
    return [*keep, *body, f"masked = Where (keep, {scores}, lowest)"]  # masked_fill


def attention_block(s: Spelling, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    n, h = s.heads, HIDDEN // s.heads
    inits: dict[str, np.ndarray] = {
        "scale": np.array(h**-0.5, np.float32),
        "root_h": np.array(h**0.5, np.float32),
        "root_scale": np.array(h**-0.25, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "one_f": np.array(1.0, np.float32),
        "lowest": np.array(LOWEST, np.float32),
        "pad_axes": np.array([1, 2], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "wo": rng.standard_normal((HIDDEN, HIDDEN)) * 0.3,
        # T5's relative position bias for 5 positions, one row per head
        "position": rng.standard_normal((1, n, 5, 5)) * 0.5,
    }
    heads = [
        *_heads(s, rng, inits),
        "qt = Transpose <perm = [0, 2, 1, 3]> (qh)",
        "vt = Transpose <perm = [0, 2, 1, 3]> (vh)",
    ]
    if s.in_batch:
        attention = _in_batch(s, inits)
    else:
        attention = [
            *_kt(s, inits),
            *_scores(s),
            *_masked(s),
            "probs = Softmax <axis = -1> (masked)",
            "context = MatMul (probs, vt)",
        ]
    body = [
        *heads,
        *attention,
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    inputs = [f"float[batch, 5, {HIDDEN}] x"]
    if s.mask != "none":
        inputs.append("int64[batch, 5] attention_mask")
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({", ".join(inputs)}) => (float[batch, 5, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def feeds(s: Spelling, batch: int) -> dict:
    rng = np.random.default_rng(batch)
    found = {"x": rng.standard_normal((batch, 5, HIDDEN)).astype(np.float32)}
    if s.mask != "none":
        mask = np.ones((batch, 5), np.int64)
        mask[-1, 3:] = 0  # the last row padded on the right
        found["attention_mask"] = mask
    return found


@SPELLINGS
@given(spellings())
@example(  # heads folded into the batch around a Softmax whose output is unfolded again
    Spelling(2, "separate", "direct", "projection", "none", False, True, True)
)
def test_every_encoder_spelling_fuses_into_one_attention_exactly(s: Spelling) -> None:
    model = attention_block(s)
    exclude = ["qkv_merge", "qkv_bias_merge", "kv_merge", "kv_bias_merge"]
    done = fuse_quiet(model, exclude=exclude)
    fused, ops = done.model, done.ops
    attention = done.ops_among(("MultiHeadAttention", "Attention"))
    assert len(attention) == 1, f"{s}: {ops}; {done.misses_about('attention')[:3]}"
    assert "Softmax" not in ops, s
    for batch in (1, 3):
        run_both(model, fused, feeds=feeds(s, batch), **TOL)
