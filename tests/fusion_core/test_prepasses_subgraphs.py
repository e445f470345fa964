"""Pre-passes on models with control flow: If/Loop/Scan bodies keep what they compute.

Each case is a model on which a pre-pass used to break the graph (a wrong answer, a
crash, or a model onnxruntime no longer loads); the test runs the pre-passes and the
original and pre-passed models on the same inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.parser
import onnx_ir as ir
import pytest

from autofusion.fusion_core.ir import model_from_proto
from autofusion.fusion_core.prepasses import (
    IdentityEliminationPass,
    PrepassOptions,
    SymbolicShapeInferencePass,
    run_prepasses,
)
from autofusion.fusion_core.validate import make_session

RTOL, ATOL = 0.0, 0.0  # the pre-passes here must not change a single bit


def _scan_sum() -> onnx.ModelProto:
    """onnx's node test ``test_scan_sum``: the body returns the carried sum and its copy."""
    body = onnx.parser.parse_graph(
        """scan_body (float[2] sum_in, float[2] next) => (float[2] sum_out, float[2] scan_out) {
            sum_out = Add(sum_in, next)
            scan_out = Identity(sum_out)
        }"""
    )
    node = oh.make_node("Scan", ["initial", "x"], ["y", "z"], body=body, num_scan_inputs=1)
    graph = oh.make_graph(
        [node],
        "scan_sum",
        [
            oh.make_tensor_value_info("initial", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 2]),
        ],
        [
            oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2]),
            oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [3, 2]),
        ],
    )
    # As test_scan9_sum: opset 9+ Scan has no batch axis (test_scan_sum is its opset-8 twin).
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 16)], ir_version=8)


def _if_copies_outer_value() -> onnx.ModelProto:
    """silero-vad's shape: a branch returns ``Identity`` of a value of the outer graph."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (bool c, float[2, 3] x) => (float[2, 3] y) {
        t = Relu(x)
        y = If(c) <
            then_branch = then_g () => (float[2, 3] a) { a = Identity(t) },
            else_branch = else_g () => (float[2, 3] b) { n = Neg(t)  b = Identity(n) }
        >
    }"""
    return onnx.parser.parse_model(text)


def _if_branches_of_different_rank() -> onnx.ModelProto:
    """Two branches whose outputs differ in rank, the If's output feeding more ops."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (bool c, float[2, 3] x) => (float[N] y) {
        r = If(c) <
            then_branch = then_g () => (float[2, 3] a) { a = Relu(x) },
            else_branch = else_g () => (float[6] b) {
                s = Constant<value = int64[1] {6}>()
                b = Reshape(x, s)
            }
        >
        s2 = Constant<value = int64[1] {-1}>()
        y = Reshape(r, s2)
    }"""
    return onnx.parser.parse_model(text)


