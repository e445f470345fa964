"""Seeded random inputs that make sense for the model.

Symbolic dimensions take the value given in ``dims`` (by name; ``_dims`` names the
unnamed ones and computes expressions of names) or 1. What values an
input gets depends on what the graph does with it (``describe_inputs``):

- ``index``: an integer input that reaches input 1 of a ``Gather`` directly or through
  index-preserving ops (``INDEX_PRESERVING``: Cast, Reshape, Unsqueeze, Squeeze,
  Flatten, Expand, Identity) gets values in ``[0, rows)``, ``rows`` being the size of
  the gathered table along the Gather's ``axis`` (an initializer's, a Constant's or a
  value's known shape), the smallest over all such Gathers. Token ids therefore never
  run past a vocabulary.
- ``mask``: an integer input whose name contains "mask", or whose every value-reading
  use (again through index-preserving ops; Shape and Size read no values) is one of
  ``MASK_CONSUMERS`` (comparisons, logic, Where, Mul) gets 0 or 1.
- ``rate``: an integer input named like a sample rate (``sr``, ``sample_rate``) gets
  16000, the rate audio models branch on (silero-vad runs at 8000 or 16000 only).
- ``int``: any other integer input gets ``0 .. int_high - 1``.
- ``bool``: fair coin flips.
- ``float``: ``FloatDistribution``: normal(mean, std), by default standard normal, or
  uniform(low, high).
- ``other`` (strings, complex numbers): not generated; supply such inputs yourself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.validate._dims import dim_key, evaluate_dim

__all__ = [
    "INDEX_PRESERVING",
    "MASK_CONSUMERS",
    "FloatDistribution",
    "InputSpec",
    "describe_inputs",
    "random_inputs",
    "resolve_shape",
]

INDEX_PRESERVING = frozenset(
    {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Identity"}
)
MASK_CONSUMERS = frozenset(
    {
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Not",
        "And",
        "Or",
        "Xor",
        "Where",
        "Mul",
    }
)
_SHAPE_ONLY = frozenset({"Shape", "Size"})
_FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    }
)
_INT_TYPES = frozenset(
    {
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
    }
)

Kind = Literal["index", "mask", "rate", "int", "bool", "float", "other"]
# An integer input named like a sample rate ("sr", "sample_rate") selects a branch in
# audio models (silero-vad runs only at 8000 or 16000 Hz): it gets the common rate.
SAMPLE_RATE = 16000
_RATE_NAME = re.compile(r"^(sr|sample_?rate|sampling_?rate|rate)$", re.IGNORECASE)


@dataclass(frozen=True)
class FloatDistribution:
    """How float inputs are drawn: ``normal(mean, std)`` or ``uniform(low, high)``."""

    kind: Literal["normal", "uniform"] = "normal"
    mean: float = 0.0
    std: float = 1.0
    low: float = -1.0
    high: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("normal", "uniform"):
            raise ConfigError(
                f"unknown float input distribution {self.kind!r}",
                hint="use 'normal' (mean, std) or 'uniform' (low, high)",
            )
        if self.kind == "normal" and not self.std > 0:
            raise ConfigError(f"std must be > 0, got {self.std}", hint="e.g. std=1.0")
        if self.kind == "uniform" and not self.low < self.high:
            raise ConfigError(
                f"uniform needs low < high, got low={self.low} high={self.high}",
                hint="e.g. low=-1.0, high=1.0",
            )

    def sample(self, rng: np.random.Generator, shape: list[int]) -> np.ndarray:
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high, size=shape)
        return rng.normal(self.mean, self.std, size=shape)


@dataclass(frozen=True)
class InputSpec:
    """One graph input and the values it gets. ``high`` is exclusive (ints only)."""

    name: str
    elem_type: int
    # a size, a name, an expression of names, or ``input[axis]`` for an unnamed one
    shape: tuple[int | str, ...]
    kind: Kind
    high: int | None = None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))


def describe_inputs(model: onnx.ModelProto, *, int_high: int = 2) -> list[InputSpec]:
    """The model's non-initializer inputs, each with the kind of values it takes."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    uses = _uses(graph)
    shapes = _known_shapes(graph)
    specs = []
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        elem_type = tensor_type.elem_type
        shape = tuple(dim_key(value.name, axis, d) for axis, d in enumerate(tensor_type.shape.dim))
        kind, high = _kind(value.name, elem_type, uses, shapes, int_high)
        specs.append(InputSpec(value.name, elem_type, shape, kind, high))
    return specs


