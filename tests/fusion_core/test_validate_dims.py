"""The check picks input sizes the original model accepts, and says so when none fits."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.parser
import pytest

from autofusion.fusion_core.validate import (
    ORIGINAL_CANNOT_RUN,
    candidate_dims,
    compare_models,
    input_dims,
    random_inputs,
)
from autofusion.fusion_core.validate._dims import evaluate_dim

RTOL, ATOL = 1e-3, 1e-4


def _unnamed_and_negative() -> onnx.ModelProto:
    """paddle2onnx's way: ``-1`` for the batch, nothing at all for the spatial dims."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [-1, 3, None, None])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def test_unnamed_and_negative_dims_get_names_and_image_sizes():
    model = _unnamed_and_negative()
    dims = input_dims(model)
    assert dims.roles == {"x[0]": "batch", "x[2]": "spatial", "x[3]": "spatial"}
    chosen = candidate_dims(dims, {}, 0)
    assert chosen == {"x[0]": 1, "x[2]": 224, "x[3]": 224}
    feed = random_inputs(model, seed=0, dims=chosen)
    assert feed["x"].shape == (1, 3, 224, 224)


def test_a_name_given_by_the_user_wins():
    dims = input_dims(_unnamed_and_negative())
    assert candidate_dims(dims, {"x[2]": 48}, 3)["x[2]"] == 48


def _decoder_with_cache() -> onnx.ModelProto:
    """optimum-onnx's decoder inputs: the mask spans the past and the new tokens."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (int64[batch_size, sequence_length] input_ids,
       int64[batch_size, TOTAL] attention_mask,
       float[batch_size, 2, past_sequence_length, 8] past_key)
      => (float[batch_size, 2, N, 8] present_key) {
        ids = Cast<to = 1>(input_ids)
        e = Unsqueeze(ids, axes)
        e2 = Unsqueeze(e, axes3)
        k_new = Expand(e2, shape)
        present_key = Concat<axis = 2>(past_key, k_new)
        m = Cast<to = 1>(attention_mask)
        total = Shape<start = 1, end = 2>(m)
        kshape = Shape<start = 2, end = 3>(present_key)
        same = Equal(total, kshape)
        ok = ReduceMin<keepdims = 0>(same_i)
        same_i = Cast<to = 7>(same)
    }"""
    model = onnx.parser.parse_model(text)
    # ONNX text has no syntax for an expression dim: set it as optimum-onnx writes it
    mask = next(v for v in model.graph.input if v.name == "attention_mask")
    mask.type.tensor_type.shape.dim[1].dim_param = "past_sequence_length + sequence_length"
    model.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
            onnx.numpy_helper.from_array(np.array([3], np.int64), "axes3"),
            onnx.numpy_helper.from_array(np.array([1, 2, 1, 8], np.int64), "shape"),
        ]
    )
    return model


def test_an_expression_dim_is_computed_from_its_names():
    model = _decoder_with_cache()
    dims = input_dims(model)
    assert dims.roles == {
        "batch_size": "batch",
        "sequence_length": "sequence",
        "past_sequence_length": "past",
    }
    assert dims.expressions == ("past_sequence_length + sequence_length",)
    chosen = candidate_dims(dims, {}, 0)
    feed = random_inputs(model, seed=0, dims=chosen)
    past, seq = chosen["past_sequence_length"], chosen["sequence_length"]
    assert feed["attention_mask"].shape == (1, past + seq)
    assert feed["past_key"].shape == (1, 2, past, 8)
    assert feed["input_ids"].shape == (1, seq)


