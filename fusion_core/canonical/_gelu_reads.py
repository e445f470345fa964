"""What a GELU block computes, read by meaning for the ``gelu_spelling`` rule.

A GELU is ``0.5 * x * (1 + T(p(x)))`` with ``T`` the Erf of ``p(x) = x / sqrt(2)``
or the Tanh of ``p(x) = sqrt(2 / pi) * (x + 0.044715 * x^3)``. Exporters and model
code write the product in any pairing, ``p`` in any form (``x * (1 + k * x * x)``
scaled, BLOOM's; ``Pow(x, 3)`` or ``x * x * x``; a Div by a constant or a Mul by its
inverse), the gate as ``1 + T`` or ``0.5 + 0.5 * T``. Rather than one pattern per
spelling, this reads the block from its Erf or Tanh as two polynomials: ``p`` in ``x``
(the one value the argument is computed from by Add, Sub, Mul, Div by a constant, Neg
and Pow by a small integer, with scalar constants), and the value that the Erf's
output flows into, a polynomial in ``x`` and ``t = T(p)``, until it is ``a x + b x
t``. The reading keeps the coefficients it found: a block whose constants are not
GELU's (``0.05`` for ``0.044715``) is still read, so that, written in the patterns'
spelling, the pattern's constraint names the constant that is off (a near miss)
rather than a step of a spelling it does not know. Where ``a x + b x t`` is reached
more than once (``x (1 + t)``, then ``* 0.5``), the first equal to GELU's within
``RTOL`` (exporters round the constants to float32, some write fewer digits) is the
block's output, else the last of the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = ["RTOL", "GeluBlock", "read_gelu"]

RTOL = 1e-5
_GATE = {(1, 0): 0.5, (1, 1): 0.5}  # 0.5 x + 0.5 x t
# the powers of x in GELU's argument (its coefficients the patterns check)
_ARGUMENT_POWERS = {"Erf": {1}, "Tanh": {1, 3}}
_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Pow"})
_MAX_POWER = 4
_MAX_NODES = 16  # a GELU's argument and product take at most a dozen ops
_MAX_STEPS = 6  # from the Erf's output to the product

Poly = dict  # {power: coefficient} in x, or {(power of x, power of t): coefficient}


@dataclass
class GeluBlock:
    x: ir.Value
    kind: str  # "Erf" (exact) or "Tanh" (the tanh approximation)
    nodes: list[ir.Node]  # every node of the block, in graph order
    output: ir.Value
    argument: dict[int, float]  # the Erf's argument: {power of x: coefficient}
    gate: tuple[float, float]  # the output is gate[0] * x + gate[1] * x * t


def read_gelu(anchor: ir.Node) -> GeluBlock | None:
    """The GELU-shaped block around the Erf or Tanh ``anchor``, whatever its constants
    (the patterns check them), or None where it is none."""
    if anchor.op_type not in _ARGUMENT_POWERS or anchor.domain not in ("", "ai.onnx"):
        return None
    order = {id(n): i for i, n in enumerate(anchor.graph or [])}
    for x in _candidates(anchor.inputs[0], order):
        block = _read_from(anchor, x, order)
        if block is not None:
            return block
    return None


def _candidates(argument: ir.Value | None, order: dict[int, int]) -> list[ir.Value]:
    """The values the Erf's argument is computed from by arithmetic, the earliest first:
    ``x`` is the first that reads it as a polynomial (a bias Add of one element, or a
    residual Add, before the GELU makes ``x``; the MatMul before it does not)."""
    found: dict[int, ir.Value] = {}
    todo = [argument]
    while todo and len(found) <= _MAX_NODES:
        value = todo.pop()
        if value is None or id(value) in found or _scalar(value) is not None:
            continue
        found[id(value)] = value
        node = _arithmetic(value)
        if node is not None:
            todo += node.inputs[:1] if node.op_type == "Pow" else node.inputs
    return sorted(found.values(), key=lambda v: order.get(id(v.producer()), -1))


def _read_from(anchor: ir.Node, x: ir.Value, order: dict[int, int]) -> GeluBlock | None:
    nodes: dict[int, ir.Node] = {id(anchor): anchor}
    p = _poly(anchor.inputs[0], x, nodes)
    if p is None or set(p) != _ARGUMENT_POWERS[anchor.op_type]:
        return None
    found = _product(anchor.outputs[0], x, nodes)
    if found is None:
        return None
    output, gate, nodes = found
    if len(nodes) > _MAX_NODES or not _closed(nodes, output):
        return None
    ordered = sorted(nodes.values(), key=lambda n: order.get(id(n), 0))
    return GeluBlock(x, anchor.op_type, ordered, output, p, gate)


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_array(value)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(-1)[0])


def _arithmetic(value: ir.Value | None) -> ir.Node | None:
    """The producer of ``value`` if it is an arithmetic step a GELU is written with."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type not in _ARITHMETIC or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Pow" and _power(node) is None:
        return None
    return node


