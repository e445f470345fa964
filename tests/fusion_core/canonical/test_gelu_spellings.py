"""Generated spellings of GELU: each fuses exactly once, exactly; a block whose
constants are not GELU's comes out as it went in.

A generator (hypothesis) writes one GELU with ``onnx.helper``, drawing independently
how each step is spelled, the ways exporters and model code write it:

* the form: erf, ``0.5 x (1 + erf(x / sqrt(2)))``, or tanh, ``0.5 x (1 + tanh(c (x +
  k x^3)))`` with ``c = sqrt(2 / pi)``, ``k = 0.044715``;
* erf's argument: ``Div(x, sqrt(2))``, ``Mul(x, 1 / sqrt(2))`` either way round;
* tanh's argument: ``x^3`` as ``Pow(x, 3)``, ``x * (x * x)`` or ``(x * x) * x``; ``c
  (x + k x^3)``, or BLOOM's ``(c x) (1 + k x x)``; each Mul and Add either way round;
* the gate: ``1 + t`` either way round, or ``0.5 + 0.5 t`` (then no other 0.5);
* where the 0.5 goes: on ``x`` first, on the gate, or last; as ``Mul(., 0.5)`` or
  ``Div(., 2)``;
* a bias Add of a ``[hidden]`` constant before it or not; the batch dims and hidden size.

On the onnxruntime target every block becomes one ``Gelu``, ``BiasGelu`` or
``FastGelu`` (pattern ``gelu_erf``/``gelu_tanh`` or its ``_bias``), nothing of the
written-out block left, and computes what the original computes: rtol = atol = 1e-5
(onnxruntime's FastGelu is documented as ``tanh(0.797885 x + 0.035677 x^3)``, its
erf kernel rounds as the Mul by ``1 / sqrt(2)``: measured within 2e-6, test_gelu.py).
With one constant off (``k = 0.05``, the gate's ``1`` as ``2``) nothing fuses and the
model comes out node for node as it went in, with the same outputs bit for bit (the
rule's undo).

The example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``, 200 in
the corpus tier).
"""

from __future__ import annotations

import math
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

from autofusion.fusion_core.canonical import MARK, RULES
from autofusion.fusion_core.ir import model_from_proto
from autofusion.fusion_core.testing import op_sequence, optimize_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS as SETTINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
WRITTEN_OUT = {"Erf", "Tanh", "Pow", "Div"}
C, K = math.sqrt(2.0 / math.pi), 0.044715


@dataclass(frozen=True)
class Gelu:
    form: str  # "erf" or "tanh"
    argument: str  # erf: "div", "mul"; tanh: "sum" (c (x + k x^3)), "bloom"
    cube: str  # "pow", "x_xx", "xx_x"
    gate: str  # "one_plus", "half_plus_half"
    half: str  # "first", "gate", "last"
    half_div: bool  # Div(., 2) rather than Mul(., 0.5)
    swaps: tuple[bool, ...]  # each commutative op's operands swapped or not
    bias: bool
    dims: tuple[int, ...]
    off: str  # "": GELU; "k": the cube's coefficient 0.05; "one": the gate's 1 as 2


@st.composite
def gelus(draw, off: str = "") -> Gelu:
    form = draw(st.sampled_from(["erf", "tanh"]))
    batch = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return Gelu(
        form=form,
        argument=draw(st.sampled_from(["div", "mul"] if form == "erf" else ["sum", "bloom"])),
        cube=draw(st.sampled_from(["pow", "x_xx", "xx_x"])),
        gate=draw(st.sampled_from(["one_plus", "half_plus_half"])),
        half=draw(st.sampled_from(["first", "gate", "last"])),
        half_div=draw(st.booleans()),
        swaps=tuple(draw(st.lists(st.booleans(), min_size=12, max_size=12))),
        bias=draw(st.booleans()),
        dims=(*batch, draw(st.integers(2, 32))),
        off="k" if off and form == "tanh" else ("one" if off else ""),
    )


class _Graph:
    def __init__(self, g: Gelu) -> None:
        self.g, self.swap = g, iter(g.swaps)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def op(self, op: str, *inputs: str) -> str:
        out = f"t{len(self.nodes)}"
        if op in ("Add", "Mul") and next(self.swap, False):
            inputs = inputs[::-1]
        self.nodes.append(oh.make_node(op, list(inputs), [out], name=f"{op}_{out}"))
        return out

    def const(self, value: float) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(nh.from_array(np.asarray(value, np.float32), name))
        return name


