"""Pre-passes: constants hidden by exporters become visible to the patterns."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import onnx_ir as ir
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.prepasses import (
    PrepassOptions,
    SymbolicShapeInferencePass,
    run_prepasses,
)
from autofusion.fusion_core.validate import make_session

RNG = np.random.default_rng(7)
C = 4


def _bn_params() -> list[onnx.TensorProto]:
    return [
        nh.from_array(RNG.uniform(0.5, 1.5, C).astype(np.float32), "gamma"),
        nh.from_array(RNG.normal(0, 0.1, C).astype(np.float32), "beta"),
        nh.from_array(RNG.normal(0, 0.1, C).astype(np.float32), "mean"),
        nh.from_array(RNG.uniform(0.5, 2.0, C).astype(np.float32), "var"),
        nh.from_array(RNG.normal(0, 0.3, (C, 3, 3, 3)).astype(np.float32), "w"),
    ]


HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'
SIGNATURE = "g (float[1,3,8,8] x) => (float[1,4,8,8] y)"

# Each body hides the BN scale (input 1) behind a chain an exporter produces.
HIDDEN_SCALE = {
    "identity": "s = Identity(gamma)",
    "identity-chain": "s0 = Identity(gamma)\n s = Identity(s0)",
    "castlike": "s = CastLike(gamma, x)",
    "expand": "shape = Constant<value = int64[1] {4}>()\n s = Expand(gamma, shape)",
    "shape-expand": (
        "one = Constant<value = float[1] {1.0}>()\n wshape = Shape<start = 0, end = 1>(w)\n"
        " ones = Expand(one, wshape)\n s = Mul(gamma, ones)"
    ),
    "constant-node": "s = Constant<value = float[4] {1.0, 0.5, 2.0, 1.5}>()",
}


def _model(scale_body: str) -> onnx.ModelProto:
    text = (
        HEADER
        + SIGNATURE
        + " {\n "
        + scale_body
        + """
 c = Conv<pads = [1, 1, 1, 1]>(x, w)
 y = BatchNormalization(c, s, beta, mean, var)
}"""
    )
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(_bn_params())
    return model


@pytest.mark.parametrize("body", HIDDEN_SCALE.values(), ids=HIDDEN_SCALE.keys())
def test_bn_parameters_behind_exporter_chains_still_fold(body: str) -> None:
    model = _model(body)
    result = optimize(model, OptimizeConfig(check=CheckOptions(enabled=False)))
    fused = result.to_proto()

    assert result.counts == {"conv_bn": 1}
    assert [n.op_type for n in fused.graph.node] == ["Conv"]
    onnx.checker.check_model(fused, full_check=True)
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = make_session(model).run(None, {"x": x})[0]
    got = make_session(fused).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dropout_in_inference_is_removed_so_patterns_see_through_it() -> None:
    text = (
        HEADER
        + SIGNATURE
        + """ {
 c = Conv<pads = [1, 1, 1, 1]>(x, w)
 d = Dropout(c)
 y = BatchNormalization(d, gamma, beta, mean, var)
}"""
    )
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(_bn_params())
    result = optimize(model, OptimizeConfig())
    assert result.counts == {"conv_bn": 1}
    assert "dropout_elimination" in result.prepasses
    assert result.check is not None and result.check.passed


def test_dropout_forced_into_training_is_kept() -> None:
    text = (
        HEADER
        + SIGNATURE
        + """ {
 c = Conv<pads = [1, 1, 1, 1]>(x, w)
 ratio = Constant<value = float {0.5}>()
 train = Constant<value = bool {1}>()
 d = Dropout(c, ratio, train)
 y = BatchNormalization(d, gamma, beta, mean, var)
}"""
    )
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(_bn_params())
    result = optimize(model, OptimizeConfig(check=CheckOptions(enabled=False)))
    assert result.counts == {}
    assert result.ops_after["Dropout"] == 1


def test_initializer_listed_as_input_is_overridable_and_not_folded() -> None:
    # From IR 4 on, an initializer that is also a graph input is a default the caller
    # may replace: folding it would change the model's meaning.
    model = _model("s = Identity(gamma)")
    gamma = next(t for t in model.graph.initializer if t.name == "gamma")
    model.graph.input.append(onnx.helper.make_tensor_value_info("gamma", gamma.data_type, [C]))
    result = optimize(model, OptimizeConfig(check=CheckOptions(enabled=False)))
    assert result.counts == {}
    reasons = [m.reason for m in result.near_misses if m.pattern == "conv_bn"]
    assert any("is not a constant initializer" in r for r in reasons), reasons


def test_ir3_initializer_inputs_are_constants() -> None:
    model = onnx.parser.parse_model(
        '<ir_version: 3, opset_import: ["" : 9]>\n'
        + SIGNATURE
        + """ {
 c = Conv<pads = [1, 1, 1, 1]>(x, w)
 y = BatchNormalization(c, gamma, beta, mean, var)
}"""
    )
    params = _bn_params()
    model.graph.initializer.extend(params)
    for tensor in params:  # IR < 4 lists every initializer as an input
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
        )
    result = optimize(model, OptimizeConfig())
    assert result.counts == {"conv_bn": 1}
    assert result.check is not None and result.check.passed


def test_symbolic_batch_dim_flows_through_run_time_shapes() -> None:
    # TorchScript exports rebuild shapes at run time (Shape -> Slice -> Concat -> Reshape);
    # per-node inference loses N and S there, whole-graph inference with data
    # propagation keeps them, so the Add is provably of two [N, S, 16] tensors.
    text = (
        HEADER
        + """g (float[N, S, 16] a, float[N, S, 4, 4] b) => (float[N, S, 16] y) {
 full = Shape(a)
 ns = Slice(full, starts, ends)
 shape = Concat<axis = 0>(ns, last)
 r = Reshape(b, shape)
 s = Add(a, r)
 y = Relu(s)
}"""
    )
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(
        nh.from_array(np.array([v], np.int64), name)
        for name, v in (("starts", 0), ("ends", 2), ("last", 16))
    )
    model = ir.serde.deserialize_model(proto)
    assert "shape_inference" in run_prepasses(model, PrepassOptions())

    values = {n.outputs[0].name: n.outputs[0] for n in model.graph}
    want = [ir.SymbolicDim("N"), ir.SymbolicDim("S"), 16]
    for name in ("r", "s"):
        shape = values[name].shape
        assert shape is not None and list(shape) == want, (name, shape)


def test_shape_inference_keeps_large_initializers_and_input_order() -> None:
    text = (
        HEADER
        + """g (float[N, 2048] x) => (float[N, 2048] y) {
 y = Add(x, w)
}"""
    )
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(nh.from_array(np.ones(2048, np.float32), "w"))
    model = ir.serde.deserialize_model(proto)
    modified = SymbolicShapeInferencePass(initializer_limit=16)(model).modified

    assert not modified  # y's shape was already fully known
    assert [v.name for v in model.graph.inputs] == ["x"]
    assert list(model.graph.initializers) == ["w"]
    w = model.graph.initializers["w"]
    assert w.const_value.numpy().sum() == 2048
    # Lent to onnx as an input, w must come back a plain constant, not an overridable
    # default (patterns would otherwise refuse to read it).
    assert not w.is_graph_input()
    assert constant_array(w) is not None


def _expand_by_computed_shape() -> ir.Model:
    """``Expand(c, Where(Equal(Shape(x), -1), 1, Shape(x)))``: how transformers 5's mask
    builders reach the TorchScript export. onnx's data propagation stops at Where and
    Equal; onnxruntime's symbolic inference follows them."""
    text = (
        HEADER
        + """g (float[N, S] x) => (float[N, S] y) {
 s = Shape(x)
 is_minus = Equal(s, minus1)
 t = Where(is_minus, one, s)
 e = Expand(c, t)
 y = Add(e, x)
}"""
    )
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(
        [
            nh.from_array(np.array([-1, -1], np.int64), "minus1"),
            nh.from_array(np.array([1, 1], np.int64), "one"),
            nh.from_array(np.array(2.0, np.float32), "c"),
        ]
    )
    return ir.serde.deserialize_model(proto)


