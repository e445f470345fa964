"""A real Slice dropped as an identity: the fused model is WRONG (Kimi-Linear, TorchScript).

Seen in: kimi_linear torchscript. The survey row reads "0 fused, check passed": the
pipeline fell back to the model as it came because the fused model failed to run
(fallback failure 'fused_cannot_run': onnxruntime "Shape mismatch attempting to
re-use buffer. {1,8,16,32} != {1,8,64,32}" in 'rms_norm_SimplifiedLayerNormalization_1_early').
At other sizes the same rewrite runs and gives a wrong answer the check does not see.

What happens (traced step by step on the survey's graph):
1. Kimi delta attention pads the sequence to a multiple of its chunk (64), works on
   [B, H, P/64, 64, D] chunks, reshapes back to [B, H, -1, D] (P rows) and slices the
   first S rows: Reshape_82 -> Slice_386 (axis 2, 0 : S) -> Transpose -> o_norm.
2. The pre-pass shape inference (SymbolicShapeInferencePass: onnxruntime's symbolic
   inference, fusion_core/prepasses/_inferences.py) writes Reshape_82's output as
   [batch, 8, sequence, 32]: the padded length P labelled 'sequence' (S). It is not: P
   is S rounded up to the chunk.
3. The canonical rule identity_slice (canonical/_identity.py, drop_identity_slices)
   bypasses every Slice whose input and output dims read the same, trusting those
   symbolic dims: Slice_386 is dropped. From there the graph carries P rows, not S.
4. The check runs sequence = 16 (validate/_dims.py: the first size that runs). With
   Kimi's chunk 64, 16 pads to 64 and the fused model fails to run: caught, fallback.
   With a chunk that divides 16 (here 16, or 8, 4...) the Slice is a no-op at 16, the
   check PASSES, and the fused model is handed out: at any other length it returns P
   rows where the original returns S (a different shape, other values).

Suggested fixes (either closes it): identity_slice proves a Slice whole from its own
bounds (start 0 and an end that is INT64_MAX, or the Shape of its own input at that
axis), or trusts only static int dims, not symbolic names an inference assigned; and
the check could run a second, odd sequence length (5, 7) besides 16.

Status at a4b9eda: this block is fixed by f2c7622 (identity_slice proves a Slice whole
from its own bounds: both chunks keep the Slice). The survey graph was not: on
kimi_linear_torchscript.onnx identity_slice still dropped Slice_386, since its end
(Unsqueeze(Gather(Shape, 1))) read 'sequence' and the inferred input dim was 'sequence'
too (the padded length, auto-merged by onnxruntime's symbolic inference), so
``end == dim`` held in _reaches.

Fixed since: identity_slice compares sizes the graph proves (fusion_core/sizes/,
``axis_size``: declared input dims, constants, Shape reads, Reshape and Expand targets,
Range lengths, through the ops that keep an axis), never a symbol an inference put on a
value: Slice_386's input is a Reshape to ``[B, H, -1, D]``, whose -1 proves nothing, so
the Slice stays (``trace`` prints "kept"). And the check runs a second sequence length
(7) beside 16 (validate/_dims.py, ``second_length_dims``), so a fused model right only
at the multiples of a chunk that divides 16 fails it.

Run: .venv/bin/python bench/repro/padded_slice_dropped.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

B, H, D = 1, 2, 8
RTOL, ATOL = 1e-5, 1e-6


def build(chunk: int) -> onnx.ModelProto:
    """x [batch, sequence, H*D] -> y [batch, sequence, H, D]: heads, pad the sequence to a
    multiple of ``chunk``, work per chunk (x2), back to rows, keep the first S, an RMSNorm."""
    consts = {
        "heads": [0, 0, H, D], "zero": [0], "one": [1], "two_axis": [2], "c": [chunk],
        "pads0": [0] * 8, "pad_at": [6], "minus1": [-1], "hh": [H], "dd": [D], "last": [-1],
    }  # fmt: skip
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "index_1"))
    inits += [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.linspace(0.5, 1.5, D).astype(np.float32), "gamma"),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "heads"], ["x4"]),
        helper.make_node("Transpose", ["x4"], ["xt"], perm=[0, 2, 1, 3]),  # [B, H, S, D]
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "index_1"], ["s0"], axis=0),  # S
        helper.make_node("Unsqueeze", ["s0", "zero"], ["s1"]),  # [S], as TorchScript reads it
        helper.make_node("Slice", ["xs", "zero", "one"], ["b1"]),  # [B]
        helper.make_node("Mod", ["s1", "c"], ["rem"]),
        helper.make_node("Sub", ["c", "rem"], ["gap"]),
        helper.make_node("Mod", ["gap", "c"], ["pad_n"]),  # (C - S % C) % C
        helper.make_node("ScatterElements", ["pads0", "pad_at", "pad_n"], ["pads"], axis=0),
        helper.make_node("Pad", ["xt", "pads"], ["padded"]),  # [B, H, P, D]
        helper.make_node("Concat", ["b1", "hh", "minus1", "c", "dd"], ["t5"], axis=0),
        helper.make_node("Reshape", ["padded", "t5"], ["chunks"]),  # [B, H, P/C, C, D]
        helper.make_node("Mul", ["chunks", "two"], ["work"]),
        helper.make_node("Concat", ["b1", "hh", "minus1", "dd"], ["t4"], axis=0),
        helper.make_node("Reshape", ["work", "t4"], ["rows"]),  # [B, H, P, D]
        helper.make_node("Slice", ["rows", "zero", "s1", "two_axis"], ["kept"]),  # [B, H, S, D]
        helper.make_node("Transpose", ["kept"], ["back"], perm=[0, 2, 1, 3]),  # [B, S, H, D]
        helper.make_node("Pow", ["back", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["root"]),
        helper.make_node("Div", ["back", "root"], ["normed"]),
        helper.make_node("Mul", ["normed", "gamma"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "padded_slice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", H * D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", H, D])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def reference(x: np.ndarray) -> np.ndarray:
    """The block by its math: the padding never reaches the output."""
    heads = x.reshape(B, -1, H, D).astype(np.float64) * 2.0
    gamma = np.linspace(0.5, 1.5, D)
    return heads / np.sqrt((heads**2).mean(-1, keepdims=True) + 1e-6) * gamma


def run(model: onnx.ModelProto, x: np.ndarray):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    try:
        return session.run(None, {"x": x})[0]
    except Exception as exc:
        return f"fails to run: {str(exc).splitlines()[0][:160]}"


def main() -> None:
    rng = np.random.default_rng(0)
    for chunk in (16, 64):
        model = build(chunk)
        for seq in (5, 16):
            x = rng.standard_normal((B, seq, H * D)).astype(np.float32)
            np.testing.assert_allclose(run(model, x), reference(x), rtol=RTOL, atol=ATOL)
    print("padded_slice: onnxruntime matches the reference (chunks 16, 64; lengths 5, 16)")
    try:  # what the fusion makes of it, where the project is importable
        from autofusion.fusion_core import OptimizeConfig, optimize
    except ImportError:
        return
    for chunk in (16, 64):
        # strict + keep_failed: the fused model as the rounds wrote it, even if the check failed
        config = OptimizeConfig(
            target="onnxruntime",
            target_profile="cpu-roofline",
            strict=True,
            keep_failed=True,
        )
        result = optimize(build(chunk), config)
        fused = result.to_proto()
        ops = [n.op_type for n in fused.graph.node]
        check = "passed" if result.check and result.check.passed else result.check.failure
        print(f"chunk {chunk}: check {check}; Slices left {ops.count('Slice')} (original 2)")
        for seq in (5, 16):
            x = rng.standard_normal((B, seq, H * D)).astype(np.float32)
            got = run(fused, x)
            if isinstance(got, str):
                print(f"  length {seq}: fused model {got}")
            else:
                print(f"  length {seq}: original {reference(x).shape}, fused {got.shape}")


def trace(path: str, slice_name: str = "/model/model/layers.0/self_attn/Slice_386") -> None:
    """The pre-passes, then each canonical rule, on a survey graph: the step that drops
    ``slice_name`` and the shape its input was given (needs the project)."""
    import itertools

    import onnx_ir as ir

    from autofusion.fusion_core.canonical import MARK, RULES
    from autofusion.fusion_core.prepasses.passes import PrepassOptions, run_prepasses

    model = ir.from_proto(onnx.load(path))
    run_prepasses(model, PrepassOptions())
    (node,) = [n for n in model.graph if n.name == slice_name]
    print("after the pre-passes:", slice_name, "reads", node.inputs[0].shape)
    counter = itertools.count()
    for name, rule in RULES.items():
        if rule(model.graph, lambda hint: f"{hint}__{next(counter)}", MARK) and node.graph is None:
            print("dropped by", name)
            return
    print("kept")


if __name__ == "__main__":
    import sys

    main()
    if len(sys.argv) > 1:  # a survey graph: python padded_slice_dropped.py X.onnx
        trace(sys.argv[1])
