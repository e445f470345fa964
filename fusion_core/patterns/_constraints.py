"""Declarative constraints of a pattern: data validated by schema, checked with a reason.

Each constraint kind is a pydantic model with a ``kind`` tag; ``check(match)`` (any
``Binding``, as a ``Match`` is) returns None when it holds and otherwise a sentence
that names the value that failed, e.g. ``bn.in1 ('bn1.weight') is not a constant
initializer``. Nothing here evaluates user text: comparisons are fields (``eq``,
``in``, ``ge``, ...), not expressions.

Here: the kinds about nodes, constants, dtypes, consumers, formulas and the opset, and
the ``Constraint`` union of all kinds. The shape kinds are ``_shape_constraints.py``;
the comparison fields they share, ``_constraint_base.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
import onnx_ir as ir
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autofusion.fusion_core.ir import constant_array, constant_tensor, consumers
from autofusion.fusion_core.patterns._attributes import attribute_value
from autofusion.fusion_core.patterns._constraint_base import (
    Binding,
    Comparison,
    ValueConstraint,
    describe_ref,
    known_dim,
    show_value,
)
from autofusion.fusion_core.patterns._formula import Formula, FormulaError, compile_formula
from autofusion.fusion_core.patterns._refs import parse_ref
from autofusion.fusion_core.patterns._shape_constraints import (
    BroadcastableConstraint,
    ChannelwiseConstraint,
    RankConstraint,
    SameShapeConstraint,
    ShapeConstraint,
    StaticShapeConstraint,
)

__all__ = ["Constraint", "constraint_ref_nodes"]


class AttrConstraint(Comparison):
    """An attribute of a node compared with values: ``Conv.group == 1``."""

    kind: Literal["attr"]
    node: str
    name: str
    # Pass when the op (at this opset) has no such attribute, e.g. training_mode < 14.
    missing_ok: bool = False

    def refs(self) -> list[str]:
        return [f"{self.node}.out0"]

    def check(self, match: Binding) -> str | None:
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

    def check(self, match: Binding) -> str | None:
        for ref in self.values:
            value = match.value(ref)
            if value is None:
                if self.optional:
                    continue
                return f"{ref} is absent"
            if constant_tensor(value) is None:  # not read: a weight may be lazy
                return f"{describe_ref(ref, value)} is not a constant initializer"
        return None


class ValuesConstraint(ValueConstraint):
    """Every element of a constant compared with a number: ``gamma > 0``."""

    kind: Literal["values"]

    def check(self, match: Binding) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        array = constant_array(value)
        if array is None:
            return f"{describe_ref(self.value, value)} is not a constant initializer"
        failure = self.compare(array)
        return f"the values of {describe_ref(self.value, value)} {failure}" if failure else None


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

    def check(self, match: Binding) -> str | None:
        allowed = {t.upper() for t in self.in_}
        for ref in self.values:
            value = match.value(ref)
            if value is None:
                continue
            dtype = value.dtype
            if dtype is None or dtype.name not in allowed:
                shown = dtype.name if dtype is not None else "unknown"
                expected = f"expected one of {sorted(allowed)}"
                return f"{describe_ref(ref, value)} has dtype {shown}, {expected}"
        return None


class ConsumersConstraint(ValueConstraint):
    """How many nodes read a value (``max`` is a shorthand for ``le``)."""

    kind: Literal["consumers"]
    max: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _max_is_le(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max" in data and "le" not in data:
            data = {**data, "le": data["max"]}
        return data

    def check(self, match: Binding) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        count = len(consumers(value))
        failure = self.compare(count)
        if failure is None:
            return None
        readers = ", ".join(repr(n.name) for n in consumers(value)[:4])
        return (
            f"{describe_ref(self.value, value)} has {count} consumer(s) [{readers}] and {failure}"
        )


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

    def check(self, match: Binding) -> str | None:
        value = match.value(self.value)
        array = constant_array(value)
        if array is None:
            return f"{describe_ref(self.value, value)} is not a constant initializer"
        expected = self.formula.evaluate(lambda ref, axis: known_dim(ref, match.value(ref), axis))
        if isinstance(expected, str):
            return expected
        if not np.allclose(array, expected, rtol=self.rtol, atol=self.atol):
            return (
                f"the values of {describe_ref(self.value, value)} are {show_value(array)}, "
                f"expected {self.equals} = {expected:.8g} (rtol {self.rtol}, atol {self.atol})"
            )
        return None


class OpsetConstraint(Comparison):
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

    def check(self, match: Binding) -> str | None:
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
