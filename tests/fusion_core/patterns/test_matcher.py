"""The matcher: every candidate of every pattern, found on an onnx-ir graph before any
rewrite, and a near miss with a reason for every place that matched by op type only.

Graphs are written in ONNX text; initializers are attached from numpy arrays.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from autofusion.fusion_core.patterns import Matcher, MatchResult, PatternSpec

HEADER = '<ir_version: 8, opset_import: ["" : 17]>\n'


def make_graph(text: str, **initializers: np.ndarray) -> ir.Graph:
    """Parse ONNX text, attach initializers, check it, infer shapes, convert to onnx-ir."""
    proto = onnx.parser.parse_model(HEADER + text)
    for name, array in initializers.items():
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    onnx.checker.check_model(proto, full_check=True)
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return ir.from_proto(proto).graph


def node(node_id: str, op: str | list[str], inputs: dict[int, str] | None = None, **extra):
    return {"id": node_id, "op": op, "inputs": inputs or {}, **extra}


def pattern(name: str, nodes: list[dict], constraints: list[dict] | None = None) -> PatternSpec:
    return PatternSpec.model_validate(
        {
            "name": name,
            "nodes": nodes,
            "constraints": constraints or [],
            "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
        }
    )


def find(graph: ir.Graph, *patterns: PatternSpec) -> MatchResult:
    return Matcher(list(patterns)).find(graph)


def names(result: MatchResult) -> list[list[str]]:
    return [m.node_names() for m in result.candidates]


def weights(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


CONV_RELU = pattern("conv_relu", [node("conv", "Conv"), node("act", "Relu", {0: "conv"})])

TWO_CONV_RELU_CHAINS = """
g (float[1,3,8,8] x) => (float[1,4,8,8] y1, float[1,4,8,8] y2) {
  [conv1] c1 = Conv <pads = [1,1,1,1]> (x, w1)
  [relu1] y1 = Relu (c1)
  [conv2] c2 = Conv <pads = [1,1,1,1]> (x, w2)
  [relu2] y2 = Relu (c2)
}
"""


# --- enumeration before rewriting ----------------------------------------------------


def test_every_candidate_is_listed_and_the_graph_is_untouched():
    graph = make_graph(TWO_CONV_RELU_CHAINS, w1=weights(4, 3, 3, 3), w2=weights(4, 3, 3, 3))

    result = find(graph, CONV_RELU)

    assert names(result) == [["conv1", "relu1"], ["conv2", "relu2"]]
    assert result.by_pattern() == {"conv_relu": 2}
    assert result.near_misses == []
    assert [n.name for n in graph] == ["conv1", "relu1", "conv2", "relu2"]


CONV_BN_RELU = """
g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
  [conv] c = Conv <pads = [1,1,1,1]> (x, w)
  [bn] b = BatchNormalization (c, gamma, beta, mean, var)
  [relu] y = Relu (b)
}
"""


def conv_bn_relu_graph() -> ir.Graph:
    channel = np.ones(4, np.float32)
    return make_graph(
        CONV_BN_RELU, w=weights(4, 3, 3, 3), gamma=channel, beta=channel, mean=channel, var=channel
    )


def test_overlapping_candidates_of_two_patterns_are_both_listed():
    conv_bn = pattern(
        "conv_bn", [node("conv", "Conv"), node("bn", "BatchNormalization", {0: "conv"})]
    )
    bn_relu = pattern("bn_relu", [node("bn", "BatchNormalization"), node("act", "Relu", {0: "bn"})])

    result = find(conv_bn_relu_graph(), conv_bn, bn_relu)

    assert result.by_pattern() == {"conv_bn": 1, "bn_relu": 1}
    assert sorted(names(result)) == [["bn", "relu"], ["conv", "bn"]]


def test_overlapping_candidates_of_one_pattern_are_both_listed():
    graph = make_graph(
        """
        g (float[2,4] x) => (float[2,4] y) {
          [r1] a = Relu (x)
          [r2] b = Relu (a)
          [r3] y = Relu (b)
        }
        """
    )
    relu_relu = pattern("relu_relu", [node("first", "Relu"), node("second", "Relu", {0: "first"})])

    result = find(graph, relu_relu)

    assert names(result) == [["r1", "r2"], ["r2", "r3"]]


def test_vertical_chain_binds_every_node_and_value():
    graph = make_graph(
        """
        g (float[1,4,8,8] x, float[1,4,8,8] r) => (float[1,4,8,8] y) {
          [conv] c = Conv <pads = [1,1,1,1]> (x, w)
          [bn] b = BatchNormalization (c, gamma, beta, mean, var)
          [add] s = Add (b, r)
          [relu] y = Relu (s)
        }
        """,
        w=weights(4, 4, 3, 3),
        gamma=np.ones(4, np.float32),
        beta=np.zeros(4, np.float32),
        mean=np.zeros(4, np.float32),
        var=np.ones(4, np.float32),
    )
    chain = pattern(
        "conv_bn_add_relu",
        [
            node("conv", "Conv"),
            node("bn", "BatchNormalization", {0: "conv"}),
            node("add", "Add", {0: "bn"}),
            node("act", "Relu", {0: "add"}),
        ],
    )

    (match,) = find(graph, chain).candidates

    assert match.node_names() == ["conv", "bn", "add", "relu"]
    assert match.node("bn").op_type == "BatchNormalization"
    assert match.value("conv.out0").name == "c"
    assert match.value("bn.in3").name == "mean"
    assert match.value("add.in1").name == "r"
    assert match.value("act.out0").name == "y"


def test_a_pattern_whose_op_is_absent_finds_nothing():
    graph = make_graph(TWO_CONV_RELU_CHAINS, w1=weights(4, 3, 3, 3), w2=weights(4, 3, 3, 3))
    conv_sigmoid = pattern(
        "conv_sigmoid", [node("conv", "Conv"), node("s", "Sigmoid", {0: "conv"})]
    )

    result = find(graph, conv_sigmoid)

    assert result.candidates == []
    assert result.near_misses == []


# --- horizontal patterns (siblings sharing a free input) ----------------------------


def matmuls_reading_x(count: int, *, other_input_for: int | None = None) -> ir.Graph:
    outputs = ", ".join(f"float[2,4] y{i}" for i in range(count))
    body = "\n".join(
        f"[mm{i}] y{i} = MatMul ({'x2' if i == other_input_for else 'x'}, w{i})"
        for i in range(count)
    )
    text = f"g (float[2,4] x, float[2,4] x2) => ({outputs}) {{\n{body}\n}}"
    return make_graph(text, **{f"w{i}": weights(4, 4, seed=i) for i in range(count)})


def siblings(count: int) -> PatternSpec:
    ids = [f"s{i}" for i in range(count)]
    return pattern(f"siblings{count}", [node(i, "MatMul", {0: "$x"}) for i in ids])


def test_three_siblings_match_once_not_per_permutation():
    result = find(matmuls_reading_x(3), siblings(3))

    assert names(result) == [["mm0", "mm1", "mm2"]]
    assert result.candidates[0].value("$x").name == "x"


def test_two_siblings_among_four_readers_match_every_pair():
    result = find(matmuls_reading_x(4), siblings(2))

    expected = {frozenset(pair) for pair in itertools.combinations([f"mm{i}" for i in range(4)], 2)}
    found = [frozenset(n) for n in names(result)]
    assert len(found) == 6
    assert set(found) == expected


def test_siblings_must_read_the_same_value():
    result = find(matmuls_reading_x(3, other_input_for=1), siblings(3))

    assert result.candidates == []


# --- commutative inputs --------------------------------------------------------------

CONV_ADD = pattern("conv_add", [node("conv", "Conv"), node("add", "Add", {0: "conv"})])


def conv_then(op: str, inputs: str) -> ir.Graph:
    return make_graph(
        f"""
        g (float[1,3,8,8] x, float[1,4,8,8] r) => (float[1,4,8,8] y) {{
          [conv] c = Conv <pads = [1,1,1,1]> (x, w)
          [op] y = {op} ({inputs})
        }}
        """,
        w=weights(4, 3, 3, 3),
    )


@pytest.mark.parametrize(
    "inputs", [pytest.param("c, r", id="conv-first"), pytest.param("r, c", id="conv-second")]
)
def test_commutative_add_matches_either_input_order(inputs):
    (match,) = find(conv_then("Add", inputs), CONV_ADD).candidates

    assert match.value("add.in0").name == "c"
    assert match.value("add.in1").name == "r"


def test_non_commutative_op_does_not_match_swapped_inputs():
    conv_sub = pattern("conv_sub", [node("conv", "Conv"), node("op", "Sub", {0: "conv"})])

    assert len(find(conv_then("Sub", "c, r"), conv_sub).candidates) == 1
    assert find(conv_then("Sub", "r, c"), conv_sub).candidates == []


def test_commutative_false_pins_the_input_order():
    strict_add = pattern(
        "strict_add", [node("conv", "Conv"), node("add", "Add", {0: "conv"}, commutative=False)]
    )

    assert len(find(conv_then("Add", "c, r"), strict_add).candidates) == 1
    assert find(conv_then("Add", "r, c"), strict_add).candidates == []


# --- values that escape the match ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param(
            """
            g (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] c) {
              [conv] c = Conv <pads = [1,1,1,1]> (x, w)
              [relu] y = Relu (c)
            }
            """,
            "conv.out0 ('c') is a graph output",
            id="intermediate-is-graph-output",
        ),
        pytest.param(
            """
            g (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] z) {
              [conv] c = Conv <pads = [1,1,1,1]> (x, w)
              [relu] y = Relu (c)
              [other] z = Sigmoid (c)
            }
            """,
            "conv.out0 ('c') is also used by Sigmoid 'other' outside the match",
            id="intermediate-has-outside-consumer",
        ),
    ],
)
def test_match_whose_intermediate_escapes_is_a_near_miss(text, reason):
    result = find(make_graph(text, w=weights(4, 3, 3, 3)), CONV_RELU)

    assert result.candidates == []
    (miss,) = result.near_misses
    assert miss.pattern == "conv_relu"
    assert miss.nodes == ("conv", "relu")
    assert reason in miss.reason
    assert miss.kind == "escape"


def test_near_miss_names_the_value_that_is_not_constant():
    graph = make_graph(
        """
        g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
          [conv] c = Conv <pads = [1,1,1,1]> (x, w)
          [relu] y = Relu (c)
        }
        """
    )
    constant_weight = pattern(
        "conv_relu_const",
        [node("conv", "Conv"), node("act", "Relu", {0: "conv"})],
        [{"kind": "constant", "values": ["conv.in1"]}],
    )

    result = find(graph, constant_weight)

    assert result.candidates == []
    (miss,) = result.near_misses
    assert miss.to_dict() == {
        "pattern": "conv_relu_const",
        "nodes": ["conv", "relu"],
        "reason": "conv.in1 ('w') is not a constant initializer",
        "kind": "constraint",
    }


# --- constraint kinds ----------------------------------------------------------------

CONV_RELU_TEXT = """
g (float[{x}] x) => (float[{y}] y) {{
  [conv] c = Conv <{attrs}> (x, w)
  [relu] y = Relu (c)
}}
"""


def conv_relu(
    x: str = "1,3,8,8", y: str = "1,4,8,8", attrs: str = "pads = [1,1,1,1]", **inits
) -> tuple[str, dict]:
    inits.setdefault("w", weights(4, 3, 3, 3))
    return CONV_RELU_TEXT.format(x=x, y=y, attrs=attrs), inits


def conv_mul(scale: np.ndarray) -> tuple[str, dict]:
    text = """
    g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
      [conv] c = Conv <pads = [1,1,1,1]> (x, w)
      [mul] y = Mul (c, s)
    }
    """
    return text, {"w": weights(4, 3, 3, 3), "s": scale}


def conv_add_residual(residual: str) -> tuple[str, dict]:
    text = f"""
    g (float[1,3,8,8] x, float[{residual}] r) => (float[1,4,8,8] y) {{
      [conv] c = Conv <pads = [1,1,1,1]> (x, w)
      [add] y = Add (c, r)
    }}
    """
    return text, {"w": weights(4, 3, 3, 3)}


def matmul_add(x: str = "2,4", bias: np.ndarray | None = None, y: str = "2,4") -> tuple[str, dict]:
    text = f"""
    g (float[{x}] x) => (float[{y}] y) {{
      [mm] m = MatMul (x, w)
      [add] y = Add (m, b)
    }}
    """
    return text, {"w": weights(4, 4), "b": bias if bias is not None else weights(4)}


CONV_RELU_NODES = [node("conv", "Conv"), node("act", "Relu", {0: "conv"})]
CONV_MUL_NODES = [node("conv", "Conv"), node("mul", "Mul", {0: "conv"})]
CONV_ADD_NODES = [node("conv", "Conv"), node("add", "Add", {0: "conv"})]
MATMUL_ADD_NODES = [node("mm", "MatMul"), node("add", "Add", {0: "mm"})]

DEPTHWISE = conv_relu(x="1,4,8,8", attrs="group = 4, pads = [1,1,1,1]", w=weights(4, 1, 3, 3))
GROUPED = conv_relu(x="1,4,8,8", attrs="group = 2, pads = [1,1,1,1]", w=weights(4, 2, 3, 3))
DOUBLE_CONV = (
    """
    g (double[1,3,8,8] x) => (double[1,4,8,8] y) {
      [conv] c = Conv <pads = [1,1,1,1]> (x, w)
      [relu] y = Relu (c)
    }
    """,
    {"w": weights(4, 3, 3, 3).astype(np.float64)},
)
CONSTANT_NODE_SCALE = (
    """
    g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
      [conv] c = Conv <pads = [1,1,1,1]> (x, w)
      [k] s = Constant <value = float[1,4,1,1] {1.0, 2.0, 3.0, 4.0}> ()
      [mul] y = Mul (c, s)
    }
    """,
    {"w": weights(4, 3, 3, 3)},
)
WEIGHT_AS_INPUT = (
    """
    g (float[1,3,8,8] x, float[4,3,3,3] w) => (float[1,4,8,8] y) {
      [conv] c = Conv <pads = [1,1,1,1]> (x, w)
      [relu] y = Relu (c)
    }
    """,
    {},
)
# An initializer that is also a graph input is a default the caller may override.
OVERRIDABLE_WEIGHT = (WEIGHT_AS_INPUT[0], {"w": weights(4, 3, 3, 3)})
SHARED_WEIGHT = (TWO_CONV_RELU_CHAINS.replace("w2)", "w1)"), {"w1": weights(4, 3, 3, 3)})
CONV_WITH_BIAS = (
    CONV_RELU_TEXT.format(x="1,3,8,8", y="1,4,8,8", attrs="pads = [1,1,1,1]").replace(
        "(x, w)", "(x, w, bias)"
    ),
    {"w": weights(4, 3, 3, 3), "bias": weights(4)},
)


def case(
    case_id: str, graph: tuple[str, dict], nodes: list[dict], constraint: dict, reason: str | None
):
    return pytest.param(graph, nodes, constraint, reason, id=case_id)


CONSTRAINT_CASES = [
    # attr: schema defaults count, missing_ok lets an absent attribute pass
    case(
        "attr-default-group-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "attr", "node": "conv", "name": "group", "eq": 1},
        None,
    ),
    case(
        "attr-list-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "attr", "node": "conv", "name": "pads", "eq": [1, 1, 1, 1]},
        None,
    ),
    case(
        "attr-group-fails",
        GROUPED,
        CONV_RELU_NODES,
        {"kind": "attr", "node": "conv", "name": "group", "eq": 1},
        "conv.group of 'conv' is 2, expected eq 1",
    ),
    case(
        "attr-absent-fails",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "attr", "node": "act", "name": "alpha", "eq": 0.1},
        "act ('relu') has no attribute 'alpha'",
    ),
    case(
        "attr-absent-missing-ok-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "attr", "node": "act", "name": "alpha", "eq": 0.1, "missing_ok": True},
        None,
    ),
    # constant
    case(
        "constant-initializer-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "constant", "values": ["conv.in1"]},
        None,
    ),
    case(
        "constant-node-passes",
        CONSTANT_NODE_SCALE,
        CONV_MUL_NODES,
        {"kind": "constant", "values": ["mul.in1"]},
        None,
    ),
    case(
        "constant-graph-input-fails",
        WEIGHT_AS_INPUT,
        CONV_RELU_NODES,
        {"kind": "constant", "values": ["conv.in1"]},
        "conv.in1 ('w') is not a constant initializer",
    ),
    case(
        "constant-overridable-initializer-fails",
        OVERRIDABLE_WEIGHT,
        CONV_RELU_NODES,
        {"kind": "constant", "values": ["conv.in1"]},
        "conv.in1 ('w') is not a constant initializer",
    ),
    # values
    case(
        "values-positive-passes",
        conv_mul(np.array([1, 2, 3, 4], np.float32).reshape(1, 4, 1, 1)),
        CONV_MUL_NODES,
        {"kind": "values", "value": "mul.in1", "gt": 0},
        None,
    ),
    case(
        "values-negative-fails",
        conv_mul(np.array([1, -2, 3, 4], np.float32).reshape(1, 4, 1, 1)),
        CONV_MUL_NODES,
        {"kind": "values", "value": "mul.in1", "gt": 0},
        "the values of mul.in1 ('s')",
    ),
    # dtype
    case(
        "dtype-float-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "dtype", "values": ["conv.out0"], "in": ["FLOAT"]},
        None,
    ),
    case(
        "dtype-double-fails",
        DOUBLE_CONV,
        CONV_RELU_NODES,
        {"kind": "dtype", "values": ["conv.out0"], "in": ["FLOAT"]},
        "conv.out0 ('c') has dtype DOUBLE, expected one of ['FLOAT']",
    ),
    # rank
    case(
        "rank-2-passes",
        matmul_add(),
        MATMUL_ADD_NODES,
        {"kind": "rank", "value": "mm.in0", "eq": 2},
        None,
    ),
    case(
        "rank-3-fails",
        matmul_add(x="3,2,4", y="3,2,4"),
        MATMUL_ADD_NODES,
        {"kind": "rank", "value": "mm.in0", "eq": 2},
        "the rank of mm.in0 ('x') is 3, expected eq 2",
    ),
    # shape
    case(
        "shape-depthwise-passes",
        DEPTHWISE,
        CONV_RELU_NODES,
        {"kind": "shape", "value": "conv.in1", "dim": 1, "eq": 1},
        None,
    ),
    case(
        "shape-regular-conv-fails",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "shape", "value": "conv.in1", "dim": 1, "eq": 1},
        "dimension 1 of conv.in1 ('w') is 3, expected eq 1",
    ),
    case(
        "shape-symbolic-fails",
        conv_relu(x="N,3,8,8", y="N,4,8,8"),
        CONV_RELU_NODES,
        {"kind": "shape", "value": "conv.in0", "dim": 0, "eq": 1},
        "dimension 0 of conv.in0 ('x') is symbolic (N)",
    ),
    # static_shape
    case(
        "static-shape-passes",
        matmul_add(),
        MATMUL_ADD_NODES,
        {"kind": "static_shape", "values": ["mm.in0", "mm.out0"]},
        None,
    ),
    case(
        "static-shape-symbolic-fails",
        matmul_add(x="N,4", y="N,4"),
        MATMUL_ADD_NODES,
        {"kind": "static_shape", "values": ["mm.in0"]},
        "the shape of mm.in0 ('x') is not static",
    ),
    # same_shape
    case(
        "same-shape-passes",
        conv_add_residual("1,4,8,8"),
        CONV_ADD_NODES,
        {"kind": "same_shape", "values": ["add.in0", "add.in1"]},
        None,
    ),
    case(
        "same-shape-broadcast-fails",
        conv_add_residual("1,4,1,1"),
        CONV_ADD_NODES,
        {"kind": "same_shape", "values": ["add.in0", "add.in1"]},
        "but add.in1 ('r') has shape",
    ),
    # broadcastable
    case(
        "broadcastable-bias-passes",
        matmul_add(bias=weights(4)),
        MATMUL_ADD_NODES,
        {"kind": "broadcastable", "value": "add.in1", "to": "mm.out0"},
        None,
    ),
    case(
        "broadcastable-growing-bias-fails",
        matmul_add(bias=weights(3, 2, 4), y="3,2,4"),
        MATMUL_ADD_NODES,
        {"kind": "broadcastable", "value": "add.in1", "to": "mm.out0"},
        "add.in1 ('b') of shape [3,2,4] does not broadcast to mm.out0 ('m')",
    ),
    # channelwise
    case(
        "channelwise-per-channel-passes",
        conv_mul(weights(1, 4, 1, 1)),
        CONV_MUL_NODES,
        {"kind": "channelwise", "value": "mul.in1", "like": "conv.out0", "axis": 1},
        None,
    ),
    case(
        "channelwise-scalar-passes",
        conv_mul(np.array(2.0, np.float32)),
        CONV_MUL_NODES,
        {"kind": "channelwise", "value": "mul.in1", "like": "conv.out0"},
        None,
    ),
    case(
        "channelwise-spatial-fails",
        conv_mul(weights(1, 1, 8, 8)),
        CONV_MUL_NODES,
        {"kind": "channelwise", "value": "mul.in1", "like": "conv.out0", "axis": 1},
        "mul.in1 ('s') of shape [1,1,8,8] is not per-channel along axis 1",
    ),
    # consumers
    case(
        "consumers-own-weight-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "consumers", "value": "conv.in1", "max": 1},
        None,
    ),
    case(
        "consumers-shared-weight-fails",
        SHARED_WEIGHT,
        CONV_RELU_NODES,
        {"kind": "consumers", "value": "conv.in1", "max": 1},
        "conv.in1 ('w1') has 2 consumer(s)",
    ),
    # optional inputs
    case(
        "optional-absent-bias-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "constant", "values": ["conv.in2"], "optional": True},
        None,
    ),
    case(
        "optional-present-bias-checked",
        CONV_WITH_BIAS,
        CONV_RELU_NODES,
        {"kind": "constant", "values": ["conv.in2"], "optional": True},
        None,
    ),
    case(
        "required-absent-bias-fails",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "constant", "values": ["conv.in2"]},
        "conv.in2 is absent",
    ),
    case(
        "optional-absent-rank-passes",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "rank", "value": "conv.in2", "eq": 1, "optional": True},
        None,
    ),
    case(
        "required-absent-rank-fails",
        conv_relu(),
        CONV_RELU_NODES,
        {"kind": "rank", "value": "conv.in2", "eq": 1},
        "conv.in2 is absent",
    ),
]


@pytest.mark.parametrize(("graph", "nodes", "constraint", "reason"), CONSTRAINT_CASES)
def test_constraint(graph: tuple[str, dict[str, Any]], nodes, constraint, reason):
    text, initializers = graph
    spec = pattern("constrained", nodes, [constraint])

    result = find(make_graph(text, **initializers), spec)

    if reason is None:
        assert len(result.candidates) == 1
        assert result.near_misses == []
    else:
        assert result.candidates == []
        assert result.near_misses, "a failed constraint must leave a near miss"
        for miss in result.near_misses:
            assert reason in miss.reason


def test_constraint_on_a_free_input():
    spec = pattern(
        "static_siblings",
        [node(i, "MatMul", {0: "$x"}) for i in ("a", "b")],
        [{"kind": "rank", "value": "$x", "eq": 3}],
    )

    result = find(matmuls_reading_x(2), spec)

    assert result.candidates == []
    (miss,) = result.near_misses
    assert "the rank of $x ('x') is 2, expected eq 3" in miss.reason


# --- scale ---------------------------------------------------------------------------


def conv_relu_chain(blocks: int) -> ir.Graph:
    nodes, inits, current = [], [], "x"
    for i in range(blocks):
        nodes.append(oh.make_node("Conv", [current, f"w{i}"], [f"c{i}"], name=f"conv{i}"))
        nodes.append(oh.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        inits.append(numpy_helper.from_array(weights(2, 2, 1, 1, seed=i), f"w{i}"))
        current = f"r{i}"
    graph = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4, 4])],
        [oh.make_tensor_value_info(current, onnx.TensorProto.FLOAT, [1, 2, 4, 4])],
        inits,
    )
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(proto)
    return ir.from_proto(proto).graph


def test_candidates_grow_linearly_with_the_chain():
    blocks = 200

    result = find(conv_relu_chain(blocks), CONV_RELU)

    assert len(result.candidates) == blocks
    assert result.near_misses == []
    assert names(result)[-1] == [f"conv{blocks - 1}", f"relu{blocks - 1}"]