def _argument(b: _Graph, x: str) -> str:
    g = b.g
    if g.form == "erf":
        if g.argument == "div":
            return b.op("Div", x, b.const(math.sqrt(2.0)))
        return b.op("Mul", x, b.const(1.0 / math.sqrt(2.0)))
    k = 0.05 if g.off == "k" else K
    if g.argument == "bloom":  # (c x) (1 + k x x)
        kxx = b.op("Mul", b.const(k), b.op("Mul", x, x))
        return b.op("Mul", b.op("Mul", x, b.const(C)), b.op("Add", b.const(1.0), kxx))
    if g.cube == "pow":
        cube = b.op("Pow", x, b.const(3.0))
    elif g.cube == "x_xx":
        cube = b.op("Mul", x, b.op("Mul", x, x))
    else:
        cube = b.op("Mul", b.op("Mul", x, x), x)
    return b.op("Mul", b.const(C), b.op("Add", x, b.op("Mul", b.const(k), cube)))


def _halved(b: _Graph, value: str) -> str:
    if b.g.half_div:
        return b.op("Div", value, b.const(2.0))
    return b.op("Mul", value, b.const(0.5))


def gelu_model(g: Gelu) -> onnx.ModelProto:
    rng = np.random.default_rng(zlib.crc32(repr(g).encode()))
    b = _Graph(g)
    x = "x"
    if g.bias:
        x = b.op("Add", "x", "bias")
        b.inits.append(nh.from_array(rng.normal(0, 1, g.dims[-1]).astype(np.float32), "bias"))
    t = b.op("Erf" if g.form == "erf" else "Tanh", _argument(b, x))
    one = 2.0 if g.off == "one" else 1.0
    if g.gate == "half_plus_half":  # 0.5 + 0.5 t, and no other 0.5
        y = b.op("Mul", x, b.op("Add", b.const(0.5 * one), b.op("Mul", b.const(0.5), t)))
    else:
        gate = b.op("Add", t, b.const(one))
        if g.half == "first":
            y = b.op("Mul", _halved(b, x), gate)
        elif g.half == "gate":
            y = b.op("Mul", x, _halved(b, gate))
        else:
            y = _halved(b, b.op("Mul", x, gate))
    assert b.nodes[-1].output[0] == y
    b.nodes[-1].output[0] = "y"  # the block's output is the graph's
    graph = oh.make_graph(
        b.nodes,
        "gelu",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, list(g.dims))],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, list(g.dims))],
        b.inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(g: Gelu) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).normal(0, 3, g.dims).astype(np.float32)}


def _in_the_patterns_spelling(g: Gelu) -> bool:
    argument = g.argument == "div" if g.form == "erf" else (g.argument, g.cube) == ("sum", "pow")
    return argument and g.gate == "one_plus" and g.half == "first" and not g.half_div


@SETTINGS
@given(gelus())
def test_every_gelu_spelling_fuses_once_exactly(g: Gelu) -> None:
    model = gelu_model(g)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = op_sequence(fused)
    op = "FastGelu" if g.form == "tanh" else ("BiasGelu" if g.bias else "Gelu")
    assert ops.count(f"com.microsoft::{op}") == 1, f"{g}: {ops}; {result.near_misses[:2]}"
    assert not WRITTEN_OUT & set(ops), f"{g}: {ops}"
    pattern = f"gelu_{g.form}" + ("_bias" if g.bias else "")
    assert result.counts == {pattern: 1}, f"{g}: {result.counts}"
    run_both(model, fused, feeds=_feeds(g), **TOL)


@SETTINGS
@given(gelus(off="yes"))
def test_a_block_with_a_constant_off_comes_out_as_it_went_in(g: Gelu) -> None:
    model = gelu_model(g)
    # the rule writes it in the patterns' spelling (their constraint then names the
    # constant that is off), unless it is in it: the undo is what brings it back
    graph, names = model_from_proto(model).graph, iter(range(1000))
    written = RULES["gelu_spelling"](graph, lambda hint: f"{hint}_{next(names)}", MARK)
    assert written == (0 if _in_the_patterns_spelling(g) else 1)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    assert result.counts == {}, f"{g}: {result.counts}"
    assert op_sequence(fused) == op_sequence(model)
    assert [n.name for n in fused.graph.node] == [n.name for n in model.graph.node]
    run_both(model, fused, feeds=_feeds(g), rtol=0, atol=0)