def _power(node: ir.Node) -> int | None:
    exponent = _scalar(node.inputs[1]) if len(node.inputs) > 1 else None
    if exponent is None or exponent != int(exponent) or not 1 <= exponent <= _MAX_POWER:
        return None
    return int(exponent)


def _poly(value: ir.Value | None, x: ir.Value, nodes: dict[int, ir.Node]) -> Poly | None:
    """``value`` as a polynomial in ``x`` ({power: coefficient}); the nodes it reads
    go into ``nodes``. None where it is not one."""
    if value is x:
        return {1: 1.0}
    constant = _scalar(value)
    if constant is not None:
        return {0: constant}
    node = _arithmetic(value)
    if node is None or len(nodes) > _MAX_NODES:
        return None
    nodes[id(node)] = node
    a = _poly(node.inputs[0], x, nodes)
    if a is None:
        return None
    if node.op_type == "Neg":
        return {k: -c for k, c in a.items()}
    if node.op_type == "Pow":
        result: Poly = {0: 1.0}
        for _ in range(_power(node) or 0):
            result = _times(result, a)
        return result
    b = _poly(node.inputs[1], x, nodes)
    return _combine(node.op_type, a, b) if b is not None else None


def _combine(op: str, a: Poly, b: Poly) -> Poly | None:
    if op == "Add":
        return _plus(a, b, 1.0)
    if op == "Sub":
        return _plus(a, b, -1.0)
    if op == "Mul":
        return _times(a, b)
    constant = b.get(0) if len(b) == 1 and 0 in b else None  # Div by a constant only
    return {k: c / constant for k, c in a.items()} if constant else None


def _plus(a: Poly, b: Poly, sign: float) -> Poly:
    out = dict(a)
    for k, c in b.items():
        out[k] = out.get(k, 0.0) + sign * c
    return {k: c for k, c in out.items() if c != 0.0}


def _times(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ka, ca in a.items():
        for kb, cb in b.items():
            k = _add_powers(ka, kb)
            out[k] = out.get(k, 0.0) + ca * cb
    return {k: c for k, c in out.items() if c != 0.0}


def _add_powers(a: int | tuple, b: int | tuple) -> int | tuple:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return tuple(i + j for i, j in zip(a, b, strict=True))
    return a + b  # type: ignore[operator]


def _equal(a: Poly, b: Poly) -> bool:
    return a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=RTOL) for k in a)


def _product(
    t: ir.Value, x: ir.Value, nodes: dict[int, ir.Node]
) -> tuple[ir.Value, tuple[float, float], dict[int, ir.Node]] | None:
    """Follow the Erf's output through single-reader arithmetic, each other operand a
    polynomial in ``x``, to where the value is ``a x + b x t``: that value, ``(a, b)``
    and the nodes up to it; None where it never is."""
    current, expression = t, {(0, 1): 1.0}
    found = None
    for _ in range(_MAX_STEPS):
        uses = current.uses()
        if len(uses) != 1 or current.is_graph_output():
            break
        node = uses[0].node
        if node.op_type not in _ARITHMETIC - {"Pow"} or node.domain not in ("", "ai.onnx"):
            break
        expression = _step(node, uses[0].idx, expression, x, nodes)
        if expression is None:
            break
        nodes[id(node)] = node
        current = node.outputs[0]
        if set(expression) != set(_GATE):
            if found is not None:
                break  # the run of a x + b x t is over
            continue
        found = (current, (expression[(1, 0)], expression[(1, 1)]), dict(nodes))
        if _equal(expression, _GATE):
            break
    return found


def _step(
    node: ir.Node, index: int, expression: Poly, x: ir.Value, nodes: dict[int, ir.Node]
) -> Poly | None:
    """What ``node`` makes of ``expression`` read at input ``index``."""
    if node.op_type == "Neg":
        return {k: -c for k, c in expression.items()}
    other = _poly(node.inputs[1 - index], x, nodes)
    if other is None:
        return None
    lifted = {(k, 0): c for k, c in other.items()}
    if node.op_type == "Add":
        return _plus(expression, lifted, 1.0)
    if node.op_type == "Sub":
        return _plus(expression, lifted, -1.0) if index == 0 else _plus(lifted, expression, -1.0)
    if node.op_type == "Mul":
        return _times(expression, lifted)
    if index != 0 or list(other) != [0] or not other[0]:
        return None  # a division by x or t is no GELU
    return {k: c / other[0] for k, c in expression.items()}


def _closed(nodes: dict[int, ir.Node], output: ir.Value) -> bool:
    """Whether nothing outside the block reads a value inside it but the output."""
    for node in nodes.values():
        for value in node.outputs:
            if value is output:
                continue
            if value.is_graph_output() or any(id(u.node) not in nodes for u in value.uses()):
                return False
    return True
