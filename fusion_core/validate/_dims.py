"""The sizes of a model's dynamic dimensions for generated check inputs.

A graph input dimension is a number, a name (``batch``, ``sequence``), an expression of
names (optimum-onnx writes a decoder's ``attention_mask`` as
``[batch_size, past_sequence_length + sequence_length]``), or nothing at all
(paddle2onnx writes ``-1``, others leave it unnamed). Every unnamed one gets the name
``input[axis]`` (``x[2]``), so the user can give it with ``--shape 'x[2]=640'`` like
any other; an expression is computed from its names, so the inputs it ties stay
consistent.

Each free name gets a size by the role it plays, in order of preference:

- ``batch``: axis 0, a name that says batch, or axis 1 of an RNN state
  (``[layers, batch, hidden]``, as torch lays out LSTM/GRU states): 1;
- ``spatial``: axes 2+ of a 4-D/5-D float input (an image): 224, then other common
  sizes (detectors and OCR models need multiples of 32; 1x1 breaks their Resize);
- ``past``: a name that says past (a KV cache): 4;
- ``sequence``: axes 1+ of an integer input (token ids), or a name that says
  sequence/length/time: 16, then shorter ones;
- ``other``: 1, then larger sizes (an audio model wants hundreds of samples).

A name that says total (``total_sequence_length``, as torch's dynamo exporter names a
decoder's mask length beside ``past_sequence_length`` and ``sequence_length``) is the
past plus the sequence when the model has free names of both roles: a cache graph's
mask spans the cached and the new tokens, which names alone do not say.

``candidate_dims`` lists a few such assignments, most typical first; the check runs the
original model on each until one runs (``fusion_core.validate._reference``).

``second_length_dims`` is the settled assignment again with every free sequence name at
7 (``SECOND_LENGTH``): a model that pads the sequence to a multiple of a chunk and cuts
it back computes the same at 16 for every chunk that divides 16, so a fusion that lost
the cut passes at 16 alone; 7 is prime and below the usual chunks, and odd.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx

__all__ = [
    "CANDIDATES",
    "SECOND_LENGTH",
    "DimExpressionError",
    "InputDims",
    "candidate_dims",
    "dim_key",
    "evaluate_dim",
    "input_dims",
    "second_length_dims",
    "unnamed_dim_name",
]

_FLOAT_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    }
)
_ROLE_SIZES: dict[str, tuple[int, ...]] = {
    "batch": (1,),
    "spatial": (224, 256, 320, 640, 64, 32),
    "past": (4, 8, 1),
    "sequence": (16, 8, 32, 4, 128, 512),
    "other": (1, 512, 16, 64, 1024, 4),
}
CANDIDATES = max(len(sizes) for sizes in _ROLE_SIZES.values())
SECOND_LENGTH = 7
_BATCH = re.compile(r"batch|^n$|^b$|^bs$", re.IGNORECASE)
_PAST = re.compile(r"past|cache|history", re.IGNORECASE)
_RNN_STATE = re.compile(r"state|hidden|^h0?$|^c0?$|cell", re.IGNORECASE)  # [layers, batch, size]
_SEQUENCE = re.compile(r"seq|len|time|frame|token|step|width|height", re.IGNORECASE)
_TOTAL = re.compile(r"total", re.IGNORECASE)


class DimExpressionError(ValueError):
    """A dimension expression that is not plain integer arithmetic over names."""


def unnamed_dim_name(input_name: str, axis: int) -> str:
    return f"{input_name}[{axis}]"


@dataclass(frozen=True)
class InputDims:
    """The dynamic dimensions of a model's inputs: free names and their roles."""

    roles: dict[str, str]  # free name -> role (first seen wins, in input order)
    expressions: tuple[str, ...]  # dim_params computed from the free names
    # A name seen only inside an expression (dynamo's "32*h") -> that expression and the
    # role of the dim it is: the name is sized so that the dim gets the role's size.
    scaled: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.roles)


def dim_key(input_name: str, axis: int, dim: onnx.TensorShapeProto.Dimension) -> int | str:
    """A dimension as ``random_inputs`` reads it: a size, a name, or an expression."""
    if dim.HasField("dim_value") and dim.dim_value >= 0:
        return dim.dim_value
    if dim.dim_param:
        return dim.dim_param.strip()
    return unnamed_dim_name(input_name, axis)


def input_dims(model: onnx.ModelProto) -> InputDims:
    initializers = {t.name for t in model.graph.initializer}
    roles: dict[str, str] = {}
    expressions: dict[str, None] = {}
    plain: set[str] = set()
    inside: dict[str, tuple[str, str]] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        rank = len(tensor_type.shape.dim)
        for axis, dim in enumerate(tensor_type.shape.dim):
            key = dim_key(value.name, axis, dim)
            if isinstance(key, int):
                continue
            names = _names_in(key)
            if names != [key]:
                expressions[key] = None
                role = _role(key, axis, rank, tensor_type.elem_type, False)
                for name in names:
                    inside.setdefault(name, (key, role))
            else:
                plain.add(key)
            for name in names:
                role = _role(name, axis, rank, tensor_type.elem_type, names == [key])
                if axis == 1 and rank == 3 and _RNN_STATE.search(value.name) and names == [key]:
                    role = "batch"
                roles.setdefault(name, role)
    scaled = {name: how for name, how in inside.items() if name not in plain}
    return InputDims(roles, tuple(expressions), scaled)


