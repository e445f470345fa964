"""The rotary and packed Q/K/V inside GroupQueryAttention, or not: one decoder
attention block four ways, onnxruntime CPU, 2 threads, ORT_ENABLE_ALL (docs/benchmarks.md
section 31, "Rotary and packed QKV inside GroupQueryAttention"):

  sep_rot : q/k/v MatMuls, RotaryEmbedding(q), RotaryEmbedding(k), GQA (today)
  pack_rot: one QKV MatMul, Split, 2 x RotaryEmbedding, GQA (today, after qkv_merge)
  sep_in  : q/k/v MatMuls, GQA(do_rotary=1, cos, sin, position_ids)
  pack_in : one QKV MatMul, GQA(packed, do_rotary=1) (the model builder's layout)

    python bench/bench_gqa_rotary_inside.py [--attention-only] [--no-spin]

Every variant takes the rewriter's lengths, attention_bias and query_seqlens.
Decode: 1 token after P=128; prefill: 128 tokens, empty cache. Interleaved rounds."""

from __future__ import annotations

import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from probe_gqa_rotary_inside import rotary_nodes

MS = "com.microsoft"
D, N, KV, H = 2048, 32, 8, 64
MAXPOS = 4096
ATTENTION_ONLY = "--attention-only" in sys.argv
VARIANTS = ("sep_rot", "pack_rot", "sep_in", "pack_in")


