"""Attention with sinks whose values are scaled after the head split, and whose value
heads are narrower than the query and key heads (MiMo-V2-Flash's sliding layers).

Seen in: mimo_v2_flash torchscript, dynamo and dynamo_kv: its sliding layer (the one
with sinks) stays, the full layer (no sinks) fuses. First near miss
  attention: rewriter 'attention_block': not MultiHeadAttention: it has no input for
  attention sinks (a logit per head in the softmax's denominator); not
  GroupQueryAttention: the value 'mul_205' is not a head split (Transpose of a Reshape)

MiMoV2FlashAttention writes
    V = Transpose(Reshape(v_proj(x), [B, S, KV, Hv]), [0, 2, 1, 3]) * c      c = 0.707
    s = Concat(Q K^T * H^-0.5 + M, sinks[1, N, 1, 1] expanded);  s = s - max(s)
    P = Softmax(s)[..., :-1];  y = P V
with q and k heads of H = 48 and value heads of Hv = 32 (v_head_dim).

Two steps stand between it and GroupQueryAttention with head_sink (the only op here
with sinks):
1. the value's constant scale. P (c V) = c (P V): c moves onto the value projection's
   weights (and bias), or onto the merged context (before o_proj), exactly; after
   that V is a head split. (The full layer fuses as MultiHeadAttention with it in
   place; GQA's value input must be the split itself.)
2. Hv != H. onnxruntime's GroupQueryAttention takes one head size for q, k and v
   (hidden_size / num_heads); MultiHeadAttention allows a different v size but has no
   sinks. V padded with zero columns to H and the context's extra columns sliced off is
   the same math at more cost; a rule should say so rather than fuse silently.
``build(value_scale, value_size)`` writes each alone; main() prints what fuses.

Run: .venv/bin/python bench/repro/sinks_value_scale.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper, parser

HIDDEN, HEADS, KV_HEADS, SIZE = 32, 4, 2, 8
C = 0.707
LOWEST = float(np.finfo(np.float32).min)
RTOL, ATOL = 1e-5, 1e-5


def weights(value_size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "wq": rng.standard_normal((HIDDEN, HEADS * SIZE)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, KV_HEADS * SIZE)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, KV_HEADS * value_size)) * 0.3,
        "wo": rng.standard_normal((HEADS * value_size, HIDDEN)) * 0.3,
        "sinks": rng.standard_normal((1, HEADS, 1, 1)) * 2,
    }


def build(value_scale: bool, value_size: int = SIZE) -> onnx.ModelProto:
    """x: [batch, seq, HIDDEN], position_ids, attention_mask -> y [batch, seq, HIDDEN]."""
    groups = HEADS // KV_HEADS
    inits = {
        **weights(value_size),
        "inv_freq": 1.0 / (10000 ** (np.arange(0, SIZE, 2) / SIZE)),
        "q_split": [0, 0, HEADS, SIZE], "k_split": [0, 0, KV_HEADS, SIZE],
        "v_split": [0, 0, KV_HEADS, value_size], "repeat": [1, 1, groups, 1, 1],
        "k_merge": [0, HEADS, -1, SIZE], "v_merge": [0, HEADS, -1, value_size],
        "merge": [0, 0, HEADS * value_size], "zero": [0], "one": [1], "half": [SIZE // 2],
        "end": [SIZE], "axis_1": [1], "axis_2": [2], "axis_last": [-1], "minus_one": [-1],
        "axes_kv": [0, 1, 2], "axes_q": [0, 1, 3], "axes_pad": [1, 2], "sink_heads": [HEADS],
        "scale": np.float32(SIZE**-0.5), "zero_f": np.float32(0.0),
        "masked": np.float32(LOWEST), "start": np.int64(0), "step": np.int64(1),
        "index_1": np.int64(1),
    }  # fmt: skip
    if value_scale:
        inits["c"] = np.float32(C)
    value = ["v_in = Mul (vt, c)"] if value_scale else ["v_in = Identity (vt)"]
    body = [
        "pos = Cast <to = 1> (position_ids)",
        "pos_u = Unsqueeze (pos, axis_last)",
        "freqs = Mul (pos_u, inv_freq)",
        "emb = Concat <axis = -1> (freqs, freqs)",
        "cos = Cos (emb)",
        "sin = Sin (emb)",
        "cos_u = Unsqueeze (cos, axis_1)",
        "sin_u = Unsqueeze (sin, axis_1)",
        *[
            line
            for p in "qkv"
            for line in (
                f"{p}m = MatMul (x, w{p})",
                f"{p}r = Reshape ({p}m, {p}_split)",
                f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
            )
        ],
        *[
            line
            for p in "qk"
            for line in (
                f"{p}_lo = Slice ({p}t, zero, half, axis_last)",
                f"{p}_hi = Slice ({p}t, half, end, axis_last)",
                f"{p}_neg = Neg ({p}_hi)",
                f"{p}_turn = Concat <axis = -1> ({p}_neg, {p}_lo)",
                f"{p}_c = Mul ({p}t, cos_u)",
                f"{p}_s = Mul ({p}_turn, sin_u)",
                f"{p}_emb = Add ({p}_c, {p}_s)",
            )
        ],
        *value,  # the new step (1)
        *[
            line
            for p, source in (("k", "k_emb"), ("v", "v_in"))
            for line in (
                f"{p}_u = Unsqueeze ({source}, axis_2)",
                f"{p}_e = Expand ({p}_u, repeat)",
                f"{p}_rep = Reshape ({p}_e, {p}_merge)",
            )
        ],
        "x_shape = Shape (x)",
        "seq_len = Gather <axis = 0> (x_shape, index_1)",
        "q_pos = Range (start, seq_len, step)",
        "kv_u = Unsqueeze (q_pos, axes_kv)",
        "q_u = Unsqueeze (q_pos, axes_q)",
        "causal = LessOrEqual (kv_u, q_u)",
        "mask_u = Unsqueeze (attention_mask, axes_pad)",
        "padding = Cast <to = 9> (mask_u)",
        "allowed = And (causal, padding)",
        "bias = Where (allowed, zero_f, masked)",
        "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
        "qk = MatMul (q_emb, kT)",
        "scaled = Mul (qk, scale)",
        "biased = Add (scaled, bias)",
        "batch_1 = Gather <axis = 0> (x_shape, zero)",
        "seq_1 = Unsqueeze (seq_len, zero)",
        "sink_rows = Concat <axis = 0> (batch_1, sink_heads, seq_1, one)",
        "sink_column = Expand (sinks, sink_rows)",
        "combined = Concat <axis = -1> (biased, sink_column)",
        "peak = ReduceMax <keepdims = 1> (combined, axis_last)",
        "shifted = Sub (combined, peak)",
        "both = Softmax <axis = -1> (shifted)",
        "probs = Slice (both, zero, minus_one, axis_last)",
        "context = MatMul (probs, v_rep)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, {HIDDEN}] x, int64[batch, seq] position_ids,
       int64[batch, seq] attention_mask) => (float[batch, seq, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    model = parser.parse_model(text)
    for name, array in inits.items():
        array = np.asarray(array)
        array = array.astype(np.int64 if array.dtype.kind == "i" else np.float32)
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    onnx.checker.check_model(model, full_check=True)
    return model


def reference(x, position_ids, attention_mask, value_scale: bool, value_size: int):
    w = weights(value_size)
    batch, seq = x.shape[:2]

    def heads(p, n, size):
        return (x @ w[f"w{p}"]).reshape(batch, seq, n, size).transpose(0, 2, 1, 3)

    freqs = position_ids[..., None] * (1.0 / 10000 ** (np.arange(0, SIZE, 2) / SIZE))
    angles = np.concatenate([freqs, freqs], -1)[:, None]

    def rotate(t):
        lo, hi = t[..., : SIZE // 2], t[..., SIZE // 2 :]
        return t * np.cos(angles) + np.concatenate([-hi, lo], -1) * np.sin(angles)

    g = HEADS // KV_HEADS
    q = rotate(heads("q", HEADS, SIZE))
    k = np.repeat(rotate(heads("k", KV_HEADS, SIZE)), g, axis=1)
    v = np.repeat(heads("v", KV_HEADS, value_size), g, axis=1) * (C if value_scale else 1.0)
    allowed = np.tril(np.ones((seq, seq), bool)) & (attention_mask[:, None, None, :] > 0)
    s = q @ k.transpose(0, 1, 3, 2) * SIZE**-0.5 + np.where(allowed, 0.0, LOWEST)
    sink = np.broadcast_to(w["sinks"], (batch, HEADS, seq, 1))
    both = np.concatenate([s, sink], -1)
    both = np.exp(both - both.max(-1, keepdims=True))
    p = (both / both.sum(-1, keepdims=True))[..., :-1]
    merged = (p @ v).transpose(0, 2, 1, 3).reshape(batch, seq, HEADS * value_size)
    return merged @ w["wo"]


def feeds(batch: int = 2, seq: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, :2] = 0  # left padding
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": np.tile(np.arange(seq), (batch, 1)).astype(np.int64),
        "attention_mask": mask,
    }


CASES = {  # name -> (value_scale, value_size)
    "control (gpt-oss's sinks)": (False, SIZE),
    "values scaled": (True, SIZE),
    "value heads narrower": (False, SIZE // 2),
    "MiMo-V2-Flash (both)": (True, SIZE // 2),
}


def main() -> None:
    x = feeds()
    for value_scale, value_size in CASES.values():
        model = build(value_scale, value_size)
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        (got,) = session.run(None, x)
        expected = reference(**x, value_scale=value_scale, value_size=value_size)
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    print("sinks_value_scale: onnxruntime matches the reference in all four cases")
    try:  # what the fusion makes of it, where the project is importable
        from autofusion.fusion_core import OptimizeConfig, optimize
    except ImportError:
        return
    config = OptimizeConfig(target="onnxruntime", target_profile="cpu-roofline")
    for name, (value_scale, value_size) in CASES.items():
        result = optimize(build(value_scale, value_size), config)
        fused = {op: n for op, n in result.ops_after.items() if "::" in op}
        misses = [m.reason[:240] for m in result.near_misses if m.pattern == "attention"]
        print(f"{name}: fused {fused}; attention near miss: {misses[:1]}")


if __name__ == "__main__":
    main()