def candidate_dims(dims: InputDims, given: Mapping[str, int], k: int) -> dict[str, int]:
    """Assignment ``k`` (0: the most typical) of every free name; ``given`` wins."""
    chosen = {}
    for name, role in dims.roles.items():
        sizes = _ROLE_SIZES[role]
        chosen[name] = int(given[name]) if name in given else sizes[min(k, len(sizes) - 1)]
    for name, (expression, role) in dims.scaled.items():
        if name not in given:
            sizes = _ROLE_SIZES[role]
            target = sizes[min(k, len(sizes) - 1)]
            chosen[name] = _solve(expression, name, target, chosen)
    past = next((n for n, r in dims.roles.items() if r == "past"), None)
    sequence = next(
        (n for n, r in dims.roles.items() if r == "sequence" and not _TOTAL.search(n)), None
    )
    for name in dims.roles:
        if _TOTAL.search(name) and name not in given and past and sequence:
            chosen[name] = chosen[past] + chosen[sequence]
    return chosen


def second_length_dims(
    dims: InputDims, settled: Mapping[str, int], given: Mapping[str, int]
) -> dict[str, int] | None:
    """``settled`` with every sequence name the caller did not give at ``SECOND_LENGTH``
    (13 where it is that already) and the totals computed from it; None when no free
    name is a sequence (nothing to vary, or the caller chose every length)."""
    free = [
        n
        for n, role in dims.roles.items()
        if role == "sequence" and n not in given and not _TOTAL.search(n)
    ]
    if not free:
        return None
    length = 13 if SECOND_LENGTH in {settled.get(n) for n in free} else SECOND_LENGTH
    kept = {n: v for n, v in settled.items() if n in given or not _TOTAL.search(n)}
    return candidate_dims(dims, {**kept, **dict.fromkeys(free, length)}, 0)


def _solve(expression: str, name: str, target: int, values: Mapping[str, int]) -> int:
    """The size of ``name`` that brings ``expression`` closest to ``target`` from below,
    taking it as linear in ``name`` (``32*h``: h = 7 for 224); 1 if it is not."""
    at = {n: evaluate_dim(expression, {**values, name: n}) for n in (1, 2)}
    if at[1] is None or at[2] is None or at[2] <= at[1]:
        return 1
    slope, offset = at[2] - at[1], at[1] - (at[2] - at[1])
    return max(1, (target - offset) // slope)


def _role(name: str, axis: int, rank: int, elem_type: int, plain: bool) -> str:
    if _PAST.search(name):
        return "past"
    if _BATCH.search(name) or (axis == 0 and plain and not _SEQUENCE.search(name)):
        return "batch"
    if elem_type in _FLOAT_TYPES and rank in (4, 5) and axis >= 2:
        return "spatial"
    if _SEQUENCE.search(name) or (elem_type not in _FLOAT_TYPES and axis >= 1):
        return "sequence"
    return "other"


# -- expressions: "past_sequence_length + sequence_length", "2*seq", "(h + 1) // 2" --

_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # a dimension is whole: exporters mean floor division
    ast.Mod: operator.mod,
}


def _parse(text: str) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise DimExpressionError(f"dimension {text!r} is not an expression: {exc}") from None
    return tree


def _names_in(text: str) -> list[str]:
    """The free names of a dimension; ``[text]`` when it is not an expression we read."""
    if len(text) > 200:
        return [text]
    try:
        tree = _parse(text)
        _validate(tree)
    except DimExpressionError:
        return [text]  # a name with odd characters ("unk__3", "x[2]", "b.s"): one name
    if isinstance(tree, ast.Name):
        return [tree.id]
    found = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(found)) or [text]


def _validate(node: ast.expr) -> None:
    if isinstance(node, ast.Name):
        return
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        _validate(node.left)
        _validate(node.right)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        _validate(node.operand)
        return
    raise DimExpressionError(f"unsupported element {type(node).__name__}")


def evaluate_dim(text: str, values: Mapping[str, int]) -> int | None:
    """The size of dimension ``text`` given its names' sizes; None if it cannot be said."""
    if text in values:
        return int(values[text])
    if _names_in(text) == [text]:
        return None
    try:
        result = _evaluate(_parse(text), values)
    except (KeyError, ZeroDivisionError, DimExpressionError):
        return None
    return result if result >= 0 else None


def _evaluate(node: ast.expr, values: Mapping[str, int]) -> int:
    if isinstance(node, ast.Name):
        return int(values[node.id])
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, values)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](
            _evaluate(node.left, values), _evaluate(node.right, values)
        )
    raise DimExpressionError(f"unsupported element {type(node).__name__}")
