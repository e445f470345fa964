"""fp16 decoders fuse as fp32 ones do (issue 29): the synthetic decoder of
``bench/_big_models.py`` with fp16 weights, as transformers exports ``model.half()``
(the RMS norms computed in float32 between two Casts, the rotary angles cast to fp16,
attention and SwiGLU in fp16), and the fp16 forms of each op one at a time.

Tolerance. fp16 keeps 11 bits: at the decoder's logits (|max| about 4) one rounding is
2e-3, and the original graph itself is 4e-3 to 5e-3 away from the same graph computed
in float32 (measured, 8 batches). A fused op rounds at other places, so fused and
original differ by about the sum of both errors (up to 8e-3 measured), more than the
engine's default fp16 tolerance (rtol 1e-2, atol 1e-3) on logits near 0. So the decoder
is held to what an fp16 model can promise: against the float32 computation of the
original graph, the fused model's error is at most twice the original's own (1.2x
measured), and fused and original agree within rtol 1e-2, atol 2e-2. A wrong fusion
(a rotated half, a missing gamma, a lost mask) moves logits by O(0.1-1). The single-op
models compare with rtol 1e-2, atol 2e-3 (a couple of fp16 roundings at |x| up to 4).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnxruntime as ort
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.testing import misses, optimize_quiet, run_both

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import _big_models
import _big_weights

TINY = replace(_big_models.shape_for_size(1 << 20), layers=2)
FP16 = _big_weights.Weights("fp16")
AGREE = dict(rtol=1e-2, atol=2e-2)  # fused against original, the decoder's logits
ONE_OP = dict(rtol=1e-2, atol=2e-3)  # fused against original, one op
GQA, ROTARY = "com.microsoft::GroupQueryAttention", "com.microsoft::RotaryEmbedding"


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> dict:
    return _big_models.make_decoder(tmp_path_factory.mktemp("fp16"), TINY, seed=5, weights=FP16)


def _session(model: str | Path | onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _in_float32(path: str) -> onnx.ModelProto:
    """The same graph computed in float32: fp16 weights widened, Casts to fp16 to float."""
    model = onnx.load(path)
    for k, tensor in enumerate(model.graph.initializer):
        if tensor.data_type == onnx.TensorProto.FLOAT16:
            wide = nh.from_array(nh.to_array(tensor).astype(np.float32), tensor.name)
            model.graph.initializer[k].CopyFrom(wide)
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == onnx.TensorProto.FLOAT16:
                attr.i = onnx.TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return model


def _feeds(rng: np.random.Generator, batch: int = 2, seq: int = 16) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[-1, : rng.integers(1, 4)] = 0  # left-padded, as batched generation pads
    return {
        "input_ids": rng.integers(0, TINY.vocab, (batch, seq)),
        "attention_mask": mask,
        "position_ids": np.tile(np.arange(seq), (batch, 1)),
    }


def test_the_fp16_decoder_fuses_each_layer_as_fp32(decoder) -> None:
    config = OptimizeConfig.model_validate({"target": "onnxruntime", "check": {"enabled": False}})
    ops = optimize(decoder["path"], config).ops_after
    layers = TINY.layers
    assert ops[GQA] == layers and ops[ROTARY] == 2 * layers
    assert ops["com.microsoft::QuickGelu"] == layers
    assert ops["SimplifiedLayerNormalization"] == 2 * layers + 1  # with their gammas
    # position ids, the padding mask, the GQA lengths (2), cos and sin: no norm's Casts
    assert ops["Cast"] == 6
    for written_out in ("Softmax", "Pow", "Sigmoid", "Neg"):
        assert written_out not in ops, written_out


def test_the_fused_fp16_decoder_is_as_close_to_float32_as_the_original(decoder, tmp_path) -> None:
    config = OptimizeConfig.model_validate({"target": "onnxruntime", "check": {"enabled": False}})
    fused_path = tmp_path / "fused.onnx"
    save_model(optimize(decoder["path"], config).model, fused_path)
    truth, original, fused = (
        _session(m) for m in (_in_float32(decoder["path"]), decoder["path"], fused_path)
    )
    rng = np.random.default_rng(1)
    for _ in range(3):
        feeds = _feeds(rng)
        rows = feeds["attention_mask"].astype(bool)  # a padded row attends to nothing real
        exact = truth.run(None, feeds)[0][rows]
        before = original.run(None, feeds)[0][rows].astype(np.float32)
        after = fused.run(None, feeds)[0][rows].astype(np.float32)
        assert np.abs(exact).max() > 1  # logits, not a vanished signal
        own = np.abs(before - exact).max()
        assert np.abs(after - exact).max() <= 2 * own + 1e-3, (np.abs(after - exact).max(), own)
        np.testing.assert_allclose(after, before, **AGREE)


def test_the_checked_fp16_decoder_keeps_attention_and_rotary(decoder) -> None:
    result = optimize(decoder["path"], OptimizeConfig(target="onnxruntime"))
    assert result.check.passed
    assert result.ops_after[GQA] == TINY.layers and result.ops_after[ROTARY] == 2 * TINY.layers


# ---- one op at a time ------------------------------------------------------------------


def _fp16_model(text: str, initializers: dict[str, np.ndarray]) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    for name, array in initializers.items():
        model.graph.initializer.append(nh.from_array(array, name))
    onnx.checker.check_model(model, full_check=True)
    return model


_HEADER = '<ir_version: 8, opset_import: ["" : 18]>'


def _cast_norm(signature: str, widen: str, back_to: int, gamma: np.ndarray) -> onnx.ModelProto:
    """transformers' fp16 RMS norm: ``w = Cast(widen, float)``, the norm of ``w``, Cast
    back (``back_to``), times ``gamma``; ``signature`` declares the graph, whose first
    lines may compute ``widen``."""
    body = f"""
            w = Cast<to = 1>({widen})
            sq = Pow(w, two)
            ms = ReduceMean<keepdims = 1>(sq, axes)
            var = Add(ms, eps)
            root = Sqrt(var)
            unit = Div(w, root)
            n = Cast<to = {back_to}>(unit)
            y = Mul(n, gamma)
        }}"""
    constants = {
        "two": np.array(2.0, np.float32),
        "eps": np.array(1e-6, np.float32),
        "axes": np.array([-1], np.int64),
        "gamma": gamma,
    }
    return _fp16_model(_HEADER + signature + body, constants)


def _residual_norm() -> onnx.ModelProto:
    """A residual Add, then the fp16 RMS norm between Casts, gamma in fp16."""
    signature = """
        g (float16[2, 3, 16] a, float16[2, 3, 16] b) => (float16[2, 3, 16] y) {
            s = Add(a, b)"""
    gamma = np.random.default_rng(0).uniform(0.5, 1.5, 16).astype(np.float16)
    return _cast_norm(signature, "s", onnx.TensorProto.FLOAT16, gamma)


def test_an_fp16_norm_between_casts_fuses_with_its_gamma() -> None:
    model = _residual_norm()
    result = optimize_quiet(model, target="onnxruntime", exclude=["skip_rms_norm"])
    ops = Counter(n.op_type for n in result.to_proto().graph.node)
    assert ops == Counter({"Add": 1, "SimplifiedLayerNormalization": 1})
    run_both(model, result.to_proto(), **ONE_OP)


def test_an_fp16_residual_norm_becomes_skip_simplified_layer_normalization() -> None:
    model = _residual_norm()
    result = optimize_quiet(model, target="onnxruntime")
    assert [n.op_type for n in result.to_proto().graph.node] == ["SkipSimplifiedLayerNormalization"]
    run_both(model, result.to_proto(), **ONE_OP)


def test_a_norm_cast_back_to_another_type_is_refused() -> None:
    """Cast up, the norm, Cast back to double from an fp16 input: one fused op in x's
    type cannot write it."""
    signature = """
        g (float16[2, 16] x) => (double[2, 16] y) {"""
    model = _cast_norm(signature, "x", onnx.TensorProto.DOUBLE, np.linspace(0.5, 1.5, 16))
    result = optimize_quiet(model, target="onnxruntime")
    assert any("cast back to DOUBLE" in m for m in misses(result, "rms_norm")), result.near_misses
    run_both(model, result.to_proto(), **ONE_OP)


def test_fp16_silu_becomes_quick_gelu() -> None:
    text = """
        g (float16[4, 32] x) => (float16[4, 32] y) {
            s = Sigmoid(x)
            y = Mul(x, s)
        }"""
    model = _fp16_model(_HEADER + text, {})
    result = optimize_quiet(model, target="onnxruntime")
    assert [n.op_type for n in result.to_proto().graph.node] == ["QuickGelu"]
    run_both(model, result.to_proto(), **ONE_OP)
