"""Where a rotary embedding's cos and sin come from, as the fused op reads them.

The rotary rewriter (``rotary.py``) proves the rotation; this reads its angles: a
``[Bc, S, r]`` value the graph computes (from ``inv_freq`` and the positions, halves
concatenated or repeated, or folded into the batch), or a constant table gathered by
position ids, or a constant table folded for one length; the op's inputs made from it
are ``_rotary_inputs``'s.

Whether a table's rows are the heads' positions and its batch theirs (or 1) is decided
on the sizes the graph proves (``Heads``: ``FusedSizeProof``), the labels only where the
proof cannot tell: an inference may label a table of other positions with the heads'
sequence symbol, and the op then reads rows the table does not have.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters._fused_sizes import one_or_same, proven_dims, same_axis
from autofusion.fusion_core.rewriters._mask_sizes import shown_sizes
from autofusion.fusion_core.sizes import Dim, SizeProof, axes_of, known_dims

__all__ = ["AngleTable", "Heads", "angle_table", "one_rotation"]


class Heads(NamedTuple):
    """The rotated heads ``x`` the angles are checked against: its ``dims``
    (``proven_dims``: the numbers the proof gives, labels where it cannot tell) and the
    rewrite's ``proof``."""

    value: ir.Value
    dims: list[Dim]
    proof: SizeProof

    @classmethod
    def of(cls, value: ir.Value, proof: SizeProof) -> Heads | None:
        dims = proven_dims(value, proof)
        return None if dims is None else cls(value, dims, proof)

    def same(self, table: ir.Value | None, axis: int, x_axis: int) -> bool:
        """Whether ``table`` is as long on ``axis`` as the heads on ``x_axis``."""
        return same_axis(self.proof, (table, axis), (self.value, x_axis))

    def batched(self, table: ir.Value | None, x_axis: int = 0) -> bool | None:
        """Whether ``table``'s axis 0 is the heads' batch (True) or 1 (False); None: neither."""
        return one_or_same(self.proof, (table, 0), (self.value, x_axis))

    def dims_of(self, value: ir.Value | None) -> list[Dim] | None:
        """Another value's dims as ``dims`` are read (numbers proven first)."""
        return proven_dims(value, self.proof)

    def covers(self, table: ir.Value | None, last: int, x_axis: int) -> bool:
        """Whether ``table`` is ``[Bc, S, last]``, ``S`` the heads' on ``x_axis``."""
        dims = self.dims_of(table)
        return (
            dims is not None and len(dims) == 3 and dims[2] == last and self.same(table, 1, x_axis)
        )

    def shown(self, table: ir.Value | None, axis: int, x_axis: int) -> str:
        """The proven sizes of ``table`` on ``axis`` and of the heads on ``x_axis``, for
        a near miss."""
        sizes = [self.proof.size(table, axis), self.proof.size(self.value, x_axis)]
        found, want = shown_sizes(sizes)
        return f"proven {found} against the heads' {want}"


class AngleTable:
    """Where a rotary angle's cosine (or sine) comes from: the ``[Bc, S, r]`` value ``c``
    computed in the graph (``batched``: ``Bc`` is the batch), or a constant table
    gathered by position ids ``ids``."""

    def __init__(
        self,
        value: ir.Value,
        batched: bool,
        table: np.ndarray | None,
        ids: ir.Value | None,
        *,
        half: bool = False,  # value is the half already ([Bc, S, r / 2]: interleaved)
        pairs: bool = False,  # value repeats each entry twice ([Bc, S, r]: Cohere, GLM)
    ):
        self.value, self.batched, self.table, self.ids = value, batched, table, ids
        self.half, self.pairs = half, pairs


def angle_table(
    value: ir.Value | None, heads: Heads, rotary_dim: int, what: str
) -> AngleTable | str:
    """The ``[Bc, S, r]`` cosine or sine behind ``Unsqueeze(c, 1)``, proven to have equal
    halves, or why not."""
    producer = value.producer() if value is not None else None
    x_dims = heads.dims
    halves = _repeated_halves(producer, heads, rotary_dim, what)
    if halves is not None:
        return halves
    folded = _folded_table(value, x_dims, rotary_dim, what)
    if folded is not None:
        return folded
    flat = _flat_table(producer, heads, rotary_dim, what)
    if flat is not None:
        return flat
    if producer is None or producer.op_type != "Unsqueeze" or axes_of(producer) != [1]:
        name = value.name if value is not None else None
        return (
            f"the {what} {name!r} is not Unsqueeze(c, axis 1) of a [batch, S, {rotary_dim}] table"
        )
    table = producer.inputs[0]
    dims = heads.dims_of(table)
    if dims is None or len(dims) != 3 or dims[2] != rotary_dim:
        return f"the {what} table {table.name!r} is not known to be [batch or 1, S, {rotary_dim}]"
    if not heads.same(table, 1, 2):
        return (
            f"the {what} table {table.name!r} ({dims}) does not cover the S of the heads "
            f"{x_dims} ({heads.shown(table, 1, 2)})"
        )
    batched = heads.batched(table)
    if batched is None:
        return (
            f"the batch of the {what} table {table.name!r} ({dims[0]}) is neither 1 nor "
            f"that of the heads ({x_dims[0]}; {heads.shown(table, 0, 0)})"
        )
    gathered = _gathered_table(table, rotary_dim)
    if gathered is not None:
        return gathered
    reason = _equal_halves(table)
    if reason is not None:
        return f"cannot show that the halves of the {what} table {table.name!r} are equal: {reason}"
    return AngleTable(table, batched, None, None)