def resolve_shape(spec: InputSpec, dims: Mapping[str, int]) -> list[int]:
    """Concrete shape: symbolic dims (and expressions of them) from ``dims``, missing ones 1."""
    shape = []
    for d in spec.shape:
        size = d if isinstance(d, int) else evaluate_dim(d, dims)
        shape.append(1 if size is None else size)
    return shape


def random_inputs(
    model: onnx.ModelProto,
    *,
    seed: int,
    dims: Mapping[str, int] | None = None,
    int_high: int = 2,
    distribution: FloatDistribution | None = None,
) -> dict[str, np.ndarray]:
    """One seeded sample for every non-initializer input (see the module docstring)."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    distribution = distribution or FloatDistribution()
    return {
        spec.name: _sample(rng, spec, resolve_shape(spec, dims), distribution)
        for spec in describe_inputs(model, int_high=int_high)
    }


def _sample(
    rng: np.random.Generator, spec: InputSpec, shape: list[int], distribution: FloatDistribution
) -> np.ndarray:
    if spec.kind == "float":
        return distribution.sample(rng, shape).astype(spec.dtype)
    if spec.kind in ("bool", "mask"):
        return rng.integers(0, 2, size=shape).astype(spec.dtype)
    if spec.kind == "rate":
        return np.full(shape, SAMPLE_RATE, dtype=spec.dtype)
    if spec.kind in ("index", "int"):
        return rng.integers(0, spec.high, size=shape).astype(spec.dtype)
    raise ConfigError(
        f"cannot generate values for input {spec.name!r} of type "
        f"{onnx.TensorProto.DataType.Name(spec.elem_type)}",
        hint="supply inputs yourself (an .npz file or an ONNX test-data folder)",
    )


def _kind(
    name: str,
    elem_type: int,
    uses: dict[str, list[tuple[onnx.NodeProto, int]]],
    shapes: dict[str, tuple[int | None, ...]],
    int_high: int,
) -> tuple[Kind, int | None]:
    if elem_type in _FLOAT_TYPES:
        return "float", None
    if elem_type == onnx.TensorProto.BOOL:
        return "bool", None
    if elem_type not in _INT_TYPES:
        return "other", None
    if _RATE_NAME.match(name):
        return "rate", None
    reached = _reached_uses(name, uses)
    rows = [
        r for r in (_gather_rows(node, shapes) for node, i in reached if _is_index(node, i)) if r
    ]
    if rows:
        return "index", min(rows)
    reading = [node for node, _ in reached if node.op_type not in _SHAPE_ONLY]
    if "mask" in name.lower() or (reading and all(n.op_type in MASK_CONSUMERS for n in reading)):
        return "mask", 2
    return "int", int_high


def _uses(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, index))
    return uses


def _reached_uses(
    name: str, uses: dict[str, list[tuple[onnx.NodeProto, int]]]
) -> list[tuple[onnx.NodeProto, int]]:
    """Every use of ``name`` or of a value derived from it by index-preserving ops only
    (those ops themselves excluded)."""
    found, todo, seen = [], [name], {name}
    while todo:
        for node, index in uses.get(todo.pop(), []):
            if _standard(node) and node.op_type in INDEX_PRESERVING and index == 0:
                todo.extend(o for o in node.output if o and o not in seen)
                seen.update(node.output)
            else:
                found.append((node, index))
    return found


def _standard(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _is_index(node: onnx.NodeProto, index: int) -> bool:
    return _standard(node) and node.op_type == "Gather" and index == 1


def _gather_rows(node: onnx.NodeProto, shapes: dict[str, tuple[int | None, ...]]) -> int | None:
    shape = shapes.get(node.input[0])
    if not shape:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    axis = axis + len(shape) if axis < 0 else axis
    rows = shape[axis] if 0 <= axis < len(shape) else None
    return rows if rows else None


def _known_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int | None, ...]]:
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        tensor_type = value.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[value.name] = tuple(
                d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim
            )
    for node in graph.node:
        if node.op_type == "Constant" and _standard(node):
            for a in node.attribute:
                if a.name == "value":
                    shapes[node.output[0]] = tuple(a.t.dims)
    for tensor in graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
    return shapes
