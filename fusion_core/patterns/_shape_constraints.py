"""The constraint kinds about shapes: rank, one dimension, static, equal, broadcast, per-channel.

Each reads the shapes the pre-passes inferred; an unknown or symbolic dimension fails
with a sentence that says so, never a guess.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autofusion.fusion_core.patterns._constraint_base import (
    Binding,
    ValueConstraint,
    describe_ref,
    known_dim,
)

__all__ = [
    "BroadcastableConstraint",
    "ChannelwiseConstraint",
    "RankConstraint",
    "SameShapeConstraint",
    "ShapeConstraint",
    "StaticShapeConstraint",
]


class RankConstraint(ValueConstraint):
    """The rank of a value, which must be known."""

    kind: Literal["rank"]

    def check(self, match: Binding) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        if value.shape is None:
            return f"the rank of {describe_ref(self.value, value)} is unknown"
        failure = self.compare(len(value.shape))
        return f"the rank of {describe_ref(self.value, value)} {failure}" if failure else None


class ShapeConstraint(ValueConstraint):
    """One dimension of a value compared with a number: ``W.shape[1] == 1``."""

    kind: Literal["shape"]
    dim: int

    def check(self, match: Binding) -> str | None:
        value, failure = self._resolve(match)
        if value is None:
            return failure
        dim = known_dim(self.value, value, self.dim)
        if isinstance(dim, str):
            return dim
        failure = self.compare(dim)
        label = f"dimension {self.dim} of {describe_ref(self.value, value)}"
        return f"{label} {failure}" if failure else None


class StaticShapeConstraint(BaseModel):
    """Every listed value has a fully known shape."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["static_shape"]
    values: list[str] = Field(min_length=1)

    def refs(self) -> list[str]:
        return list(self.values)

    def check(self, match: Binding) -> str | None:
        for ref in self.values:
            value = match.value(ref)
            if value is not None and (value.shape is None or not value.shape.is_static()):
                return f"the shape of {describe_ref(ref, value)} is not static ({value.shape})"
        return None


class SameShapeConstraint(BaseModel):
    """The listed values have equal, known shapes."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["same_shape"]
    values: list[str] = Field(min_length=2)

    def refs(self) -> list[str]:
        return list(self.values)

    def check(self, match: Binding) -> str | None:
        first = match.value(self.values[0])
        for ref in self.values[1:]:
            other = match.value(ref)
            if first is None or other is None or first.shape is None or other.shape is None:
                return f"the shapes of {self.values[0]} and {ref} are not both known"
            if first.shape != other.shape:
                return (
                    f"{describe_ref(self.values[0], first)} has shape {first.shape} but "
                    f"{describe_ref(ref, other)} has shape {other.shape}"
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

    def check(self, match: Binding) -> str | None:
        value, target = match.value(self.value), match.value(self.to)
        if value is None or target is None or value.shape is None or target.shape is None:
            return f"the shapes of {self.value} and {self.to} are not both known"
        small, big = list(value.shape), list(target.shape)
        ok = len(small) <= len(big) and all(
            s == 1 or s == b for s, b in zip(reversed(small), reversed(big), strict=False)
        )
        if not ok:
            return (
                f"{describe_ref(self.value, value)} of shape {value.shape} does not broadcast "
                f"to {describe_ref(self.to, target)} of shape {target.shape}"
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

    def check(self, match: Binding) -> str | None:
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
                f"{describe_ref(self.value, value)} of shape {value.shape} is not per-channel "
                f"along axis {self.axis} of {describe_ref(self.like, like)} ({like.shape})"
            )
        return None