def model(variant, rng):
    packed, fused = variant.startswith("pack"), variant.endswith("_in")
    T = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(np.cos(_angles()).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(_angles()).astype(np.float32), "sin"),
    ]
    w = {
        n: (rng.standard_normal((D, c)) * 0.02).astype(np.float32)
        for n, c in (("wq", N * H), ("wk", KV * H), ("wv", KV * H))
    }
    nodes = []
    if ATTENTION_ONLY:  # the projections are inputs: only what the rewrite changes is timed
        inits = inits[:2]
        if packed:
            nodes.append(helper.make_node("Identity", ["x"], ["qkv"]))
        else:
            bounds = ((0, N * H), (N * H, (N + KV) * H), ((N + KV) * H, None))
            for n, (a, b) in zip("qkv", bounds, strict=True):
                inits.append(numpy_helper.from_array(np.array([a], np.int64), f"s{n}"))
                inits.append(numpy_helper.from_array(np.array([b or 10**9], np.int64), f"e{n}"))
                nodes.append(helper.make_node("Slice", ["x", f"s{n}", f"e{n}", "axis2"], [n]))
            inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis2"))
    elif packed:
        inits.append(
            numpy_helper.from_array(np.concatenate([w["wq"], w["wk"], w["wv"]], 1), "wqkv")
        )
        nodes.append(helper.make_node("MatMul", ["x", "wqkv"], ["qkv"]))
    else:
        inits += [numpy_helper.from_array(a, n) for n, a in w.items()]
        for n in "qkv":
            nodes.append(helper.make_node("MatMul", ["x", f"w{n}"], [n]))
    q, k, v = ("qkv", "", "") if packed and fused else ("q", "k", "v")
    if packed and not fused:
        inits.append(numpy_helper.from_array(np.array([N * H, KV * H, KV * H], np.int64), "sizes"))
        nodes.append(helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=-1))
    if not fused:
        q, k = rotary_nodes(nodes, ("q", "k"), (N, KV), H)
    gin = [q, k, v, "past_k", "past_v", "seqlens_k", "total"]
    gin += ["cos", "sin", "pos"] if fused else ["", "", ""]
    gin += ["bias", "", "", "", "", "", "qsl"]
    attrs = dict(num_heads=N, kv_num_heads=KV, scale=H**-0.5, causal=1)
    if fused:
        attrs["do_rotary"] = 1
    nodes.append(
        helper.make_node("GroupQueryAttention", gin, ["out", "pk", "pv"], domain=MS, **attrs)
    )
    ins = [
        helper.make_tensor_value_info(
            "x", T, ["B", "S", (N + 2 * KV) * H if ATTENTION_ONLY else D]
        ),
        helper.make_tensor_value_info("pos", TensorProto.INT64, ["B", "S"]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
        helper.make_tensor_value_info("past_k", T, ["B", KV, "P", H]),
        helper.make_tensor_value_info("past_v", T, ["B", KV, "P", H]),
        helper.make_tensor_value_info("bias", T, ["B", 1, "S", "L"]),
        helper.make_tensor_value_info("qsl", TensorProto.INT32, ["B"]),
    ]
    outs = [helper.make_tensor_value_info(n, T, None) for n in ("out", "pk", "pv")]
    m = helper.make_model(
        helper.make_graph(nodes, variant, ins, outs, inits),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
    )
    m.ir_version = 10
    return m


def _angles():
    inv = 1.0 / (10000 ** (np.arange(0, H, 2) / H))
    return np.arange(MAXPOS)[:, None] * inv[None]


def feeds(rng, S, P, B=1):
    L = P + S
    causal = np.arange(L)[None, :] <= (P + np.arange(S))[:, None]
    return {
        "x": rng.standard_normal((B, S, (N + 2 * KV) * H if ATTENTION_ONLY else D)).astype(
            np.float32
        ),
        "pos": np.tile(np.arange(P, L), (B, 1)).astype(np.int64),
        "seqlens_k": np.full(B, L - 1, np.int32),
        "total": np.array(L, np.int32),
        "past_k": rng.standard_normal((B, KV, P, H)).astype(np.float32),
        "past_v": rng.standard_normal((B, KV, P, H)).astype(np.float32),
        "bias": np.broadcast_to(np.where(causal, 0, -3.4e38), (B, 1, S, L)).astype(np.float32),
        "qsl": np.full(B, S, np.int32),
    }


def main(rounds=40, reps=30):
    print(
        "attention only (projections are inputs; sep_* slice them)"
        if ATTENTION_ONLY
        else "block with projections"
    )
    rng = np.random.default_rng(0)
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.intra_op_num_threads, o.inter_op_num_threads = 2, 1
    if "--no-spin" in sys.argv:  # the machine is shared: spinning threads measure the load
        o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {
        v: ort.InferenceSession(
            model(v, np.random.default_rng(1)).SerializeToString(),
            o,
            providers=["CPUExecutionProvider"],
        )
        for v in VARIANTS
    }
    for phase, (S, P) in (("decode", (1, 128)), ("prefill", (128, 0))):
        f = feeds(rng, S, P)
        ref = sessions["sep_rot"].run(None, f)
        for v in VARIANTS:
            got = sessions[v].run(None, f)
            diff = max(float(np.abs(a - b).max()) for a, b in zip(ref, got, strict=True))
            print(f"{phase} {v}: max diff vs sep_rot {diff:.2e}")
        times = {v: [] for v in VARIANTS}
        n = reps if phase == "decode" else max(reps // 10, 3)
        for _ in range(rounds):
            for v in VARIANTS:
                t = time.perf_counter()
                for _ in range(n):
                    sessions[v].run(None, f)
                times[v].append((time.perf_counter() - t) / n * 1e6)
        base = np.median(times["sep_rot"])
        for v in VARIANTS:
            a = np.array(times[v])
            ratio = np.percentile(a / np.array(times["sep_rot"]), [10, 50, 90])
            print(
                f"{phase} {v:9s} median {np.median(a):8.1f} us  p10-p90 "
                f"{np.percentile(a, 10):8.1f}-{np.percentile(a, 90):8.1f}  "
                f"ratio vs sep_rot {np.median(a) / base:.3f} "
                f"(per-round p10-p90 {ratio[0]:.3f}-{ratio[2]:.3f})"
            )


if __name__ == "__main__":
    main()
