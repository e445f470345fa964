"""Declarative constraints of a pattern: data validated by schema, checked with a reason.

Each constraint kind is a pydantic model with a ``kind`` tag; ``check(match)`` returns
None when it holds and otherwise a sentence that names the value that failed, e.g.
``bn.in1 ('bn1.weight') is not a constant initializer``. Nothing here evaluates user
text: comparisons are fields (``eq``, ``in``, ``ge``, ...), not expressions.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Annotated, Any, Literal

import numpy as np
import onnx
import onnx_ir as ir
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autofusion.fusion_core.ir import constant_array, consumers
from autofusion.fusion_core.patterns._formula import Formula, FormulaError, compile_formula
from autofusion.fusion_core.patterns._match import Match
from autofusion.fusion_core.patterns._refs import parse_ref

__all__ = ["Constraint", "attribute_value"]

Scalar = int | float | str
AttrValue = Scalar | list[int] | list[float] | list[str]


class _Comparison(BaseModel):
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
    def _at_least_one(self) -> _Comparison:
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
                return f"is {_show(actual)}, expected {op.replace('_', ' ')} {_show(expected)}"
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


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size > 6:
            return f"an array of shape {list(value.shape)} (min {value.min()}, max {value.max()})"
        return str(value.tolist())
    return repr(value)


def _describe(ref: str, value: ir.Value | None) -> str:
    return f"{ref} ({value.name!r})" if value is not None and value.name else ref


# ---------------------------------------------------------------------------------------
# Attribute defaults come from the ONNX operator schemas, so a pattern can say
# `Conv.group == 1` and a Conv that omits `group` still matches.


@lru_cache(maxsize=1024)
def _schema_default(op_type: str, domain: str, opset: int | None, name: str) -> Any:
    try:
        if opset is None:
            schema = onnx.defs.get_schema(op_type, domain=domain)
        else:
            schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return None
    return onnx.helper.get_attribute_value(attr.default_value)


def attribute_value(node: ir.Node, name: str, default: Any = None) -> Any:
    """The attribute's value, else the schema default, else ``default``."""
    attr = node.attributes.get(name)
    if attr is not None:
        value = attr.value
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, (list, tuple)):
            return [v.decode() if isinstance(v, bytes) else v for v in value]
        return value
    domain = node.domain or ""
    graph = node.graph
    opset = None
    if graph is not None:  # defaults can change between opsets: use the model's
        opset = graph.opset_imports.get(domain, graph.opset_imports.get("ai.onnx"))
    schema_default = _schema_default(node.op_type, domain, opset, name)
    if schema_default is None:
        return default
    if isinstance(schema_default, bytes):
        return schema_default.decode()
    return schema_default


# ---------------------------------------------------------------------------------------
# The constraint kinds.


class _ValueConstraint(_Comparison):
    """A comparison about one value; ``optional`` lets an absent optional input pass."""

    value: str
    optional: bool = False

    def refs(self) -> list[str]:
        return [self.value]

    def _resolve(self, match: Match) -> tuple[ir.Value | None, str | None]:
        value = match.value(self.value)
        if value is None:
            return None, (None if self.optional else f"{self.value} is absent")
        return value, None


class AttrConstraint(_Comparison):
    """An attribute of a node compared with values: ``Conv.group == 1``."""

    kind: Literal["attr"]
    node: str
    name: str
    # Pass when the op (at this opset) has no such attribute, e.g. training_mode < 14.
    missing_ok: bool = False

    def refs(self) -> list[str]:
        return [f"{self.node}.out0"]

    def check(self, match: Match) -> str | None:
        node = match.node(self.node)
        actual = attribute_value(node, self.name)
        if actual is None:
            if self.missing_ok:
                return None
            return f"{self.node} ({node.name!r}) has no attribute {self.name!r}"
        failure = self.compare(actual)
        return f"{self.node}.{self.name} of {node.name!r} {failure}" if failure else None