CASES = {
    "scan-carried-and-copy": (
        _scan_sum,
        [
            {
                "initial": np.array([0, 0], np.float32),
                "x": np.arange(6, dtype=np.float32).reshape(3, 2),
            }
        ],
    ),
    "if-identity-of-outer-value": (
        _if_copies_outer_value,
        [
            {"c": np.array(flag), "x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
            for flag in (True, False)
        ],
    ),
    "if-branches-of-different-rank": (
        _if_branches_of_different_rank,
        [
            {"c": np.array(flag), "x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
            for flag in (True, False)
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_prepasses_keep_control_flow_results(case):
    build, feeds = CASES[case]
    original = build()
    onnx.checker.check_model(original, full_check=True)
    model = model_from_proto(original)
    run_prepasses(model, PrepassOptions())
    prepassed = ir.to_proto(model)
    want, got = make_session(original), make_session(prepassed)
    names = [o.name for o in original.graph.output]
    for feed in feeds:
        for name, a, b in zip(names, want.run(names, feed), got.run(names, feed), strict=True):
            np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=name)


def test_scan_sum_values():
    """The numbers of the node test itself: sums [9, 12], running sums per step."""
    model = model_from_proto(_scan_sum())
    run_prepasses(model, PrepassOptions())
    feed = {
        "initial": np.zeros(2, np.float32),
        "x": np.arange(1, 7, dtype=np.float32).reshape(3, 2),
    }
    y, z = make_session(ir.to_proto(model)).run(["y", "z"], feed)
    np.testing.assert_allclose(y, [9, 12], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(z, [[1, 2], [4, 6], [9, 12]], rtol=RTOL, atol=ATOL)


def test_identity_of_graph_output_is_kept_when_its_source_is_an_output_too():
    model = model_from_proto(_scan_sum())
    IdentityEliminationPass()(model)
    scan = next(iter(model.graph))
    body = scan.attributes["body"].as_graph()
    assert [n.op_type for n in body] == ["Add", "Identity"]
    assert [v.name for v in body.outputs] == ["sum_out", "scan_out"]


def test_identity_inside_a_branch_is_removed_where_it_is_safe():
    model = model_from_proto(_if_copies_outer_value())
    IdentityEliminationPass()(model)
    if_node = next(n for n in model.graph if n.op_type == "If")
    then_ops = [n.op_type for n in if_node.attributes["then_branch"].as_graph()]
    else_ops = [n.op_type for n in if_node.attributes["else_branch"].as_graph()]
    assert then_ops == ["Identity"]  # copies an outer value: must stay
    assert else_ops == ["Neg"]  # copies a value of its own branch: removed


def _image_model(height: str | int, width: str | int = "W") -> onnx.ModelProto:
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, {height}, {width}] x) => (float[N, 3, {height}, {width}] y) {{
        p = MaxPool<kernel_shape = [2, 2], strides = [2, 2]>(x)
        u = Resize<mode = "nearest">(p, , scales)
        y = Add(u, x)
    }}"""
    model = onnx.parser.parse_model(text)
    scales = np.array([1, 1, 2, 2], np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(scales, "scales"))
    return model


def _spatial_dims(proto: onnx.ModelProto) -> list:
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    return [d.dim_value or d.dim_param for d in list(dims)[2:]]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # dynamic spatial dims: sympy's floor(...) chains; run with numbers instead
        (_image_model("H"), [[224, 224], [256, 256]]),
        (_scan_sum(), []),  # control flow: one branch's rank for every branch
        (_image_model(64, 64), [[64, 64]]),  # only the batch is dynamic
    ],
    ids=["dynamic-image", "control-flow", "static-image"],
)
def test_onnxruntime_symbolic_inference_only_where_it_is_safe_and_fast(
    monkeypatch, model, expected
):
    import autofusion.fusion_core.prepasses._inferences as inferences

    seen = []
    monkeypatch.setattr(inferences, "_onnxruntime_inference", lambda p: seen.append(p))
    SymbolicShapeInferencePass()(model_from_proto(model))
    assert [_spatial_dims(p) for p in seen] == expected


def test_an_image_model_keeps_the_dims_that_do_not_follow_the_image():
    """Channels survive a dynamic image size; the spatial dims stay unknown."""
    model = model_from_proto(_image_model("H"))
    SymbolicShapeInferencePass()(model)
    pooled = next(n for n in model.graph if n.op_type == "MaxPool").outputs[0]
    assert pooled.shape is not None and pooled.shape[1] == 3
    assert not isinstance(pooled.shape[2], int) and not isinstance(pooled.shape[3], int)


def _add_relu() -> onnx.ModelProto:
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 32] x) => (float[N, 32] y) {
            s = Add(x, x)
            y = Relu(s)
        }"""
    )
    return model


def test_onnx_inference_without_data_propagation_where_it_contradicts_itself(monkeypatch):
    """onnx's data propagation once gave a TorchScript Cohere's rotary halves a rank of
    6, and the fused model then failed to load ("Incompatible dimensions"). Shapes that
    onnx's strict inference rejects are not used: the inference runs again without data
    propagation."""
    import autofusion.fusion_core.prepasses._inferences as inferences

    def contradicting(proto: onnx.ModelProto) -> onnx.ModelProto:
        wrong = onnx.ModelProto()
        wrong.CopyFrom(proto)
        wrong.graph.value_info.append(
            oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, ["N", 16])
        )
        return wrong

    assert not inferences._consistent(contradicting(_add_relu()))
    assert inferences._consistent(onnx.shape_inference.infer_shapes(_add_relu()))
    real = onnx.shape_inference.infer_shapes
    asked = []

    def infer(proto, **kwargs):
        asked.append(kwargs.get("data_prop"))
        inferred = real(proto, **kwargs)
        return contradicting(inferred) if kwargs.get("data_prop") else inferred

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", infer)
    inferred = inferences._onnx_inference(_add_relu())
    assert asked[0] is True and False in asked
    shapes = {
        v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
        for v in inferred.graph.value_info
    }
    assert shapes["s"] == ["N", 32]
