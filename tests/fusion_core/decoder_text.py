"""Lines of onnx text every hand-written decoder attention block in the tests shares:
its KV cache and the positions its causal mask compares (``onnx.parser`` syntax), and
the initializers they name (``TEXT_CONSTANTS``). The block's ``x``, new key and value
heads and ``attention_mask`` are each test's own."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx

from autofusion.fusion_core.testing import build_model

# what the lines below read: a position range's start and step, the sequence and cache
# lengths' axes, and the axes that make the positions and the padding broadcast
TEXT_CONSTANTS = {
    "start": np.array(0, np.int64),
    "step": np.array(1, np.int64),
    "index_1": np.array(1, np.int64),
    "index_2": np.array(2, np.int64),
    "axes_kv": np.array([0, 1, 2], np.int64),
    "axes_q": np.array([0, 1, 3], np.int64),
    "axes_pad": np.array([1, 2], np.int64),
}

# the index constants a rotary of one gathered table reads (RoFormer's stacked copies:
# tests/fusion_core/rewriters/test_rotary_stacked_tables.py, test_rotary_shared_positions.py)
PICK_CONSTANTS = {
    "axes_0_1": np.array([0, 1], np.int64),
    "zero": np.array([0], np.int64),
    "one": np.array([1], np.int64),
    "two": np.array([2], np.int64),
    "last": np.array([-1], np.int64),
    "end": np.array([2**62], np.int64),
    "zero_scalar": np.array(0, np.int64),
    "one_scalar": np.array(1, np.int64),
}

# the context of ``probs`` and ``v_rep``, its heads merged and projected by ``wo``
MERGE = [
    "context = MatMul (probs, v_rep)",
    "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
    "merged = Reshape (ct, merge)",
    "y = MatMul (merged, wo)",
]
CAUSAL = "causal = LessOrEqual (kv_u, q_u)"  # a key at or before its query
# the rotary angles of the position ids, ``freqs`` [B, S, r/2] (reads ``inv_freq``)
ANGLES = [
    "pos = Cast <to = 1> (position_ids)",
    "pos_u = Unsqueeze (pos, axis_last)",
    "freqs = Mul (pos_u, inv_freq)",
]
# rotate_half's tables ``cos_u``/``sin_u`` [B, 1, S, r] of any angles ``freqs`` [B, S, r/2]
# (a block whose angles come from elsewhere, e.g. Range(0, S), reads these alone): the
# angles repeated over both halves
FREQ_TABLES = [
    "emb = Concat <axis = -1> (freqs, freqs)",
    "cos = Cos (emb)",
    "sin = Sin (emb)",
    "cos_u = Unsqueeze (cos, axis_1)",
    "sin_u = Unsqueeze (sin, axis_1)",
]
HALF_TABLES = [*ANGLES, *FREQ_TABLES]  # the tables of the position ids' angles
PADDING = ["mask_u = Unsqueeze (attention_mask, axes_pad)", "padding = Cast <to = 9> (mask_u)"]
# gpt-oss's attention sinks on ``biased`` scores: one more column, the row's max subtracted,
# the column dropped again (reads x_shape, seq_len, sinks, sink_heads and TEXT_CONSTANTS')
SINK_SOFTMAX = [
    "batch_1 = Gather <axis = 0> (x_shape, zero)",
    "seq_1 = Unsqueeze (seq_len, zero)",
    "sink_rows = Concat <axis = 0> (batch_1, sink_heads, seq_1, one)",
    "sink_column = Expand (sinks, sink_rows)",
    "combined = Concat <axis = -1> (biased, sink_column)",
    "peak = ReduceMax <keepdims = 1> (combined, axis_last)",
    "shifted = Sub (combined, peak)",
    "both = Softmax <axis = -1> (shifted)",
    "probs = Slice (both, zero, minus_one, axis_last)",
]


class Cache(NamedTuple):
    inputs: list[str]  # the graph inputs it adds
    outputs: list[str]  # the graph outputs it adds
    body: list[str]  # its lines, ``past_len`` among them
    key: str  # what the attention reads as keys and values
    value: str


def kv_cache(
    cache: bool, kv_heads: int, size: int, total: str, new: tuple[str, str] = ("k_emb", "vt")
) -> Cache:
    """``past_len`` and, with a ``cache``, the past and present keys and values: the new
    ``[B, kv_heads, S, size]`` heads ``new`` appended to ``past_key``/``past_value``
    (present ``[batch, kv_heads, total, size]``); without one, the new heads alone."""
    if not cache:
        return Cache([], [], ["past_len = Identity (start)"], *new)
    kinds = ("key", "value")
    return Cache(
        [f"float[batch, {kv_heads}, past, {size}] past_{p}" for p in kinds],
        [f"float[batch, {kv_heads}, {total}, {size}] present_{p}" for p in kinds],
        [
            f"present_key = Concat <axis = 2> (past_key, {new[0]})",
            f"present_value = Concat <axis = 2> (past_value, {new[1]})",
            "past_shape = Shape (past_key)",
            "past_len = Gather <axis = 0> (past_shape, index_2)",
        ],
        "present_key",
        "present_value",
    )


def positions(q_pos: tuple[str, ...] = ("q_pos = Range (past_len, total_len, step)",)) -> list:
    """``kv_u`` ``[1, L]`` and ``q_u`` ``[S, 1]``: the positions of the keys (the cache's
    and the new ones) and of the queries (after the cache), from ``x`` and ``past_len``."""
    return [
        "x_shape = Shape (x)",
        "seq_len = Gather <axis = 0> (x_shape, index_1)",
        "total_len = Add (past_len, seq_len)",
        *q_pos,
        "kv_pos = Range (start, total_len, step)",
        "kv_u = Unsqueeze (kv_pos, axes_kv)",
        "q_u = Unsqueeze (q_pos, axes_q)",
    ]


def graph_model(
    inputs: list[str], outputs: list[str], body: list[str], inits: dict, opset: int = 18
) -> onnx.ModelProto:
    """The model of ``body`` from ``inputs`` to ``outputs`` (onnx text declarations) at
    ``opset``, ``inits`` its initializers."""
    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
    g ({", ".join(inputs)}) => ({", ".join(outputs)}) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def padded_feeds(
    shape: tuple[int, int, int],
    padding: str,
    *,
    hidden: int,
    cache: tuple[int, int] | None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Inputs ``x`` and ``attention_mask`` of a decoder block for ``batch, seq, past``,
    with ``past_key``/``past_value`` of ``cache = (kv_heads, head_size)`` (None: no cache,
    the mask as long as the sequence): ``padding`` "left" (each row padded on the left by
    0 to all of its keys), "last" (the last row alone, by 2 keys or all but one) or
    "holes" (random keys masked)."""
    batch, seq, past = shape
    rng = np.random.default_rng(seed)
    total = past + seq if cache else seq
    mask = np.ones((batch, total), np.int64)
    if padding == "last":
        mask[-1, : min(2, total - 1)] = 0
    for row in range(batch if padding != "last" else 0):
        if padding == "left":
            mask[row, : rng.integers(0, total + 1)] = 0
        else:
            mask[row] = rng.integers(0, 2, total)
    found = {
        "x": rng.standard_normal((batch, seq, hidden)).astype(np.float32),
        "attention_mask": mask,
    }
    if cache:
        for name in ("past_key", "past_value"):
            found[name] = rng.standard_normal((batch, cache[0], past, cache[1])).astype(np.float32)
    return found
