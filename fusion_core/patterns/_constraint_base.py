"""What every constraint kind builds on: the comparison fields and the words of a failure.

A constraint that compares a quantity (an attribute, a dimension, a count) takes the
fields ``eq``, ``ne``, ``in``, ``not_in``, ``ge``, ``gt``, ``le``, ``lt`` rather than an
expression, so nothing evaluates user text; a failed comparison says what the value is
and what was expected, and ``describe_ref`` names the graph value behind a reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import onnx_ir as ir
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "Binding",
    "Comparison",
    "ValueConstraint",
    "describe_ref",
    "known_dim",
    "show_value",
]

Scalar = int | float | str
AttrValue = Scalar | list[int] | list[float] | list[str]


class Binding(Protocol):
    """What a constraint reads of a candidate: its nodes and the values its references
    resolve to. ``Match`` is one; a protocol, because the spec lists constraints and a
    match holds its spec, so the constraint kinds sit below both."""

    @property
    def nodes(self) -> Mapping[str, ir.Node]: ...

    def node(self, node_id: str) -> ir.Node: ...

    def value(self, ref: str) -> ir.Value | None: ...


class Comparison(BaseModel):
    """Comparison fields shared by the constraint kinds that compare a quantity."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    eq: AttrValue | None = None
    ne: AttrValue | None = None
    in_: list[AttrValue] | None = Field(default=None, alias="in")
    not_in: list[AttrValue] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> Comparison:
        if not self._comparisons():
            raise ValueError("give at least one comparison: eq, ne, in, not_in, ge, gt, le, lt")
        return self

    def _comparisons(self) -> list[tuple[str, Any]]:
        names = ("eq", "ne", "in_", "not_in", "ge", "gt", "le", "lt")
        return [(n.rstrip("_"), getattr(self, n)) for n in names if getattr(self, n) is not None]

    def compare(self, actual: Any) -> str | None:
        """None if ``actual`` satisfies every comparison, else what it failed."""
        for op, expected in self._comparisons():
            if not _holds(op, actual, expected):
                wanted = f"{op.replace('_', ' ')} {show_value(expected)}"
                return f"is {show_value(actual)}, expected {wanted}"
        return None


def _holds(op: str, actual: Any, expected: Any) -> bool:
    if op == "eq":
        return _equal(actual, expected)
    if op == "ne":
        return not _equal(actual, expected)
    if op == "in":
        return any(_equal(actual, e) for e in expected)
    if op == "not_in":
        return not any(_equal(actual, e) for e in expected)
    values = np.asarray(actual, dtype=np.float64).ravel()
    if values.size == 0:
        return False
    return bool(
        {
            "ge": np.all(values >= expected),
            "gt": np.all(values > expected),
            "le": np.all(values <= expected),
            "lt": np.all(values < expected),
        }[op]
    )


def _equal(actual: Any, expected: Any) -> bool:
    if isinstance(actual, np.ndarray):
        return bool(np.all(actual == np.asarray(expected)))
    if isinstance(actual, (list, tuple)) or isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or not isinstance(expected, (list, tuple)):
            return False
        return len(actual) == len(expected) and all(
            _equal(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, float) or isinstance(expected, float):
        if isinstance(actual, str) or isinstance(expected, str):
            return False
        return math.isclose(float(actual), float(expected), rel_tol=1e-6, abs_tol=1e-12)
    return actual == expected


def show_value(value: Any) -> str:
    """A value as a failure shows it: a large array by its shape and range."""
    if isinstance(value, np.ndarray):
        if value.size > 6:
            return f"an array of shape {list(value.shape)} (min {value.min()}, max {value.max()})"
        return str(value.tolist())
    return repr(value)


def describe_ref(ref: str, value: ir.Value | None) -> str:
    """``bn.in1 ('bn1.weight')``: the reference and, where it has one, the value's name."""
    return f"{ref} ({value.name!r})" if value is not None and value.name else ref


def known_dim(ref: str, value: ir.Value | None, axis: int) -> int | str:
    """Dimension ``axis`` of ``value`` when it is a number, else a sentence saying why not."""
    shape = value.shape if value is not None else None
    label = f"dimension {axis} of {describe_ref(ref, value)}"
    if shape is None or not -len(shape) <= axis < len(shape):
        return f"{label} is unknown"
    size = shape[axis]
    if not isinstance(size, int):
        return f"{label} is symbolic ({size})"
    return size


class ValueConstraint(Comparison):
    """A comparison about one value; ``optional`` lets an absent optional input pass."""

    value: str
    optional: bool = False

    def refs(self) -> list[str]:
        return [self.value]

    def _resolve(self, match: Binding) -> tuple[ir.Value | None, str | None]:
        value = match.value(self.value)
        if value is None:
            return None, (None if self.optional else f"{self.value} is absent")
        return value, None