def test_a_total_length_is_the_past_plus_the_sequence():
    """dynamo names the mask's length on its own (``total_sequence_length``): sized apart
    from the cache and the new tokens, a decoder would not run (its mask must be as long
    as the Concat of the cache)."""
    model = _decoder_with_cache()
    mask = next(v for v in model.graph.input if v.name == "attention_mask")
    mask.type.tensor_type.shape.dim[1].dim_param = "total_sequence_length"
    dims = input_dims(model)
    for k in range(3):
        chosen = candidate_dims(dims, {}, k)
        total = chosen["past_sequence_length"] + chosen["sequence_length"]
        assert chosen["total_sequence_length"] == total, chosen
    given = candidate_dims(dims, {"total_sequence_length": 7}, 0)
    assert given["total_sequence_length"] == 7  # what the user says wins


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [
        ("a + b", {"a": 3, "b": 4}, 7),
        ("2*seq - 1", {"seq": 5}, 9),
        ("(h + 1) // 2", {"h": 7}, 4),
        ("h / 2", {"h": 7}, 3),
        ("a + b", {"a": 3}, None),  # an unknown name
        ("__import__('os')", {}, None),  # not arithmetic: never evaluated
        ("x[2]", {"x[2]": 640}, 640),
    ],
    ids=["sum", "linear", "floor-div", "div-is-floor", "unknown-name", "call", "unnamed-dim"],
)
def test_evaluate_dim(text, values, expected):
    assert evaluate_dim(text, values) == expected


def _pool_then_upsample() -> onnx.ModelProto:
    """A detector's neck in two ops: the Add fails unless H is a multiple of 64 (a 1x1
    image pools to nothing; 224 pools to 3 rows, which upsample to 192)."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, H, W] x) => (float[1, 3, H, W] y) {
        p = MaxPool<kernel_shape = [64, 1], strides = [64, 1]>(x)
        u = Resize<mode = "nearest">(p, , scales)
        y = Add(u, x)
    }"""
    model = onnx.parser.parse_model(text)
    scales = np.array([1, 1, 64, 1], np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(scales, "scales"))
    return model


def test_the_check_moves_on_to_a_size_the_original_accepts():
    model = _pool_then_upsample()
    result = compare_models(model, model, samples=1, rtol=RTOL, atol=ATOL)
    assert result.passed, result.error
    assert result.profiles[0].dims == {"H": 256, "W": 256}  # 224 failed, 256 runs


def test_sizes_the_user_gave_are_kept_while_the_others_move_on():
    model = _pool_then_upsample()
    result = compare_models(model, model, samples=1, dims={"W": 8}, rtol=RTOL, atol=ATOL)
    assert result.passed and result.profiles[0].dims == {"H": 256, "W": 8}


def test_when_the_original_runs_on_no_candidate_the_check_says_so():
    model = _pool_then_upsample()
    result = compare_models(model, model, samples=1, dims={"H": 96})
    assert not result.passed and result.failure == ORIGINAL_CANNOT_RUN
    assert "the original model cannot run on generated inputs" in result.error
    assert "does not match" not in result.error and "--shape NAME=VALUE for W" in result.error
    assert result.dynamic_dims == ["H", "W"]


def test_a_name_seen_only_in_a_multiple_sizes_the_dim_not_itself():
    """dynamo writes a YOLO input as [batch, 3, 32*h, 32*w]: h is 7 for a 224 image."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, "32*h", "32*w"])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    dims = input_dims(model)
    assert candidate_dims(dims, {}, 0) == {"batch": 1, "h": 7, "w": 7}
    assert candidate_dims(dims, {}, 3) == {"batch": 1, "h": 20, "w": 20}  # 640
    assert random_inputs(model, seed=0, dims=candidate_dims(dims, {}, 0))["x"].shape == (
        1,
        3,
        224,
        224,
    )


def test_a_sample_rate_input_gets_the_common_rate():
    """silero-vad branches on ``sr``: 0 or 1 runs no branch it has."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, N] audio, int64 sr) => (float[1, N] y) {
        r = Cast<to = 1>(sr)
        y = Mul(audio, r)
    }"""
    model = onnx.parser.parse_model(text)
    feed = random_inputs(model, seed=0, dims={"N": 4})
    assert feed["sr"].dtype == np.int64 and int(feed["sr"]) == 16000


def test_an_original_onnxruntime_cannot_load_is_not_a_mismatch():
    text = """<ir_version: 8, opset_import: ["" : 17, "ai.custom" : 1]>
    g (float[2] x) => (float[2] y) { y = ai.custom.Mystery(x) }"""
    model = onnx.parser.parse_model(text)
    result = compare_models(model, model, samples=1)
    assert result.failure == ORIGINAL_CANNOT_RUN
    assert "onnxruntime cannot load the original model" in result.error
    assert "--no-check" in result.error
