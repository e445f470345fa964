"""A decoder attention block whose values are scaled by a constant around their head
split, as MiMo-V2-Flash's sliding layers write it (``v_proj(x).view(..).transpose(1, 2) *
v_scale``), in the spellings ``value_scale`` reads: Mul or Div, one number, one per head,
one per channel or both, after the head Transpose or between the Reshape and it, with
or without repeat_kv, a KV cache (the scale on the new values, as ``cache.update``
stores them), gpt-oss's attention sinks, and value heads narrower than q/k's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from tests.fusion_core.decoder_text import (
    CAUSAL,
    PADDING,
    SINK_SOFTMAX,
    TEXT_CONSTANTS,
    graph_model,
    kv_cache,
    positions,
)

HIDDEN = 32
LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Block:
    heads: int = 4
    kv_heads: int = 2
    size: int = 16  # q/k head size
    v_size: int = 16
    op: str = "Mul"  # Mul or Div by the constant
    scale: str = "scalar"  # scalar, head, channel, both; none: no scale
    place: str = "after"  # after the head Transpose, or between the Reshape and it
    cache: bool = False
    sinks: bool = False


def _scale_constant(block: Block, rng: np.random.Generator) -> np.ndarray:
    """The constant as it broadcasts where it stands ([B, KV, L, Hv] after the
    Transpose, [B, S, KV, Hv] before it)."""
    kv, hv = block.kv_heads, block.v_size
    shapes = {"scalar": (), "none": (), "head": (kv, 1), "channel": (hv,), "both": (kv, hv)}
    value = rng.uniform(0.5, 1.5, shapes[block.scale]).astype(np.float32)
    if block.scale in ("head", "both") and block.place == "after":
        value = value.reshape(1, kv, 1, -1)  # [1, KV, 1, 1 or Hv]
    return np.array(0.707, np.float32) if block.scale == "scalar" else value


def value_block(block: Block, seed: int = 3) -> onnx.ModelProto:
    """The block, ``y = o_proj(attention(x))``, its mask causal and padding."""
    rng = np.random.default_rng(seed)
    n, kv, h, hv = block.heads, block.kv_heads, block.size, block.v_size
    inits = {
        "scale": np.array(h**-0.5, np.float32),
        "v_scale": _scale_constant(block, rng),
        "zero_f": np.array(0.0, np.float32),
        "masked": np.array(LOWEST, np.float32),
        "wo": rng.standard_normal((n * hv, HIDDEN)) * 0.3,
        "merge": np.array([0, 0, n * hv], np.int64),
        "sinks": rng.standard_normal((1, n, 1, 1)) * 2,
        "sink_heads": np.array([n], np.int64),
        **{
            name: np.array(v, np.int64)
            for name, v in {
                "zero": [0], "one": [1], "axis_2": [2], "axis_last": [-1], "minus_one": [-1],
            }.items()
        },
        **TEXT_CONSTANTS,
    }  # fmt: skip
    body = []
    for p, count, size in (("q", n, h), ("k", kv, h), ("v", kv, hv)):
        inits[f"w{p}"] = rng.standard_normal((HIDDEN, count * size)) * 0.3
        inits[f"{p}_split"] = np.array([0, 0, count, size], np.int64)
        body += [f"{p}m = MatMul (x, w{p})", f"{p}r = Reshape ({p}m, {p}_split)"]
        if p == "v" and block.place == "between" and block.scale != "none":
            body += [f"vs = {block.op} (vr, v_scale)", "vt = Transpose <perm = [0, 2, 1, 3]> (vs)"]
        else:
            body.append(f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)")
    new_value = "vt"
    if block.place == "after" and block.scale != "none":
        body.append(f"v_scaled = {block.op} (vt, v_scale)")
        new_value = "v_scaled"
    inputs = [f"float[batch, seq, {HIDDEN}] x"]
    total = '"past + seq"' if block.cache else "seq"
    inputs.append(f"int64[batch, {total}] attention_mask")
    outputs = [f"float[batch, seq, {HIDDEN}] y"]
    cached = kv_cache(block.cache, kv, h, total, new=("kt", new_value))
    if block.cache:  # the value cache holds Hv columns
        cached.inputs[1] = f"float[batch, {kv}, past, {hv}] past_value"
        cached.outputs[1] = f"float[batch, {kv}, {total}, {hv}] present_value"
    inputs, outputs, body = inputs + cached.inputs, outputs + cached.outputs, body + cached.body
    key, value = cached.key, cached.value
    if n != kv:  # repeat_kv
        inits["repeat"] = np.array([1, 1, n // kv, 1, 1], np.int64)
        for p, source, size in (("k", key, h), ("v", value, hv)):
            inits[f"{p}_kv_merge"] = np.array([0, n, -1, size], np.int64)
            body += [
                f"{p}_u = Unsqueeze ({source}, axis_2)",
                f"{p}_e = Expand ({p}_u, repeat)",
                f"{p}_rep = Reshape ({p}_e, {p}_kv_merge)",
            ]
        key, value = "k_rep", "v_rep"
    body += [*positions(), CAUSAL, *PADDING, "allowed = And (causal, padding)"]
    body += [
        "bias = Where (allowed, zero_f, masked)",
        f"kT = Transpose <perm = [0, 1, 3, 2]> ({key})",
        "qk = MatMul (qt, kT)",
        "scaled = Mul (qk, scale)",
        "biased = Add (scaled, bias)",
        *_softmax(block.sinks),
        f"context = MatMul (probs, {value})",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    return graph_model(inputs, outputs, body, inits)


def _softmax(sinks: bool) -> list[str]:
    if not sinks:
        return ["probs = Softmax <axis = -1> (biased)"]
    return SINK_SOFTMAX


def feeds(block: Block, batch: int, seq: int, past: int, seed: int = 0) -> dict:
    """Inputs for a padded batch: the last row padded on the left, the first on the right."""
    rng = np.random.default_rng(seed)
    total = past + seq if block.cache else seq
    mask = np.ones((batch, total), np.int64)
    mask[-1, : min(2, total - 1)] = 0
    if batch > 1 and total > 2:
        mask[0, -1] = 0
    out = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)}
    out["attention_mask"] = mask
    if block.cache:
        for name, size in (("past_key", block.size), ("past_value", block.v_size)):
            shape = (batch, block.kv_heads, past, size)
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out
