"""Probes: predicates on one graph node, registered by name, that a pattern's ``explain``
names (``explain: {node: softmax, when: attention_softmax}``).

A probe is code for what a pattern cannot say: which graph nodes deserve a near miss
when no binding reached them (``_explain.py`` grows the binding from each). The spec
checks a probe's name at registration, so the registry sits below the spec.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_tensor

__all__ = [
    "PROBES",
    "attention_softmax",
    "gelu_activation",
    "rotary_product",
    "router_sigmoid",
    "router_softmax",
]


def _activation(value: ir.Value | None) -> bool:
    return value is not None and constant_tensor(value) is None


def _reaches(
    start: ir.Value | None,
    found: Callable[[ir.Node], bool],
    through: Callable[[ir.Node], list[ir.Value | None]],
    depth: int,
) -> bool:
    """Whether a producer ``found`` accepts computes ``start``, walking back through the
    inputs ``through`` gives of each other producer, at most ``depth`` steps."""
    todo, seen = [(start, 0)], set()
    while todo:
        value, steps = todo.pop()
        producer = value.producer() if value is not None else None
        if producer is None or id(producer) in seen or steps > depth:
            continue
        seen.add(id(producer))
        if found(producer):
            return True
        todo += [(v, steps + 1) for v in through(producer)]
    return False


# Concat: gpt-oss's sinks; Tanh: a soft-cap, c * tanh(scores / c); the rest: elementwise
# steps no rule takes (an Erf, a clamp) that leave the scores' MatMul no less attention's
# and its block owed a near miss
_SCORE_STEPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Concat", "Tanh"}
    | {"Erf", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Pow", "Sin", "Cos"}
    | {"Relu", "Sigmoid", "Softplus", "LeakyRelu", "Elu", "Clip", "Max", "Min", "Identity"}
)


def _score_steps(node: ir.Node) -> list[ir.Value | None]:
    if node.op_type in _SCORE_STEPS:
        return [v for v in node.inputs if _activation(v)]
    if node.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Transpose") and node.inputs:
        return [node.inputs[0]]
    return []


def attention_softmax(node: ir.Node) -> bool:
    """A Softmax of scores: its input comes from a MatMul of two activations, possibly
    through a few elementwise steps (scale, mask, Where, Cast, a soft-cap's Tanh, one no
    rule knows), reshapes (DeBERTa reshapes its scores between the relative-position Add
    and the mask's Where), a Transpose and a Concat (gpt-oss's attention sinks, one more
    column of the scores)."""
    return _reaches(
        node.inputs[0] if node.inputs else None,
        lambda n: n.op_type == "MatMul" and all(_activation(v) for v in n.inputs[:2]),
        _score_steps,
        depth=6,
    )


# What a router's probabilities are read by: the choice of experts (TopK, or a gather of
# the chosen weights: PhiMoE's sparsemixer, whose selection has no TopK).
_SELECTIONS = frozenset({"TopK", "GatherElements", "GatherND", "ArgMax"})
_ROUTER_STEPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Greater", "Less", "ReduceMax", "Abs"}
)


def router_softmax(node: ir.Node) -> bool:
    """A Softmax over experts that picks some of them: its input comes from a MatMul or
    Gemm by a constant 2-D weight (the router) through elementwise steps and reductions
    (masks, a max), and a selection (TopK, GatherElements, ...) reads it. A classifier's
    Softmax (a graph output, no selection after it) is not one."""
    out = node.outputs[0]
    if out.is_graph_output() or not any(u.node.op_type in _SELECTIONS for u in out.uses()):
        return False
    return _from_router(node, depth=8)


def _from_router(node: ir.Node, depth: int) -> bool:
    """Whether ``node``'s input is router logits, ``depth`` steps at most from them."""
    return _reaches(
        node.inputs[0] if node.inputs else None,
        _a_router,
        lambda n: [v for v in n.inputs if _activation(v)] if n.op_type in _ROUTER_STEPS else [],
        depth=depth,
    )


# What a sigmoid router's scores pass through before the choice: a selection bias,
# the groups' reshapes, masks and casts (DeepSeek-V3's group-limited routing).
_SCORE_TO_CHOICE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Expand"}
)


def router_sigmoid(node: ir.Node) -> bool:
    """A Sigmoid of router logits that picks experts: its input comes from a MatMul or
    Gemm by a constant 2-D weight (as ``router_softmax``'s), and within a few elementwise
    steps (a selection bias, the groups' reshapes) a selection reads its scores. A SiLU's
    or a gate's Sigmoid (multiplied into a projection) is not one."""
    if not node.outputs or node.outputs[0].is_graph_output():
        return False
    return _feeds_selection(node.outputs[0], depth=4) and _from_router(node, depth=4)


def _feeds_selection(start: ir.Value, depth: int) -> bool:
    """Whether a selection (TopK, GatherElements...) reads ``start``, walking forward
    through at most ``depth`` of the steps between a router's scores and its choice."""
    todo, seen = [(start, 0)], set()
    while todo:
        value, steps = todo.pop()
        for use in value.uses():
            user = use.node
            if user.op_type in _SELECTIONS:
                return True
            if user.op_type in _SCORE_TO_CHOICE and steps < depth and id(user) not in seen:
                seen.add(id(user))
                todo += [(out, steps + 1) for out in user.outputs]
    return False


