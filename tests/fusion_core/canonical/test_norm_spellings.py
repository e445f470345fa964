"""Generated spellings of RMSNorm and LayerNorm blocks: each fuses exactly once, exactly.

A generator (hypothesis) writes one normalization block with ``onnx.helper``, drawing
independently how each step is spelled, the ways the exporters and families of issue 24
write them:

* the square: ``Pow(d, 2)`` or ``Mul(d, d)``;
* each mean: ``ReduceMean`` (axes as the attribute below opset 18, as an input from
  it; ``-1`` or ``rank - 1``), or ``ReduceSum`` divided by N (``Div(s, N)``) or times
  ``1 / N``; an RMS norm's squares also summed and not divided (an L2 norm: nGPT);
* epsilon added either way round (``Add(v, eps)``, ``Add(eps, v)``) or not at all (the
  dynamo export of Helium), eps from 1e-12 to 1e-3;
* the inverse RMS: ``Div(d, Sqrt(u))``, ``Mul(d, Reciprocal(Sqrt(u)))``,
  ``Mul(d, Pow(u, -0.5))`` (Gemma-4), ``Mul(d, Div(1, Sqrt(u)))`` (torch.rsqrt through
  TorchScript), the Mul either way round;
* a LayerNorm's centering: ``Sub(x, mean)`` or ``Add(x, Neg(mean))`` either way round;
* gamma plain, ``1 + gamma`` (Gemma's, an Add of a constant that constant folding
  folds), or none (Gemma-4's value norm), multiplied either way round;
* float32, or float16 widened as transformers writes it (Cast to float, the norm, Cast
  back, then gamma in float16);
* the hidden size, the batch dimensions (rank 2 to 4) and the opset (17, 18, 23).

Every block must come out as one fused op on the onnxruntime target: a LayerNorm as
``LayerNormalization``, an RMSNorm as ``RMSNormalization`` at opset 23 and below it as
onnxruntime's ``SimplifiedLayerNormalization``, with nothing of the written-out block
left; and compute what the original computes (onnxruntime, its optimizations off).
Tolerances: float32 rtol 1e-4, atol 1e-5 (the kernel sums in another order and takes
``1 / sqrt`` once where the graph rounds each step); float16 rtol = atol = 4e-3 (the
fused op rounds its fp16 result once where the graph rounds the norm and then its
product with gamma: two fp16 roundings of values near 1, 2 ** -10 each).

No spelling here is left out: each is a mean, a root or a sum the canonical rule
``norm_spelling`` proves equal to the one the patterns read.

The example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``, 200 in
the corpus tier).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL_FP32 = dict(rtol=1e-4, atol=1e-5)
TOL_FP16 = dict(rtol=4e-3, atol=4e-3)
# What a written-out block is made of; none may be left after the fusion.
WRITTEN_OUT = {"ReduceMean", "ReduceSum", "Sqrt", "Reciprocal", "Pow", "Neg", "Sub", "Div"}


@dataclass(frozen=True)
class Norm:
    kind: str  # "rms" or "layer"
    square: str  # "pow" or "mul"
    means: tuple[str, str]  # of x (a LayerNorm's) and of the squares: "mean", "sum_div", ...
    last_axis_positive: bool  # axes [rank - 1] rather than [-1]
    eps: float | None  # None: no epsilon added
    eps_first: bool  # Add(eps, v)
    inverse: str  # "div", "reciprocal", "pow", "div_one"
    inverse_first: bool  # Mul(r, d)
    centering: str  # a LayerNorm's: "sub", "neg", "neg_first"
    gamma: str  # "plain", "one_plus", "none"
    gamma_first: bool  # Mul(gamma, y)
    fp16: bool
    dims: tuple[int, ...]  # the batch dimensions, then the hidden size
    opset: int


@st.composite
def norms(draw) -> Norm:
    kind = draw(st.sampled_from(["rms", "layer"]))
    mean = st.sampled_from(["mean", "sum_div", "sum_mul"])
    # an RMS norm's squares may be summed, not averaged: an L2 norm (nGPT)
    squares = st.sampled_from(["mean", "sum_div", "sum_mul", *(["sum"] if kind == "rms" else [])])
    batch = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return Norm(
        kind=kind,
        square=draw(st.sampled_from(["pow", "mul"])),
        means=(draw(mean), draw(squares)),
        last_axis_positive=draw(st.booleans()),
        eps=draw(st.sampled_from([None, 1e-12, 1e-6, 1e-5, 1e-3])),
        eps_first=draw(st.booleans()),
        inverse=draw(st.sampled_from(["div", "reciprocal", "pow", "div_one"])),
        inverse_first=draw(st.booleans()),
        centering=draw(st.sampled_from(["sub", "neg", "neg_first"])),
        gamma=draw(st.sampled_from(["plain", "one_plus", "none"])),
        gamma_first=draw(st.booleans()),
        fp16=draw(st.booleans()),
        dims=(*batch, draw(st.integers(2, 48))),
        opset=draw(st.sampled_from([17, 18, 23])),
    )


class _Graph:
    """The nodes and initializers of one model, with fresh names."""

    def __init__(self, n: Norm, rng: np.random.Generator) -> None:
        self.n, self.rng = n, rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def op(self, op: str, *inputs: str, **attrs) -> str:
        out = f"t{len(self.nodes)}"
        self.nodes.append(oh.make_node(op, list(inputs), [out], name=f"{op}_{out}", **attrs))
        return out

    def const(self, value, dtype=np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(nh.from_array(np.asarray(value, dtype), name))
        return name

    def both(self, op: str, a: str, b: str, first_b: bool) -> str:
        return self.op(op, b, a) if first_b else self.op(op, a, b)

    def mean(self, t: str, spelling: str) -> str:
        n = self.n
        axis = len(n.dims) - 1 if n.last_axis_positive else -1
        axes = self.const([axis], np.int64)
        if spelling == "mean":
            if n.opset >= 18:
                return self.op("ReduceMean", t, axes, keepdims=1)
            return self.op("ReduceMean", t, axes=[axis], keepdims=1)
        summed = self.op("ReduceSum", t, axes, keepdims=1)
        if spelling == "sum":  # an L2 norm's sum of squares: sqrt(N) times an RMS norm
            return summed
        if spelling == "sum_div":
            return self.op("Div", summed, self.const(float(n.dims[-1])))
        return self.op("Mul", summed, self.const(1.0 / n.dims[-1]))


def _normalized(g: _Graph, d: str) -> str:
    """``d`` divided by its RMS, spelled as the draw says."""
    n = g.n
    square = g.op("Pow", d, g.const(2.0)) if n.square == "pow" else g.op("Mul", d, d)
    u = g.mean(square, n.means[1])
    if n.eps is not None:
        u = g.both("Add", u, g.const(n.eps), n.eps_first)
    if n.inverse == "pow":
        return g.both("Mul", d, g.op("Pow", u, g.const(-0.5)), n.inverse_first)
    s = g.op("Sqrt", u)
    if n.inverse == "div":
        return g.op("Div", d, s)
    inverse = g.op("Reciprocal", s) if n.inverse == "reciprocal" else g.op("Div", g.const(1.0), s)
    return g.both("Mul", d, inverse, n.inverse_first)


def norm_model(n: Norm) -> onnx.ModelProto:
    rng = np.random.default_rng(zlib.crc32(repr(n).encode()))  # hash() of str varies
    g = _Graph(n, rng)
    elem = TensorProto.FLOAT16 if n.fp16 else TensorProto.FLOAT
    x = g.op("Cast", "x", to=TensorProto.FLOAT) if n.fp16 else "x"
    d = x
    if n.kind == "layer":
        mean = g.mean(x, n.means[0])
        if n.centering == "sub":
            d = g.op("Sub", x, mean)
        else:
            d = g.both("Add", x, g.op("Neg", mean), n.centering == "neg_first")
    y = _normalized(g, d)
    if n.fp16:
        y = g.op("Cast", y, to=TensorProto.FLOAT16)
    if n.gamma != "none":
        dtype = np.float16 if n.fp16 else np.float32
        gamma = g.const(rng.uniform(0.5, 1.5, n.dims[-1]), dtype)
        if n.gamma == "one_plus":
            gamma = g.op("Add", g.const(1.0, dtype), g.const(rng.normal(0, 0.3, n.dims[-1]), dtype))
        y = g.both("Mul", y, gamma, n.gamma_first)
    g.nodes.append(oh.make_node("Identity", [y], ["y"], name="out"))
    graph = oh.make_graph(
        g.nodes,
        "norm",
        [oh.make_tensor_value_info("x", elem, list(n.dims))],
        [oh.make_tensor_value_info("y", elem, list(n.dims))],
        g.inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", n.opset)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def fused_op(n: Norm) -> str:
    if n.kind == "layer":
        return "LayerNormalization"
    return "RMSNormalization" if n.opset >= 23 else "SimplifiedLayerNormalization"


@SPELLINGS
@given(norms())
def test_every_norm_spelling_fuses_once_into_the_norm_op_exactly(n: Norm) -> None:
    model = norm_model(n)
    done = fuse_quiet(model)
    result, fused, ops = done.result, done.model, done.ops
    assert ops.count(fused_op(n)) == 1, f"{n}: {ops}; {done.misses_about('norm')[:3]}"
    assert not WRITTEN_OUT & set(ops), f"{n}: {ops}"
    pattern = "layer_norm" if n.kind == "layer" else "rms_norm"
    if n.kind == "rms" and n.gamma == "none" and n.means[1] != "sum":
        pattern = "rms_norm_unscaled"  # an L2 norm's N^-1/2 is a gamma of its own
    assert result.counts.get(pattern) == 1, f"{n}: {result.counts}"
    rng = np.random.default_rng(7)
    x = rng.standard_normal(n.dims).astype(np.float16 if n.fp16 else np.float32)
    run_both(model, fused, feeds={"x": x}, **(TOL_FP16 if n.fp16 else TOL_FP32))