def test_symbolic_dims_through_where_and_equal(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # onnxruntime's infer_shapes would write files here
    model = _expand_by_computed_shape()
    run_prepasses(model, PrepassOptions())
    values = {n.outputs[0].name: n.outputs[0] for n in model.graph}
    assert list(values["e"].shape) == [ir.SymbolicDim("N"), ir.SymbolicDim("S")]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opset", [13, 14, 17])  # the body spells Unsqueeze as 13 does
def test_shape_reads_of_inner_tensors_come_from_the_inputs(opset: int) -> None:
    """``Shape(h)`` of an inner [N, 4] tensor becomes ``Concat(Shape(x)[0:1], [4])``, so
    h no longer escapes a fusion; the model computes the same at every batch size. Below
    opset 15, where Shape has no start and end, the read is a Gather of Shape(x)."""
    text = (
        HEADER.replace('"" : 17', f'"" : {opset}')
        + """g (float[N, 8] x) => (float[N, 4] y) {
 h = MatMul(x, wt)
 s = Shape(h)
 target = Concat<axis = 0>(minus1, two)
 flat = Reshape(h, target)
 r = Relu(flat)
 n = Gather<axis = 0>(s, zero)
 n1 = Unsqueeze(n, zero1)
 shape = Concat<axis = 0>(n1, four)
 y = Reshape(r, shape)
}"""
    )
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.extend(
        [
            nh.from_array(RNG.normal(size=(8, 4)).astype(np.float32), "wt"),
            nh.from_array(np.array([-1], np.int64), "minus1"),
            nh.from_array(np.array([2], np.int64), "two"),
            nh.from_array(np.array([4], np.int64), "four"),
            nh.from_array(np.array(0, np.int64), "zero"),
            nh.from_array(np.array([0], np.int64), "zero1"),
        ]
    )
    model = ir.serde.deserialize_model(proto)
    assert "shape_reads_from_inputs" in run_prepasses(model, PrepassOptions())

    shape_reads = [n for n in model.graph if n.op_type == "Shape"]
    assert [n.inputs[0].name for n in shape_reads] == ["x"]
    if opset >= 15:
        assert shape_reads[0].attributes["start"].value == 0
        assert shape_reads[0].attributes["end"].value == 1
    else:
        assert not shape_reads[0].attributes
        [gather] = [u.node for u in shape_reads[0].outputs[0].uses()]
        assert gather.op_type == "Gather"
        assert gather.inputs[1].const_value.numpy().tolist() == [0]
    fused = ir.serde.serialize_model(model)
    onnx.checker.check_model(fused, full_check=True)
    for batch in (1, 3):
        x = RNG.normal(size=(batch, 8)).astype(np.float32)
        (want,) = make_session(proto).run(None, {"x": x})
        (got,) = make_session(fused).run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=0, atol=0)