def _a_router(node: ir.Node) -> bool:
    """A MatMul or Gemm by a constant 2-D weight."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return False
    weight = constant_tensor(node.inputs[1])  # its shape only: a weight may be lazy
    return weight is not None and len(weight.shape) == 2


_POLYNOMIAL_STEPS = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Pow"})


def gelu_activation(node: ir.Node) -> bool:
    """An Erf, or a Tanh of a polynomial of degree 2 or more (GELU's ``x + k x^3``; a
    soft-cap's ``Tanh(s / c)`` and an RNN's Tanh are not): a GELU the canonical form
    could not write in the patterns' spelling (an intermediate read elsewhere, a
    constant that is not a scalar) is owed a near miss."""
    if node.op_type == "Erf":
        return bool(node.inputs) and _activation(node.inputs[0])
    if node.op_type != "Tanh" or not node.inputs:
        return False
    todo, seen = [node.inputs[0]], 0
    while todo and seen < 12:
        producer = todo.pop().producer()
        if producer is None or producer.op_type not in _POLYNOMIAL_STEPS:
            continue
        seen += 1
        operands = [v for v in producer.inputs if _activation(v)]
        if producer.op_type == "Pow" or (producer.op_type == "Mul" and len(operands) == 2):
            return True
        todo += operands
    return False


# What a rotary's cos and sin tables are read through on their way from the Cos and Sin
# of the angles (or a constant cache, gathered by position) to the products
_TABLE_STEPS = frozenset(
    {"Unsqueeze", "Squeeze", "Reshape", "Expand", "Gather", "GatherND", "Slice", "Split"}
    | {"Cast", "Concat", "Mul", "Transpose", "Identity", "Tile"}
)
# How the rotated features come from the heads: cut (Slice, Split), negated, paired
# again (Concat, Unsqueeze and Reshape), transposed
_ROTATION_STEPS = frozenset(
    {"Slice", "Split", "Concat", "Neg", "Reshape", "Unsqueeze", "Squeeze", "Transpose"}
    | {"Gather", "Identity", "Mul"}
)


def rotary_product(node: ir.Node) -> bool:
    """An Add of two products, each of features by a table (the Cos or Sin of angles, or
    a constant float cache of more than one value), the features of one product cut
    from the same heads as the other's (``x * cos + rotate_half(x) * sin``, the halves'
    ``x2 * c + x1 * s``): a rotary embedding, owed a near miss when no pattern binds it.
    A residual's or a norm's Add (no two tables) and a gate's products are not one."""
    if node.op_type != "Add" or len(node.inputs) != 2:
        return False
    products = [v.producer() if v is not None else None for v in node.inputs]
    if any(p is None or p.op_type != "Mul" or len(p.inputs) != 2 for p in products):
        return False
    sides = [_features_and_table(p) for p in products if p is not None]
    for (x, cos), (rotated, sin) in (sides, sides[::-1]):
        if x is None or rotated is None or x is rotated or cos is sin:
            continue
        if _ancestors(x, 6) & _ancestors(rotated, 6):
            return True
    return False


def _features_and_table(product: ir.Node) -> tuple[ir.Value | None, ir.Value | None]:
    """The activation a Mul multiplies by a table, and the table; Nones if neither
    operand is a table."""
    a, b = product.inputs
    for features, table in ((a, b), (b, a)):
        if _activation(features) and _a_table(table):
            return features, table
    return None, None


def _a_table(value: ir.Value | None) -> bool:
    """Whether ``value`` comes from a Cos or Sin, or a constant float cache of more than
    one value, a few table steps (gathered, unsqueezed, scaled) away."""
    todo, seen = [(value, 0)], set()
    while todo:
        current, steps = todo.pop()
        if current is None or steps > 8:
            continue
        constant = constant_tensor(current)
        if constant is not None:
            if constant.dtype.is_floating_point() and constant.size > 1:
                return True
            continue
        producer = current.producer()
        if producer is None or id(producer) in seen:
            continue
        seen.add(id(producer))
        if producer.op_type in ("Cos", "Sin"):
            return True
        if producer.op_type in _TABLE_STEPS:
            todo += [(v, steps + 1) for v in producer.inputs]
    return False


def _ancestors(value: ir.Value, depth: int) -> set[int]:
    """``value`` and the activations it is cut, negated or paired from, at most
    ``depth`` rotation steps back (by id)."""
    found, todo = set(), [(value, 0)]
    while todo:
        current, steps = todo.pop()
        if id(current) in found:
            continue
        found.add(id(current))
        producer = current.producer()
        if producer is None or producer.op_type not in _ROTATION_STEPS or steps >= depth:
            continue
        todo += [(v, steps + 1) for v in producer.inputs if _activation(v)]
    return found


PROBES: dict[str, Callable[[ir.Node], bool]] = {
    "attention_softmax": attention_softmax,
    "router_softmax": router_softmax,
    "router_sigmoid": router_sigmoid,
    "gelu_activation": gelu_activation,
    "rotary_product": rotary_product,
}