def _flat_table(
    producer: ir.Node | None, heads: Heads, rotary_dim: int, what: str
) -> AngleTable | str | None:
    """``Unsqueeze(c, 0)`` of a ``[S, r]`` table with no batch axis (Pixtral's 2-D
    angles of the patches, one table for the joined images): ``[1, S, r]`` broadcasts
    over the heads' batch as ``Unsqueeze(c', 1)`` of ``c' = [1, S, r]`` does, so row
    ``s`` is position ``s`` of every batch, the cache read at positions ``0 .. S - 1``.
    None when not that form."""
    if producer is None or producer.op_type != "Unsqueeze" or axes_of(producer) != [0]:
        return None
    table = producer.inputs[0]
    dims = heads.dims_of(table)
    if dims is None or len(dims) != 2:
        return None
    if dims[1] != rotary_dim or not heads.same(table, 0, 2):
        return (
            f"the {what} table {table.name!r} ({dims}) is not [S, {rotary_dim}] for the heads "
            f"{heads.dims} ({heads.shown(table, 0, 2)})"
        )
    reason = _equal_halves(table)
    if reason is not None:
        return f"cannot show that the halves of the {what} table {table.name!r} are equal: {reason}"
    return AngleTable(table, False, None, None)


def _repeated_halves(
    producer: ir.Node | None, heads: Heads, rotary_dim: int, what: str
) -> AngleTable | str | None:
    """``Concat(u, u, axis=-1)`` of ``u = Unsqueeze(t, 1)``, ``t`` a ``[Bc, S, r / 2]``
    table (the canonical ``rotary_halves`` repeats gpt-oss's angles so): its halves are
    equal by construction and ``t`` is the cache itself. None when not that form."""
    if producer is None or producer.op_type != "Concat" or len(producer.inputs) != 2:
        return None
    first, second = producer.inputs
    if first is None or first is not second or attribute_value(producer, "axis", 0) not in (-1, 3):
        return None
    x_dims = heads.dims
    if constant_array(first) is not None:
        return _constant_half(first, x_dims, rotary_dim, what)
    unsqueeze = first.producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or axes_of(unsqueeze) != [1]:
        return f"the {what} {first.name!r} repeated over both halves is not Unsqueeze(c, 1)"
    table = unsqueeze.inputs[0]
    dims = heads.dims_of(table)
    if not heads.covers(table, rotary_dim // 2, 2):
        return (
            f"the {what} table {table.name!r} ({dims}) is not [batch or 1, S, {rotary_dim // 2}] "
            f"for heads {x_dims}"
        )
    batched = heads.batched(table)
    if batched is None:
        return f"the batch of the {what} table {table.name!r} ({dims[0]}) is neither 1 nor B"
    return AngleTable(table, batched, None, None, half=True)


def _constant_half(value: ir.Value, x_dims: list, rotary_dim: int, what: str) -> AngleTable | str:
    """A constant ``[1, 1, S, r / 2]`` angle repeated over both halves: the angles of a
    graph exported for one length (Bailing-hybrid's dynamo prefill at ``[1, 7]``: the
    rotary tables folded). Row ``s`` multiplies position ``s`` of every head and batch,
    so the rows are the cache, read at positions ``0 .. S - 1`` (position ids
    ``Range(0, S)``, onnxruntime's offset 0); a table with rows per head or per batch,
    or one row for every position, is no such cache."""
    array = constant_array(value)
    assert array is not None
    half, length = rotary_dim // 2, x_dims[2]
    if array.ndim != 4 or array.shape[:2] != (1, 1) or array.shape[3] != half:
        return (
            f"the constant {what} {value.name!r} {list(array.shape)} is not one row per "
            f"position [1, 1, S, {half}]"
        )
    if not isinstance(length, int) or array.shape[2] != length:
        return (
            f"the constant {what} {value.name!r} {list(array.shape)} does not hold one row "
            f"per position of the heads {x_dims}"
        )
    return AngleTable(value, False, array[0, 0].astype(np.float32), None, half=True)


def _folded_table(
    value: ir.Value | None, x_dims: list, rotary_dim: int, what: str
) -> AngleTable | str | None:
    """A constant ``[1, 1, S, r]`` cosine or sine: ``Unsqueeze(c, 1)`` of a ``[1, S, r]``
    table that constant folding computed (a graph exported for one length, whose
    positions are ``0 .. S - 1``); its first half, one row per position, is the cache.
    None when ``value`` is no such constant."""
    array = constant_array(value) if value is not None else None
    if array is None or array.ndim != 4 or array.shape[:2] != (1, 1):
        return None
    if array.shape[2] != x_dims[2] or array.shape[3] != rotary_dim:
        return (
            f"the constant {what} {value.name!r} {list(array.shape)} does not cover the "  # type: ignore[union-attr]
            f"heads {x_dims} (rotary dimension {rotary_dim})"
        )
    half = rotary_dim // 2
    if not np.array_equal(array[..., :half], array[..., half:]):
        return f"the halves of the constant {what} {value.name!r} differ"  # type: ignore[union-attr]
    return AngleTable(value, False, array[0, 0, :, :half].astype(np.float32), None)  # type: ignore[arg-type]


def _gathered_table(value: ir.Value, rotary_dim: int) -> AngleTable | str | None:
    """``Gather(constant table, ids)``: the table and ids (None when not that form)."""
    producer = value.producer()
    if (
        producer is None
        or producer.op_type != "Gather"
        or attribute_value(producer, "axis", 0) != 0
    ):
        return None
    table = constant_array(producer.inputs[0])
    if table is None or table.ndim != 2 or table.shape[1] != rotary_dim:
        return None
    half = rotary_dim // 2
    if not np.array_equal(table[:, :half], table[:, half:]):
        return f"the halves of the constant table {producer.inputs[0].name!r} differ"
    ids = producer.inputs[1]
    ids_dims = known_dims(ids)
    if ids_dims is None or len(ids_dims) != 2:
        return f"the position ids {ids.name!r} of the table are not [batch, S]"
    return AngleTable(value, True, table[:, :half].astype(np.float32), ids)


_SCALAR_OPS = frozenset({"Mul", "Div", "Add", "Sub"})


def _equal_halves(value: ir.Value) -> str | None:
    """Why ``value[..., :h] == value[..., h:]`` is not shown by its computation, or None:
    elementwise steps (Cos, Sin, Cast, Neg, a scalar constant) back to ``Concat(f, f)``."""
    for _ in range(8):
        producer = value.producer()
        if producer is None:
            return f"{value.name!r} is not computed in the graph"
        op = producer.op_type
        if op == "Concat":
            inputs = producer.inputs
            if (
                len(inputs) == 2
                and inputs[0] is inputs[1]
                and attribute_value(producer, "axis", 0) in (-1, 2)
            ):
                return None
            return f"Concat {producer.name!r} does not repeat one value along the last axis"
        if op in ("Cos", "Sin", "Cast", "Identity", "Neg"):
            value = producer.inputs[0]
            continue
        if op in _SCALAR_OPS:
            constants = [constant_array(v) for v in producer.inputs]
            if constants[1] is not None and constants[1].size == 1 and constants[0] is None:
                value = producer.inputs[0]
                continue
            if op in ("Mul", "Add") and constants[0] is not None and constants[0].size == 1:
                value = producer.inputs[1]
                continue
        return f"{op} {producer.name!r} is not an elementwise step of the angle"
    return "the angle's computation is longer than the steps followed"


def one_rotation(cos: AngleTable, sin: AngleTable) -> str | None:
    """Why two constant caches are not the cosine and sine of one angle per entry, or
    None (also where either is computed: its Cos or Sin is read from the graph). The
    op would compute the same products from any two tables; this keeps a product by
    two unrelated constants from being named a rotation. ``cos^2 + sin^2`` must be one
    number over the whole table, 1 or a scaling's square (YaRN scales both)."""
    if cos.table is None or sin.table is None:
        return None
    if cos.table.shape != sin.table.shape:
        return f"the cos and sin caches are {cos.table.shape} and {sin.table.shape}"
    norms = cos.table.astype(np.float64) ** 2 + sin.table.astype(np.float64) ** 2
    # 1e-2: float16 tables round each entry by up to 2^-11; other angles miss by far more
    if norms.size and np.allclose(norms, norms.flat[0], rtol=1e-2, atol=0) and norms.flat[0] > 0:
        return None
    return (
        f"the constant tables {cos.value.name!r} and {sin.value.name!r} are not the cosine "
        "and sine of one angle per entry (cos^2 + sin^2 varies)"
    )