class ConstantConstraint(BaseModel):
    """Each listed value is a constant the model cannot override (an initializer)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["constant"]
    values: list[str] = Field(min_length=1)
    optional: bool = False

    def refs(self) -> list[str]:
        return list(self.values)

    def check(self, match: Match) -> str | None:
        for ref in self.values:
            value = match.value(ref)
            if value is None:
                if self.optional:
                    continue
                return f"{ref} is absent"
            if constant_array(value) is None:
                return f"{_describe(ref, value)} is not a constant initializer"
        return None


class ValuesConstraint(_ValueConstraint):
    """Every element of a constant compared with a number: ``gamma > 0``."""

    kind: Literal["values"]

    def check(self, match: Match) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        array = constant_array(value)
        if array is None:
            return f"{_describe(self.value, value)} is not a constant initializer"
        failure = self.compare(array)
        return f"the values of {_describe(self.value, value)} {failure}" if failure else None


class DtypeConstraint(BaseModel):
    """Element type of each listed value, by ONNX name: ``FLOAT``, ``FLOAT16``..."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    kind: Literal["dtype"]
    values: list[str] = Field(min_length=1)
    in_: list[str] = Field(alias="in", min_length=1)

    @model_validator(mode="after")
    def _known_types(self) -> DtypeConstraint:
        known = {t.name for t in ir.DataType}
        unknown = [t for t in self.in_ if t.upper() not in known]
        if unknown:
            raise ValueError(f"unknown dtype(s) {unknown}; use ONNX names such as FLOAT")
        return self

    def refs(self) -> list[str]:
        return list(self.values)

    def check(self, match: Match) -> str | None:
        allowed = {t.upper() for t in self.in_}
        for ref in self.values:
            value = match.value(ref)
            if value is None:
                continue
            dtype = value.dtype
            if dtype is None or dtype.name not in allowed:
                shown = dtype.name if dtype is not None else "unknown"
                return (
                    f"{_describe(ref, value)} has dtype {shown}, expected one of {sorted(allowed)}"
                )
        return None


class RankConstraint(_ValueConstraint):
    """The rank of a value, which must be known."""

    kind: Literal["rank"]

    def check(self, match: Match) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        if value.shape is None:
            return f"the rank of {_describe(self.value, value)} is unknown"
        failure = self.compare(len(value.shape))
        return f"the rank of {_describe(self.value, value)} {failure}" if failure else None


class ShapeConstraint(_ValueConstraint):
    """One dimension of a value compared with a number: ``W.shape[1] == 1``."""

    kind: Literal["shape"]
    dim: int

    def check(self, match: Match) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        shape = value.shape
        label = f"dimension {self.dim} of {_describe(self.value, value)}"
        if shape is None or not -len(shape) <= self.dim < len(shape):
            return f"{label} is unknown"
        dim = shape[self.dim]
        if not isinstance(dim, int):
            return f"{label} is symbolic ({dim})"
        failure = self.compare(dim)
        return f"{label} {failure}" if failure else None


class StaticShapeConstraint(BaseModel):
    """Every listed value has a fully known shape."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["static_shape"]
    values: list[str] = Field(min_length=1)

    def refs(self) -> list[str]:
        return list(self.values)

    def check(self, match: Match) -> str | None:
        for ref in self.values:
            value = match.value(ref)
            if value is not None and (value.shape is None or not value.shape.is_static()):
                return f"the shape of {_describe(ref, value)} is not static ({value.shape})"
        return None


class SameShapeConstraint(BaseModel):
    """The listed values have equal, known shapes."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["same_shape"]
    values: list[str] = Field(min_length=2)

    def refs(self) -> list[str]:
        return list(self.values)

    def check(self, match: Match) -> str | None:
        first = match.value(self.values[0])
        for ref in self.values[1:]:
            other = match.value(ref)
            if first is None or other is None or first.shape is None or other.shape is None:
                return f"the shapes of {self.values[0]} and {ref} are not both known"
            if first.shape != other.shape:
                return (
                    f"{_describe(self.values[0], first)} has shape {first.shape} but "
                    f"{_describe(ref, other)} has shape {other.shape}"
                )
        return None


class BroadcastableConstraint(BaseModel):
    """``value`` broadcasts to ``to`` without changing ``to``'s shape (numpy rules)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["broadcastable"]
    value: str
    to: str

    def refs(self) -> list[str]:
        return [self.value, self.to]

    def check(self, match: Match) -> str | None:
        value, target = match.value(self.value), match.value(self.to)
        if value is None or target is None or value.shape is None or target.shape is None:
            return f"the shapes of {self.value} and {self.to} are not both known"
        small, big = list(value.shape), list(target.shape)
        ok = len(small) <= len(big) and all(
            s == 1 or s == b for s, b in zip(reversed(small), reversed(big), strict=False)
        )
        if not ok:
            return (
                f"{_describe(self.value, value)} of shape {value.shape} does not broadcast "
                f"to {_describe(self.to, target)} of shape {target.shape}"
            )
        return None


class ChannelwiseConstraint(BaseModel):
    """``value`` is a scalar or varies only along ``axis`` of ``like`` (per-channel)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["channelwise"]
    value: str
    like: str
    axis: int = 1

    def refs(self) -> list[str]:
        return [self.value, self.like]

    def check(self, match: Match) -> str | None:
        value, like = match.value(self.value), match.value(self.like)
        if value is None or like is None or value.shape is None or like.shape is None:
            return f"the shapes of {self.value} and {self.like} are not both known"
        rank, shape = len(like.shape), list(value.shape)
        axis = self.axis % rank if rank else 0
        padded = [1] * (rank - len(shape)) + shape
        ok = len(shape) <= rank and all(d == 1 for i, d in enumerate(padded) if i != axis)
        ok = ok and padded[axis] in (1, like.shape[axis]) if ok else False
        if not ok:
            return (
                f"{_describe(self.value, value)} of shape {value.shape} is not per-channel "
                f"along axis {self.axis} of {_describe(self.like, like)} ({like.shape})"
            )
        return None


