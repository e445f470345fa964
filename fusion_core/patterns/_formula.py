"""Arithmetic over the dimensions of matched values, for the ``formula`` constraint.

A pattern can say that a constant equals a function of shapes, such as an attention
scale of ``1 / sqrt(head_size)`` with the head size read from the graph::

    {kind: formula, value: scale.in1, equals: "1 / sqrt(dim(q_t.out0, -1))"}

The text is parsed with Python's ``ast`` and only this grammar is accepted: numbers,
``+ - * / **``, unary ``-``, ``sqrt(x)``, and ``dim(ref, axis)`` where ``ref`` is a value
reference (``node.outK`` / ``node.inK`` written bare, or ``"$name"`` in quotes) and
``axis`` an integer. Nothing is ever evaluated by Python itself, so a pattern uploaded
through the API cannot run code.

A condition (``compile_condition``) is one comparison of two formulas, such as a
strategy's switch ``dim('$pixel_values', -1) > 1024`` (fusion_core/pipeline/switches.py):
it lives here, beside the formulas it compares, so that validating a config checks a
switch without loading the matcher, onnx or the pipeline.

A formula is at most ``MAX_FORMULA_CHARS`` characters and its expression tree at most
``MAX_FORMULA_DEPTH`` deep (``1+1+...+1`` nests one level per term): the checks run
before anything recurses, so a hostile formula is a FormulaError, never a
RecursionError in the parser, the validator or the evaluator.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

from autofusion.fusion_core.patterns._refs import parse_ref

__all__ = [
    "MAX_FORMULA_CHARS",
    "MAX_FORMULA_DEPTH",
    "Condition",
    "Formula",
    "FormulaError",
    "compile_condition",
    "compile_formula",
]

# The attention scale, the longest formula the built-in patterns need, is 30 characters
# and 4 levels deep; these leave room for anything a dimension formula says.
MAX_FORMULA_CHARS = 500
MAX_FORMULA_DEPTH = 32

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type, Callable[[float, float], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}

# dim(ref, axis) -> the dimension, or a string saying why it is not a known integer
DimLookup = Callable[[str, int], "int | str"]


class FormulaError(ValueError):
    """The formula is not in the accepted grammar."""


@dataclass(frozen=True)
class Formula:
    text: str
    tree: ast.expr
    refs: tuple[str, ...]

    def evaluate(self, dim: DimLookup) -> float | str:
        """The value, or why it cannot be computed (an unknown dimension, a division by 0)."""
        try:
            value = _evaluate(self.tree, dim)
        except _Unknown as exc:
            return str(exc)
        except (ZeroDivisionError, OverflowError, ValueError) as exc:
            return f"{self.text!r} cannot be computed here ({exc})"
        if not isinstance(value, float):  # a negative number to a fractional power
            return f"{self.text!r} is not a real number here ({value})"
        return value


@dataclass(frozen=True)
class Condition:
    text: str
    left: Formula
    right: Formula
    compare: Callable[[float, float], bool]

    def evaluate(self, dim: DimLookup) -> bool | str:
        """True or False, or why it cannot be decided."""
        left, right = self.left.evaluate(dim), self.right.evaluate(dim)
        for side in (left, right):
            if isinstance(side, str):
                return side
        return self.compare(left, right)


class _Unknown(Exception):
    pass


def compile_condition(text: str) -> Condition:
    """Parse ``text`` (one comparison of two formulas over graph inputs, ``'$name'``);
    FormulaError says what is wrong."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise FormulaError(f"{text!r} is not a condition: {exc.msg}") from None
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and type(tree.ops[0]) in _COMPARE):
        raise FormulaError(
            f"{text!r} is not a condition: write one comparison, "
            "such as \"dim('$pixel_values', -1) > 1024\""
        )
    left = compile_formula(ast.unparse(tree.left))
    right = compile_formula(ast.unparse(tree.comparators[0]))
    for ref in left.refs + right.refs:
        if not ref.startswith("$"):
            raise FormulaError(
                f"{text!r}: {ref!r} is not a graph input; a switch reads inputs as '$name'"
            )
    return Condition(text, left, right, _COMPARE[type(tree.ops[0])])


def compile_formula(text: str) -> Formula:
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(
            f"the formula is {len(text)} characters long; at most {MAX_FORMULA_CHARS} are "
            "allowed (write the dimension arithmetic more compactly)"
        )
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise FormulaError(f"{text[:80]!r} is not a formula: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, deep nesting
        raise FormulaError(f"{text[:80]!r} is not a formula ({type(exc).__name__})") from None
    _check_depth(tree, text)
    refs: list[str] = []
    _validate(tree, refs)
    return Formula(text=text, tree=tree, refs=tuple(refs))


def _check_depth(tree: ast.expr, text: str) -> None:
    """Iteratively, so a deep tree cannot overflow the stack here either."""
    pending = [(tree, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_FORMULA_DEPTH:
            raise FormulaError(
                f"{text[:80]!r} nests more than {MAX_FORMULA_DEPTH} levels deep (each operator "
                "and call is a level: 1+1+1 is 3); simplify the formula"
            )
        pending.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _validate(node: ast.expr, refs: list[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise FormulaError(f"{node.value!r}: only numbers are allowed as constants")
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        _validate(node.left, refs)
        _validate(node.right, refs)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _validate(node.operand, refs)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id == "sqrt" and len(node.args) == 1:
            _validate(node.args[0], refs)
        elif node.func.id == "dim" and len(node.args) == 2:
            refs.append(_ref_text(node.args[0]))
            _axis(node.args[1])
        else:
            raise FormulaError(f"{ast.unparse(node)}: the functions are sqrt(x) and dim(ref, axis)")
    else:
        raise FormulaError(
            f"{ast.unparse(node)!r} is not allowed: use numbers, + - * / **, sqrt() and dim()"
        )


def _ref_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        text = f"{node.value.id}.{node.attr}"
    else:
        raise FormulaError(f"{ast.unparse(node)}: write a value as node.out<k>, node.in<k> or '$x'")
    try:
        parse_ref(text)
    except ValueError as exc:
        raise FormulaError(str(exc)) from None
    return text


def _axis(node: ast.expr) -> int:
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1, node.operand
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return sign * node.value
    raise FormulaError(f"{ast.unparse(node)}: the axis of dim() is an integer")


def _evaluate(node: ast.expr, dim: DimLookup) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, dim), _evaluate(node.right, dim))
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, dim)
        return -value if isinstance(node.op, ast.USub) else value
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    if node.func.id == "sqrt":
        return math.sqrt(_evaluate(node.args[0], dim))
    size = dim(_ref_text(node.args[0]), _axis(node.args[1]))
    if isinstance(size, str):
        raise _Unknown(size)
    return float(size)
