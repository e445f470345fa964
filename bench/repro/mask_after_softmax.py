"""Attention whose mask is applied a second time after the Softmax (CPM-Ant, dynamo).

Seen in: cpmant dynamo and dynamo_kv (its TorchScript export fails), first near miss
  attention: expected MatMul 'context' reading output 0 of softmax (Softmax 'node_softmax');
  found Where 'node_masked_fill_1'

CpmAntAttention writes
    s = Q K^T / sqrt(H) + B                       B: [B, N, S, L] bucketed relative bias
    s = masked_fill(s, ~allowed, -inf)            Where(masked, -inf, s)
    P = Softmax(s)
    P = masked_fill(P, ~allowed, 0)               Where(masked, 0, P)  <- the new spelling
    y = P V
with the SAME condition tensor (Equal(mask, False)) feeding both Wheres.

Math: where allowed is False, exp(-inf) = 0, so Softmax already gives 0 there on every row
with at least one allowed key; on a row with no allowed key the Softmax gives NaN
(-inf - -inf) and the second Where gives 0 everywhere, exactly what SDPA's NaN guard
Where(IsNaN(P), 0, P) gives. So Where(masked, 0, Softmax(Where(masked, -inf, s))) ==
Where(IsNaN(P), 0, P): the post-Softmax Where is the NaN guard spelled with the mask's
own condition, and can be read as the guard when its condition is the one that put -inf
before the Softmax. Everything else here (the bias added before the mask, the Div by
sqrt(H), K^T as one Transpose [0, 2, 3, 1]) is a spelling the rule already reads: without
the Where ("none") the block fuses into MultiHeadAttention.
A second step follows: with the guard ("nan", SDPA's own spelling, the control) the
rewriter refuses MultiHeadAttention because the mask (the bias plus the mask's Where) is
no Where of constants, so a row with no key (NaN, then 0 in the graph) cannot be ruled
out. CPM-Ant's rows past a sequence's length have no key (its mask is computed from the
ids), so that refusal holds there too unless the op's output for such rows is zeroed the
same way (Where(row has no key, 0, MHA(...)) after the op) or they are proven absent.

Run: .venv/bin/python bench/repro/mask_after_softmax.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

B, N, S, H = 1, 8, 11, 32
RTOL, ATOL = 1e-5, 1e-6


def build(after: str = "mask") -> onnx.ModelProto:
    """q, k, v: [B, S, N*H]; bias: [B, N, S, S]; allowed: [B, 1, S, S] bool -> y [B, S, N*H].
    ``after`` the Softmax: "mask" (CPM-Ant's Where(masked, 0, P)), "nan" (SDPA's guard
    Where(IsNaN(P), 0, P), a control) or "none" (nothing: rows with no key give NaN)."""
    f = TensorProto.FLOAT
    inits = [
        numpy_helper.from_array(np.array([B, S, N, H], np.int64), "heads"),
        numpy_helper.from_array(np.array([B, S, N * H], np.int64), "merged"),
        numpy_helper.from_array(np.array(np.sqrt(H), np.float32), "sqrt_h"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(False), "false"),
    ]
    nodes = [
        helper.make_node("Reshape", ["q", "heads"], ["q4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["k", "heads"], ["k4"]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["v", "heads"], ["v4"]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["qk"]),
        helper.make_node("Div", ["qk", "sqrt_h"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["biased"]),
        helper.make_node("Equal", ["allowed", "false"], ["masked"]),
        helper.make_node("Where", ["masked", "neg_inf", "biased"], ["filled"]),
        helper.make_node("Softmax", ["filled"], ["probs"], axis=-1),
        *{  # the new step: "mask"
            "mask": [helper.make_node("Where", ["masked", "zero", "probs"], ["probs0"])],
            "nan": [
                helper.make_node("IsNaN", ["probs"], ["nan"]),
                helper.make_node("Where", ["nan", "zero", "probs"], ["probs0"]),
            ],
            "none": [helper.make_node("Identity", ["probs"], ["probs0"])],
        }[after],
        helper.make_node("MatMul", ["probs0", "vt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mask_after_softmax",
        [
            helper.make_tensor_value_info("q", f, [B, S, N * H]),
            helper.make_tensor_value_info("k", f, [B, S, N * H]),
            helper.make_tensor_value_info("v", f, [B, S, N * H]),
            helper.make_tensor_value_info("bias", f, [B, N, S, S]),
            helper.make_tensor_value_info("allowed", TensorProto.BOOL, [B, 1, S, S]),
        ],
        [helper.make_tensor_value_info("y", f, [B, S, N * H])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def reference(q, k, v, bias, allowed) -> np.ndarray:
    """The same block by its math: masked softmax, fully masked rows give 0."""
    qh = q.reshape(B, S, N, H).transpose(0, 2, 1, 3)
    kh = k.reshape(B, S, N, H).transpose(0, 2, 1, 3)
    vh = v.reshape(B, S, N, H).transpose(0, 2, 1, 3)
    s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(H) + bias
    s = np.where(allowed, s, -np.inf)
    top = np.max(np.where(allowed, s, -1e30), axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - top), 0.0)
    total = e.sum(-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return (p @ vh).transpose(0, 2, 1, 3).reshape(B, S, N * H)


def feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    allowed = np.tril(np.ones((S, S), bool))[None, None].copy()
    allowed[..., 0, :] = False  # a fully masked row (a padded query): the guard's case
    return {
        "q": rng.standard_normal((B, S, N * H)).astype(np.float32),
        "k": rng.standard_normal((B, S, N * H)).astype(np.float32),
        "v": rng.standard_normal((B, S, N * H)).astype(np.float32),
        "bias": rng.standard_normal((B, N, S, S)).astype(np.float32),
        "allowed": allowed,
    }


def main() -> None:
    model = build()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = feeds()
    (got,) = session.run(None, x)
    np.testing.assert_allclose(got, reference(**x), rtol=RTOL, atol=ATOL)
    print("mask_after_softmax: onnxruntime matches the reference", got.shape)
    try:  # what the fusion makes of it, where the project is importable
        from autofusion.fusion_core import OptimizeConfig, optimize
    except ImportError:
        return
    config = OptimizeConfig(target="onnxruntime", target_profile="cpu-roofline")
    for after in ("none", "nan", "mask"):
        result = optimize(build(after), config)
        fused = {op: n for op, n in result.ops_after.items() if "::" in op}
        misses = [m.reason[:200] for m in result.near_misses if m.pattern == "attention"]
        print(f"after the Softmax {after!r}: fused {fused}; attention near miss: {misses[:1]}")


if __name__ == "__main__":
    main()