class ConsumersConstraint(_ValueConstraint):
    """How many nodes read a value (``max`` is a shorthand for ``le``)."""

    kind: Literal["consumers"]
    max: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _max_is_le(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max" in data and "le" not in data:
            data = {**data, "le": data["max"]}
        return data

    def check(self, match: Match) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        count = len(consumers(value))
        failure = self.compare(count)
        if failure is None:
            return None
        readers = ", ".join(repr(n.name) for n in consumers(value)[:4])
        return f"{_describe(self.value, value)} has {count} consumer(s) [{readers}] and {failure}"


class FormulaConstraint(BaseModel):
    """Every element of a constant equals a formula over matched dimensions, within
    ``rtol``/``atol``: ``scale == 1 / sqrt(dim(q_t.out0, -1))`` (see _formula.py)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["formula"]
    value: str
    equals: str
    rtol: float = Field(default=1e-6, ge=0)
    atol: float = Field(default=0.0, ge=0)

    @field_validator("equals")
    @classmethod
    def _compiles(cls, text: str) -> str:
        try:
            compile_formula(text)
        except FormulaError as exc:
            raise ValueError(str(exc)) from None
        return text

    @property
    def formula(self) -> Formula:
        return compile_formula(self.equals)

    def refs(self) -> list[str]:
        return [self.value, *self.formula.refs]

    def check(self, match: Match) -> str | None:
        value = match.value(self.value)
        array = constant_array(value)
        if array is None:
            return f"{_describe(self.value, value)} is not a constant initializer"

        def dim(ref: str, axis: int) -> int | str:
            target = match.value(ref)
            shape = target.shape if target is not None else None
            if shape is None or not -len(shape) <= axis < len(shape):
                return f"dimension {axis} of {_describe(ref, target)} is unknown"
            size = shape[axis]
            if not isinstance(size, int):
                return f"dimension {axis} of {_describe(ref, target)} is symbolic ({size})"
            return size

        expected = self.formula.evaluate(dim)
        if isinstance(expected, str):
            return expected
        if not np.allclose(array, expected, rtol=self.rtol, atol=self.atol):
            return (
                f"the values of {_describe(self.value, value)} are {_show(array)}, expected "
                f"{self.equals} = {expected:.8g} (rtol {self.rtol}, atol {self.atol})"
            )
        return None


class OpsetConstraint(_Comparison):
    """The model's opset for a domain: ``{kind: opset, lt: 23}`` leaves models that can
    take a whole-block op to the pattern that emits it."""

    kind: Literal["opset"]
    domain: str = ""
    # opset versions are integers (the base class compares floats: 23 would read 23.0)
    ge: int | None = None
    gt: int | None = None
    le: int | None = None
    lt: int | None = None

    def refs(self) -> list[str]:
        return []

    def check(self, match: Match) -> str | None:
        graph = next(iter(match.nodes.values())).graph
        imports = graph.opset_imports if graph is not None else {}
        version = imports.get(self.domain)
        if version is None and self.domain == "":
            version = imports.get("ai.onnx")
        if version is None:
            return f"the model imports no opset for domain {self.domain!r}"
        failure = self.compare(version)
        return f"the model's opset for {self.domain or 'ai.onnx'!r} {failure}" if failure else None


Constraint = Annotated[
    AttrConstraint
    | ConstantConstraint
    | ValuesConstraint
    | DtypeConstraint
    | RankConstraint
    | ShapeConstraint
    | StaticShapeConstraint
    | SameShapeConstraint
    | BroadcastableConstraint
    | ChannelwiseConstraint
    | ConsumersConstraint
    | FormulaConstraint
    | OpsetConstraint,
    Field(discriminator="kind"),
]


def constraint_ref_nodes(constraint: Any) -> list[tuple[str, str]]:
    """(ref text, node id or None for free inputs) for every reference in a constraint."""
    out = []
    for text in constraint.refs():
        ref = parse_ref(text)
        out.append((text, ref.node))
    return out
