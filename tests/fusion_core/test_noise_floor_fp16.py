"""The check's noise floor for models that compute in float16 (validate/_floor_fp16.py).

The 2-layer fp16 decoder of ``bench/_big_models.py`` (hidden 64) fuses with the default
check now: every norm, both attentions and rotaries, the check passed with no fallback,
the floor reported (its logits are 4e-3 from their own float32 computation, the fused
model about as far from the original: over the float16 default, rtol 1e-2, atol 1e-3,
which a caller's tolerance still holds it to). A fused model with a norm's gamma off by
1-5% or a rotary's halves swapped still fails. A float32 model gets no floor. The float32
computation itself (``in_float32``) is checked on random fp16 graphs against numpy in
float64: inputs, initializers, Constants, ConstantOfShape, Casts to float16 and If
branches widened, the model put back byte for byte after.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.ir import proto_with_weights
from autofusion.fusion_core.report import build_report, report_schema
from autofusion.fusion_core.validate import (
    FLOAT16,
    FLOAT16_MULTIPLE,
    MISMATCH,
    compare_models,
    float16_parts,
    in_float32,
    make_session,
)
from tests.fusion_core.spelling_settings import EXAMPLES, SPELLINGS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _big_models
import _big_weights

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TINY = replace(_big_models.shape_for_size(1 << 20), layers=2)
FP16 = _big_weights.Weights("fp16")
FP16_DEFAULT = {"rtol": 1e-2, "atol": 1e-3}  # validate._stats' default for float16
NORM, GQA = "SimplifiedLayerNormalization", "com.microsoft::GroupQueryAttention"
# The spellings profile's budget (25 in make test, more in the corpus tier); the decoder's
# wrong fusions cost a comparison each, so they take a third of it
F16, F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("fp16")
    info = _big_models.make_decoder(folder, TINY, seed=5, weights=FP16)
    result = optimize(info["path"], OptimizeConfig(target="onnxruntime"))
    return {"path": info["path"], "result": result, "fused": proto_with_weights(result.model)}


def test_the_fp16_decoder_fuses_every_norm_with_the_default_check(decoder) -> None:
    result = decoder["result"]
    check = result.check
    assert check.passed and result.fallback is None, check.to_dict()["reason"]
    assert result.ops_after[NORM] == 2 * TINY.layers + 1
    assert result.ops_after[GQA] == TINY.layers
    assert result.ops_after["com.microsoft::RotaryEmbedding"] == 2 * TINY.layers
    floor = check.noise_floor
    assert floor.kind == FLOAT16 and floor.perturbation is None and floor.quantizers == {}
    assert floor.float16["float16 outputs"] == 1 and floor.float16["Casts to float16"] > 0
    (logits,) = floor.outputs
    assert 1e-3 < logits.floor_abs < 2e-2  # fp16 rounding at logits of |4|, not 0, not O(1)
    assert logits.atol == pytest.approx(FLOAT16_MULTIPLE * logits.floor_abs, rel=1e-12)
    assert logits.mean_limit == max(1e-3, FLOAT16_MULTIPLE * logits.floor_mean)
    (out,) = check.outputs
    assert out.tolerance_source == "noise floor" and out.rtol == FP16_DEFAULT["rtol"]
    assert out.atol == logits.atol and out.max_abs_diff > FP16_DEFAULT["atol"]
    assert floor.reason.startswith("the model computes in float16 (")


def test_the_report_with_the_fp16_floor_matches_the_schema(decoder) -> None:
    report = json.loads(json.dumps(build_report(decoder["result"])))
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    floor = report["check"]["noise_floor"]
    assert floor["kind"] == "float16" and floor["perturbation"] is None
    assert floor["multiple"] == FLOAT16_MULTIPLE and floor["float16"]["float16 outputs"] == 1
    assert floor["outputs"][0]["floor_abs"] > 0


def test_a_tolerance_the_caller_gave_is_kept(decoder) -> None:
    """The float16 default, given by name: the right fusions fail it (the floor is why)."""
    original = onnx.load(decoder["path"])
    check = compare_models(original, decoder["fused"], tolerances={"logits": FP16_DEFAULT})
    assert not check.passed and check.failure == MISMATCH
    assert check.outputs[0].tolerance_source == "override"
    assert check.noise_floor.kind == FLOAT16 and check.noise_floor.outputs == []


def _with_gamma(fused: onnx.ModelProto, norm: int, scale: float) -> onnx.ModelProto:
    model = onnx.ModelProto()
    model.CopyFrom(fused)
    norms = [n for n in model.graph.node if n.op_type == NORM]
    gamma = next(t for t in model.graph.initializer if t.name == norms[norm].input[1])
    wrong = nh.to_array(gamma).astype(np.float32) * np.float32(scale)
    gamma.CopyFrom(nh.from_array(wrong.astype(nh.to_array(gamma).dtype), gamma.name))
    return model


@settings(
    max_examples=max(3, EXAMPLES // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    norm=st.integers(0, 2 * TINY.layers),
    off=st.floats(0.01, 0.05),
    sign=st.sampled_from([-1.0, 1.0]),
)
def test_a_wrong_gamma_is_not_hidden_by_the_floor(decoder, norm, off, sign) -> None:
    wrong = _with_gamma(decoder["fused"], norm, 1.0 + sign * off)
    check = compare_models(onnx.load(decoder["path"]), wrong)
    assert not check.passed and check.failure == MISMATCH, (norm, off, check.outputs[0])
    (logits,) = check.noise_floor.outputs
    assert check.outputs[0].mean_abs_diff > 2 * logits.mean_limit  # measured: 6x at least


@pytest.mark.parametrize("which", [0, -1])
def test_a_rotary_with_its_halves_swapped_is_not_hidden_by_the_floor(decoder, which) -> None:
    wrong = onnx.ModelProto()
    wrong.CopyFrom(decoder["fused"])
    rotary = [n for n in wrong.graph.node if n.op_type == "RotaryEmbedding"][which]
    rotary.attribute.append(oh.make_attribute("interleaved", 1))  # was rotate_half's
    check = compare_models(onnx.load(decoder["path"]), wrong)
    assert not check.passed and check.failure == MISMATCH
    assert check.outputs[0].mean_abs_diff > 5 * check.noise_floor.outputs[0].mean_limit


def test_a_float32_model_gets_no_floor() -> None:
    text = """<ir_version: 8, opset_import: ["" : 18]>
        g (float[2, 8] x) => (float[2, 8] y) {
            s = Sigmoid(x)
            y = Mul(x, s)
        }"""
    model = onnx.parser.parse_model(text)
    assert float16_parts(model) == {}
    check = compare_models(model, model)
    assert check.passed and check.noise_floor is None
    assert check.outputs[0].tolerance_source == "configured"


def test_a_mixed_precision_model_widens_its_float32_outputs() -> None:
    """float32 in and out, float16 inside (onnxconverter-common's keep_io_types): the
    configured (fp32) tolerance is what the floor widens. The "fused" model lacks one
    float16 layout step (a Transpose pair), so onnxruntime rounds once less (on the CPU it
    computes an op without a float16 kernel in float32 and drops the Casts between two
    such ops): it passes with the floor, not without."""
    ops = ["matmul", "layout", "sigmoid", "layout", "matmul"]
    spec = _Spec(rows=4, dims=[16, 16, 16], ops=ops, keep_io=True)
    model, _ = _random_model(spec, np.random.default_rng(0))
    fused, _ = _random_model(replace(spec, ops=ops[:3] + ops[4:]), np.random.default_rng(0))
    tight = dict(rtol=1e-6, atol=1e-7)
    check = compare_models(model, fused, **tight)
    assert check.passed and check.noise_floor.kind == FLOAT16
    (out,) = check.noise_floor.outputs
    assert out.floor_abs > 1e-4 and check.outputs[0].tolerance_source == "noise floor"
    assert check.outputs[0].max_abs_diff > 10 * tight["atol"]
    assert not compare_models(model, fused, tolerances={"y": tight}).passed


def test_a_float16_part_it_cannot_widen_leaves_the_tolerance_as_it_was() -> None:
    """A model-local function casting to float16 inside is not widened: the edited model
    does not load, the floor says why, and the check runs with the float16 default."""
    text = """<ir_version: 8, opset_import: ["" : 18, "local" : 1]>
        g (float16[2, 8] x) => (float16[2, 8] y) {
            w = Cast<to = 1>(x)
            h = local.narrow(w)
            y = Mul(h, x)
        }
        <domain: "local", opset_import: ["" : 18]>
        narrow (a) => (b) {
            b = Cast<to = 10>(a)
        }"""
    model = onnx.parser.parse_model(text)
    check = compare_models(model, model)
    assert check.passed and check.noise_floor.error.startswith("the noise floor could not")
    assert check.outputs[0].tolerance_source == "default for float16"
    assert check.noise_floor.outputs == []


# ---- the float32 computation ----------------------------------------------------------

OPS = ["matmul", "bias", "constant", "fill", "sigmoid", "tanh", "norm", "branch", "layout"]


@dataclass(frozen=True)
class _Spec:
    rows: int
    dims: list[int]  # the input's width, then each MatMul's
    ops: list[str]
    keep_io: bool  # float32 in and out, float16 inside


@st.composite
def specs(draw) -> _Spec:
    ops = draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=6))
    dims = [draw(st.integers(2, 24)) for _ in range(1 + ops.count("matmul"))]
    return _Spec(draw(st.integers(1, 4)), dims, ops, draw(st.booleans()))


def _f16(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float16)


class _Graph:
    """An fp16 graph built node by node, with its float64 reference beside it."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.nodes, self.inits, self.k = rng, [], [], 0

    def name(self, stem: str) -> str:
        self.k += 1
        return f"{stem}{self.k}"

    def init(self, array: np.ndarray) -> str:
        name = self.name("w")
        self.inits.append(nh.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(oh.make_node(op, inputs, [out], **attrs))
        return out


def _apply(g: _Graph, op: str, x: str, ref: np.ndarray, width: int, out: int) -> tuple:
    """One op of the chain on ``x`` (``width`` columns): its output, reference, width."""
    if op == "matmul":
        w = _f16(g.rng, width, out, scale=width**-0.5)
        return g.node("MatMul", [x, g.init(w)]), ref @ w.astype(np.float64), out
    if op in ("bias", "constant", "fill"):
        value = _f16(g.rng, width) if op == "bias" else _f16(g.rng, 1)
        if op == "bias":
            other = g.init(value)
        elif op == "constant":
            other = g.node("Constant", [], value=nh.from_array(value))
        else:
            other = g.node("ConstantOfShape", [g.node("Shape", [x])], value=nh.from_array(value))
        return g.node("Add", [x, other]), ref + value.astype(np.float64), width
    if op == "layout":  # fp16 data movement: onnxruntime keeps the rounding before it
        back = g.node("Transpose", [g.node("Transpose", [x], perm=[1, 0])], perm=[1, 0])
        return back, ref, width
    if op in ("sigmoid", "tanh"):
        f = (lambda v: 1 / (1 + np.exp(-v))) if op == "sigmoid" else np.tanh
        return g.node(op.capitalize(), [x]), f(ref), width
    if op == "norm":  # transformers' fp16 RMS norm: in float32 between two Casts
        wide = g.node("Cast", [x], to=F32)
        axes = g.init(np.array([-1], np.int64))
        mean = g.node("ReduceMean", [g.node("Mul", [wide, wide]), axes], keepdims=1)
        unit = g.node("Div", [wide, g.node("Sqrt", [mean])])
        root = np.sqrt((ref * ref).mean(axis=-1, keepdims=True))
        return g.node("Cast", [unit], to=F16), ref / root, width
    return _branch(g, x, ref, width)


def _branch(g: _Graph, x: str, ref: np.ndarray, width: int) -> tuple:
    """If(flag): x times a branch's own fp16 initializer, else x cast through float."""
    two = np.array(1.7, np.float16)
    then = oh.make_graph(
        [oh.make_node("Mul", [x, "two"], ["t"])],
        "then",
        [],
        [oh.make_tensor_value_info("t", F16, None)],
        [nh.from_array(two, "two")],
    )
    round_trip = [
        oh.make_node("Cast", [x], ["e32"], to=F32),
        oh.make_node("Cast", ["e32"], ["e"], to=F16),
    ]
    otherwise = oh.make_graph(round_trip, "else", [], [oh.make_tensor_value_info("e", F16, None)])
    out = g.node("If", ["flag"], then_branch=then, else_branch=otherwise)
    return out, ref * np.float64(two), width  # fed flag = True


def _random_model(spec: _Spec, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict]:
    """The model of ``spec`` and its feeds; ``feeds["reference"]``: its output in float64."""
    g = _Graph(rng)
    x16 = _f16(rng, spec.rows, spec.dims[0])
    x = g.node("Cast", ["x"], to=F16) if spec.keep_io else "x"
    ref, width, dims = x16.astype(np.float64), spec.dims[0], iter(spec.dims[1:])
    for op in spec.ops:
        out = next(dims) if op == "matmul" else width
        x, ref, width = _apply(g, op, x, ref, width, out)
    last = oh.make_node("Cast", [x], ["y"], to=F32) if spec.keep_io else None
    g.nodes.append(last or oh.make_node("Identity", [x], ["y"]))
    io = F32 if spec.keep_io else F16
    graph = oh.make_graph(
        g.nodes,
        "random_fp16",
        [
            oh.make_tensor_value_info("x", io, [spec.rows, spec.dims[0]]),
            oh.make_tensor_value_info("flag", onnx.TensorProto.BOOL, []),
        ],
        [oh.make_tensor_value_info("y", io, [spec.rows, width])],
        g.inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    feeds = {"x": x16.astype(np.float32) if spec.keep_io else x16, "flag": np.array(True)}
    return model, {"feeds": feeds, "reference": ref}


@SPELLINGS
@given(specs(), st.integers(0, 2**16))
def test_in_float32_computes_the_graph_in_float32_and_puts_it_back(spec, seed) -> None:
    model, made = _random_model(spec, np.random.default_rng(seed))
    before = model.SerializeToString()
    assert float16_parts(model)
    with in_float32(model):
        session = make_session(model)
    assert model.SerializeToString() == before  # put back byte for byte
    (y,) = session.run(None, made["feeds"])
    assert y.dtype == np.float32
    # float32 sums of at most 24 terms, values O(1): about 1e-6; fp16 would be 1e-3
    np.testing.assert_allclose(y, made["reference"], rtol=2e-5, atol=2e-5)
