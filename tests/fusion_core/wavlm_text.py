"""WavLM's attention block as ``F.multi_head_attention_forward(..., need_weights=True)``
writes it (onnx text): heads folded into the batch straight from the sequence-first
``[S, B, E]`` layout, K^T one Transpose ``[1, 2, 0]``, the scores a rank-3 MatMul, a
position bias ``[B * N, S, S]`` tiled (or expanded) over the batch and perhaps gated per
head by a sigmoid of the query, and the context merged back for out_proj (a Gemm on
``[S * B, E]`` rows). ``block`` builds it; ``feeds`` draws its input."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from tests.fusion_core.decoder_text import graph_model

# the folded q, k, v (``qf``, ``kf``, ``vf``: ``[B * N, S, H]``) turned for the bmm: K^T
# by one Transpose [1, 2, 0]
FOLD_TURNS = [
    "qt = Transpose <perm = [1, 0, 2]> (qf)",
    "kt = Transpose <perm = [1, 2, 0]> (kf)",
    "vt = Transpose <perm = [1, 0, 2]> (vf)",
]
# the plain attention over them, its context turned back to ``ct``: ``[S, B * N, H]``
FOLD_ATTENTION = [
    *FOLD_TURNS,
    "scores = MatMul (qt, kt)",
    "probs = Softmax <axis = -1> (scores)",
    "context = MatMul (probs, vt)",
    "ct = Transpose <perm = [1, 0, 2]> (context)",
]


class Spelling(NamedTuple):
    seq: int  # S, fixed in the graph (the conv feature encoder fixes WavLM's)
    heads: int  # N
    size: int  # H
    scale_on_q: bool  # the scale on q before the bmm (torch), else on the scores
    gated: bool  # the bias gated per head by a sigmoid of the query (WavLM), else plain
    tile: bool  # the bias repeated over the batch by Tile (torch's repeat), else Expand


def _bias(s: Spelling) -> list[str]:
    """``bias`` [B * N, S, S]: a table [1, N, S, S] over the batch, gated or not."""
    over = (
        ["reps = Concat <axis = 0> (batch, ones3)", "tiled = Tile (table, reps)"]
        if s.tile
        else ["reps = Concat <axis = 0> (batch, table_tail)", "tiled = Expand (table, reps)"]
    )
    lines = [*over, "pos3 = Reshape (tiled, fold_scores)"]
    if not s.gated:
        return [*lines, "bias = Identity (pos3)"]
    return [
        *lines,
        "xh = Reshape (x, split_heads)",
        "xht = Transpose <perm = [0, 2, 1, 3]> (xh)",
        "gp = MatMul (xht, wg)",
        "gate = Sigmoid (gp)",
        "gate3 = Reshape (gate, fold_gate)",
        "bias = Mul (gate3, pos3)",
    ]


def block(s: Spelling, seed: int = 0) -> onnx.ModelProto:
    """The block of ``s`` from ``x: [batch, S, E]`` to ``y: [batch, S, E]``."""
    width = s.heads * s.size
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    scale = np.array(s.size**-0.5, np.float32)
    product = (
        ["qs = Mul (qt, scale)", "scores = MatMul (qs, kt)"]
        if s.scale_on_q
        else ["raw = MatMul (qt, kt)", "scores = Mul (raw, scale)"]
    )
    body = [
        "xs = Transpose <perm = [1, 0, 2]> (x)",
        *(f"{p}m = MatMul (xs, w{p})" for p in "qkv"),
        *(f"{p} = Add ({p}m, b{p})" for p in "qkv"),
        *(f"{p}f = Reshape ({p}, fold)" for p in "qkv"),
        *FOLD_TURNS,
        *product,
        "shape = Shape (x)",
        "batch = Slice (shape, zero, one)",
        *_bias(s),
        "biased = Add (scores, bias)",
        "probs = Softmax <axis = -1> (biased)",
        "context = MatMul (probs, vt)",
        "ct = Transpose <perm = [1, 0, 2]> (context)",
        "rows = Reshape (ct, merge)",
        "out = Gemm <transB = 1> (rows, wo, bo)",
        "os = Reshape (out, unfold)",
        "ot = Transpose <perm = [1, 0, 2]> (os)",
        "y = Add (ot, x)",  # the residual
    ]
    ints = {
        "fold": [s.seq, -1, s.size],
        "fold_scores": [-1, s.seq, s.seq],
        "fold_gate": [-1, s.seq, 1],
        "split_heads": [0, s.seq, s.heads, s.size],
        "merge": [-1, width],
        "unfold": [s.seq, -1, width],
        "zero": [0],
        "one": [1],
        "ones3": [1, 1, 1],
        "table_tail": [s.heads, s.seq, s.seq],
    }
    inits = {k: np.array(v, np.int64) for k, v in ints.items()}
    inits |= {f"w{p}": weight(width, width) for p in "qkv"}
    inits |= {f"b{p}": weight(width) for p in "qkv"}
    inits |= {"wo": weight(width, width), "bo": weight(width), "scale": scale}
    inits["table"] = rng.standard_normal((1, s.heads, s.seq, s.seq)).astype(np.float32)
    inits["wg"] = weight(s.size, 1)
    declared = f"float[batch, {s.seq}, {width}]"
    return graph_model([f"{declared} x"], [f"{declared} y"], body, inits)


def feeds(s: Spelling, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (batch, s.seq, s.heads * s.size)
    return {"x": rng.standard_normal(shape).astype(np.float32)}
