"""Probe: com.microsoft GroupQueryAttention(do_rotary=1, cos/sin caches, position_ids)
against RotaryEmbedding(q), RotaryEmbedding(k) + GroupQueryAttention(do_rotary=0),
onnxruntime CPU, with the lengths/bias/query_seqlens the rewriter emits today
(docs/benchmarks.md section 31, "Rotary and packed QKV inside GroupQueryAttention").

    python bench/probe_gqa_rotary_inside.py [fp16]
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

MS = "com.microsoft"
N, KV, H = 4, 2, 32
MAXPOS = 64


def gqa_model(*, fused, packed, past, bias, r, interleaved, dtype, query_seqlens):
    T = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    ins, nodes = [], []
    if packed:
        ins.append(helper.make_tensor_value_info("qkv", T, ["B", "S", (N + 2 * KV) * H]))
    else:
        ins += [
            helper.make_tensor_value_info("q", T, ["B", "S", N * H]),
            helper.make_tensor_value_info("k", T, ["B", "S", KV * H]),
            helper.make_tensor_value_info("v", T, ["B", "S", KV * H]),
        ]
    ins += [
        helper.make_tensor_value_info("pos", TensorProto.INT64, ["B", "S"]),
        helper.make_tensor_value_info("cos", T, ["C", r // 2]),
        helper.make_tensor_value_info("sin", T, ["C", r // 2]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    if past:
        ins += [
            helper.make_tensor_value_info("past_k", T, ["B", KV, "P", H]),
            helper.make_tensor_value_info("past_v", T, ["B", KV, "P", H]),
        ]
    if bias:
        ins.append(helper.make_tensor_value_info("bias", T, ["B", 1, "S", "L"]))
    if query_seqlens:
        ins.append(helper.make_tensor_value_info("qsl", TensorProto.INT32, ["B"]))
    q, k, v = ("qkv", "", "") if packed else ("q", "k", "v")
    if packed and not fused:
        sizes = helper.make_tensor("sizes", TensorProto.INT64, [3], [N * H, KV * H, KV * H])
        nodes.append(helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1))
        q, k, v = "q", "k", "v"
    if not fused:
        q, k = rotary_nodes(nodes, (q, k), (N, KV), r, interleaved=interleaved)
    gin = [q, k, v, "past_k" if past else "", "past_v" if past else "", "seqlens_k", "total"]
    if fused:
        gin += ["cos", "sin", "pos"]
    else:
        gin += ["", "", ""]
    gin.append("bias" if bias else "")
    if query_seqlens:
        gin += ["", "", "", "", "", "qsl"]
    while gin and gin[-1] == "":
        gin.pop()
    attrs = dict(num_heads=N, kv_num_heads=KV, scale=H**-0.5, causal=1)
    if fused:
        attrs.update(do_rotary=1, rotary_interleaved=int(interleaved))
    nodes.append(
        helper.make_node(
            "GroupQueryAttention", gin, ["out", "present_k", "present_v"], domain=MS, **attrs
        )
    )
    outs = [helper.make_tensor_value_info(n, T, None) for n in ("out", "present_k", "present_v")]
    graph = helper.make_graph(
        nodes, "g", ins, outs, initializer=[sizes] if packed and not fused else []
    )
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    )
    m.ir_version = 10
    return m


def feeds(rng, *, B, S, P, packed, past, bias, r, dtype, pad, query_seqlens):
    L = P + S
    mask = np.ones((B, L), bool)
    for b in range(1, B):
        mask[b, : min(pad * b, L - 1)] = False  # left padding, more per row
    pos = np.cumsum(mask, 1) - 1
    pos = np.where(mask, pos, 1)[:, P:]  # HF: masked_fill(mask==0, 1)
    # arbitrary too: shift row 0 by a random offset (any positions must be honoured)
    pos[0] += rng.integers(0, 7)
    inv = 1.0 / (10000 ** (np.arange(0, r, 2) / r))
    ang = np.arange(MAXPOS)[:, None] * inv[None]
    f = {
        "pos": pos.astype(np.int64),
        "cos": np.cos(ang).astype(dtype),
        "sin": np.sin(ang).astype(dtype),
        "seqlens_k": np.full(B, L - 1, np.int32),
        "total": np.array(L, np.int32),
    }
    if packed:
        f["qkv"] = rng.standard_normal((B, S, (N + 2 * KV) * H)).astype(dtype)
    else:
        f["q"] = rng.standard_normal((B, S, N * H)).astype(dtype)
        f["k"] = rng.standard_normal((B, S, KV * H)).astype(dtype)
        f["v"] = rng.standard_normal((B, S, KV * H)).astype(dtype)
    if past:
        f["past_k"] = rng.standard_normal((B, KV, P, H)).astype(dtype)
        f["past_v"] = rng.standard_normal((B, KV, P, H)).astype(dtype)
    if bias:
        causal = np.arange(L)[None, :] <= (P + np.arange(S))[:, None]
        allowed = mask[:, None, None, :] & causal[None, None]
        low = np.finfo(dtype).min
        f["bias"] = np.where(allowed, 0, low).astype(dtype)
    if query_seqlens:
        f["qsl"] = np.full(B, S, np.int32)
    return f


def session(m):
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


def rotary_nodes(
    nodes: list, qk: tuple[str, str], heads: tuple[int, int], rotary_dim: int, *, interleaved=False
) -> tuple[str, str]:
    """com.microsoft RotaryEmbedding of q and of k (``pos``, ``cos``, ``sin`` the graph's
    position ids and caches) appended to ``nodes``; the rotated names."""
    rotated = []
    for x, count in zip(qk, heads, strict=True):
        nodes.append(
            helper.make_node(
                "RotaryEmbedding",
                [x, "pos", "cos", "sin"],
                [x + "_rot"],
                domain=MS,
                num_heads=count,
                rotary_embedding_dim=rotary_dim,
                interleaved=int(interleaved),
            )
        )
        rotated.append(x + "_rot")
    return rotated[0], rotated[1]


def case(dtype, packed, S, P, bias, r, interleaved, pad, past=None):
    past = P > 0 if past is None else past
    query_seqlens = past  # the rewriter adds it with a cache
    kw = dict(
        packed=packed,
        past=past,
        bias=bias,
        r=r,
        interleaved=interleaved,
        dtype=dtype,
        query_seqlens=query_seqlens,
    )
    rng = np.random.default_rng(hash((packed, S, P, bias, r, interleaved, pad)) % 2**32)
    f = feeds(
        rng,
        B=3,
        S=S,
        P=P,
        packed=packed,
        past=past,
        bias=bias,
        r=r,
        dtype=dtype,
        pad=pad,
        query_seqlens=query_seqlens,
    )
    try:
        ref = session(gqa_model(fused=False, **kw)).run(None, f)
    except Exception as e:
        return f"reference failed: {str(e)[:200]}"
    try:
        got = session(gqa_model(fused=True, **kw)).run(None, f)
    except Exception as e:
        return f"fused failed: {str(e)[:200]}"
    # positions derived from seqlens instead of position_ids would differ in padded rows
    return max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ref, got, strict=True))


def main():
    dtypes = [np.float32, np.float16] if "fp16" in sys.argv else [np.float32]
    rows = []
    shapes = ((1, 0, False), (1, 8, True), (5, 0, False), (5, 0, True), (5, 8, True))
    print("dtype packed S P past bias r inter pad maxdiff", flush=True)
    for dtype, packed, (S, P, past), bias, r, inter, pad in itertools.product(
        dtypes,
        (False, True),
        shapes,
        (False, True),
        (H, H // 2, H // 4),
        (False, True),
        (0, 2),
    ):
        d = case(dtype, packed, S, P, bias, r, inter, pad, past)
        rows.append(
            (dtype.__name__, int(packed), S, P, int(past), int(bias), r, int(inter), pad, d)
        )
        print(*rows[-1], flush=True)


if __name__ == "__main__":
    main()
