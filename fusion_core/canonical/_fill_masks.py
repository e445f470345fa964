"""Rules ``whole_scatter``, ``causal_fill`` and ``padding_fill``: the float causal mask
of transformers' older ``AttentionMaskConverter`` (the TorchScript exports of Falcon,
and of the other families before transformers' boolean ``sdpa_mask``) read as
``Where(allowed, 0, lowest)``, the form ``mask_as_bias`` writes and the attention
rewriters prove causal.

That converter builds the mask in float: ``triu(full((S, L), lowest), 1)`` multiplied
by ``arange(L) > cache_position``, broadcast to ``[B, 1, S, L]``, then the padding
written in place, ``mask[:, :, :, :L] = mask.masked_fill(mask + attention_mask == 0,
lowest)``, which the exporter writes as a ScatterND over an index grid. Each rule
rewrites one step, and each is exact:

* ``whole_scatter``: a ScatterND whose indices are the identity grid of its data's
  whole shape (component ``k`` is ``Range(0, dims[k])`` on axis ``k``, broadcast), with
  updates of that same shape, writes every element once: it is its updates;
* ``causal_fill``: ``Trilu(fill, k <= 1, upper) * Cast(key > query)`` with ``key =
  Range(0, L)`` and ``query = Range(P, P + S)`` (``P >= 0``) as a column is
  ``Where(key <= query, 0, fill)``: where ``key > query``, ``j > P + i >= i`` puts the
  element in the Trilu's filled triangle (``j - i >= 1 >= k``), so the product is the
  fill; elsewhere it is ``fill * 0 = -0``. A finite fill only (``-inf * 0`` is NaN);
* ``padding_fill``: ``Where(F + Cast(m) == 0, fill, F)`` for ``F = Where(allowed, 0,
  fill)`` broadcast (leading axes only) and an integer or boolean ``m`` is
  ``Where(allowed And Cast(m, bool), 0, fill)``: where ``F`` is the fill, ``fill + m``
  rounds to the fill (``|m| < 2**63`` is far below half a float32 ulp at ``-1e30``) and
  is not 0; where ``F`` is 0, ``F + m == 0`` exactly when ``m == 0``.

``identity_mask_expand`` takes out an Expand of a mask to its own known shape (the
converter expands the padded part to the shape it already has), which would hide the
``Where`` from the rewriters.

Each applies only to a value some Softmax reads (through the mask's slices and the
addition to the scores): the rules are about attention masks, not about every ScatterND.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import INTEGER_TYPES, drop_unread, replace
from autofusion.fusion_core.canonical._softmax_shift import appends_sink_column
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import (
    Dim,
    axes_of,
    grid_component,
    grid_parts,
    known_dims,
    scalar,
)

__all__ = ["causal_fills", "identity_mask_expands", "padding_fills", "whole_scatters"]

_ONNX = ("", "ai.onnx")
_FILL = -1e30  # a fill at most this: lowest or -inf in the exports
_WALK = 12
# what lies between a mask and the Softmax that reads it
_TO_SOFTMAX = frozenset(
    {"Slice", "Expand", "Unsqueeze", "Reshape", "Identity", "Cast", "Add", "Where", "ScatterND"}
)
_VIEWS = frozenset({"Reshape", "Unsqueeze", "Identity", "Cast"})
_INTEGERS = INTEGER_TYPES


def whole_scatters(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Replace each ScatterND that writes its whole data once by its updates; how many."""
    done = 0
    for node in list(graph):
        if node.op_type != "ScatterND" or node.domain not in _ONNX or len(node.inputs) != 3:
            continue
        out = node.outputs[0]
        if out.is_graph_output() or not _feeds_softmax(out):
            continue
        if attribute_value(node, "reduction", "none") not in ("none", b"none"):
            continue
        data, indices, updates = node.inputs
        dims = known_dims(data)
        if dims is None or None in dims or known_dims(updates) != dims or updates is None:
            continue
        if not _identity_grid(indices, dims):
            continue
        out.replace_all_uses_with(updates)
        graph.remove(node, safe=True)
        drop_unread(graph, [indices.producer() if indices is not None else None])
        done += 1
    return done


def identity_mask_expands(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass each Expand of a mask whose output has its input's known shape; how many."""
    del fresh_name, mark
    done = 0
    for node in list(graph):
        if node.op_type != "Expand" or node.domain not in _ONNX or node.inputs[0] is None:
            continue
        out, source = node.outputs[0], node.inputs[0]
        dims = known_dims(source)
        if out.is_graph_output() or dims is None or None in dims or known_dims(out) != dims:
            continue
        if not _feeds_softmax(out):
            continue
        target = node.inputs[1].producer() if node.inputs[1] is not None else None
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        drop_unread(graph, [target])
        done += 1
    return done


def causal_fills(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rewrite ``Trilu(fill) * Cast(key > query)`` as ``Where(key <= query, 0, fill)``."""
    done = 0
    for node in list(graph):
        if node.op_type != "Mul" or node.domain not in _ONNX or len(node.inputs) != 2:
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.dtype != ir.DataType.FLOAT or not _feeds_softmax(out):
            continue
        for trilu_out, cast_out in (node.inputs, tuple(reversed(node.inputs))):
            found = _causal_parts(trilu_out, cast_out, known_dims(out))
            if found is None:
                continue
            key, query, fill = found
            fill.name = fresh_name("causal_fill_value")
            below = ir.Node("", "LessOrEqual", [key, query], name=fresh_name("causal_fill_le"))
            zero = _float(0.0, fresh_name)
            where = ir.Node("", "Where", [below.outputs[0], zero, fill], name=fresh_name("fill"))
            below.outputs[0].name = fresh_name("causal_fill_allowed")
            below.outputs[0].dtype, below.outputs[0].shape = ir.DataType.BOOL, out.shape
            _typed_like(where.outputs[0], out, fresh_name("causal_fill_mask"))
            producers = [v.producer() for v in node.inputs if v is not None]
            replace(graph, node, [below, where], mark, "causal_fill")
            drop_unread(graph, producers)
            done += 1
            break
    return done


def padding_fills(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rewrite ``Where(F + Cast(m) == 0, fill, F)`` as ``Where(allowed And m, 0, fill)``."""
    done = 0
    for node in list(graph):
        if node.op_type != "Where" or node.domain not in _ONNX:
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.dtype != ir.DataType.FLOAT or not _feeds_softmax(out):
            continue
        found = _padding_parts(node)
        if found is None:
            continue
        allowed, rows, fill = found
        cast = ir.Node("", "Cast", [rows], attributes=[ir.AttrInt64("to", ir.DataType.BOOL)])
        both = ir.Node("", "And", [allowed, cast.outputs[0]])
        zero = _float(0.0, fresh_name)
        where = ir.Node("", "Where", [both.outputs[0], zero, fill])
        for made, label in ((cast, "padding_rows"), (both, "padding_allowed")):
            made.name = fresh_name(f"padding_fill_{made.op_type}")
            made.outputs[0].name = fresh_name(label)
            made.outputs[0].dtype = ir.DataType.BOOL
        cast.outputs[0].shape, both.outputs[0].shape = rows.shape, out.shape
        where.name = fresh_name("padding_fill_Where")
        _typed_like(where.outputs[0], out, fresh_name("padding_fill_mask"))
        producers = [v.producer() for v in node.inputs if v is not None]
        replace(graph, node, [cast, both, where], mark, "padding_fill")
        drop_unread(graph, producers)
        done += 1
    return done


def _causal_parts(
    trilu_out: ir.Value | None, cast_out: ir.Value | None, dims: list[Dim] | None
) -> tuple[ir.Value, ir.Value, ir.Value] | None:
    """(key, query, fill) of ``Trilu(fill, k <= 1, upper) * Cast(key > query)``."""
    trilu = trilu_out.producer() if trilu_out is not None else None
    cast = cast_out.producer() if cast_out is not None else None
    if trilu is None or cast is None or trilu.op_type != "Trilu" or cast.op_type != "Cast":
        return None
    if attribute_value(trilu, "upper", 1) != 1 or dims is None or len(dims) != 2:
        return None
    k = scalar(trilu.inputs[1]) if len(trilu.inputs) > 1 and trilu.inputs[1] is not None else 0
    fill = _filled_constant(trilu.inputs[0])
    if k is None or k > 1 or fill is None or known_dims(trilu_out) != dims:
        return None
    compare = cast.inputs[0].producer() if cast.inputs[0] is not None else None
    if compare is None or compare.op_type not in ("Greater", "Less"):
        return None
    key, query = compare.inputs if compare.op_type == "Greater" else reversed(compare.inputs)
    if known_dims(key) != [dims[1]] or known_dims(query) != [dims[0], 1]:
        return None
    if _range_start(key) != 0 or not _nonnegative(_range_start(query)):
        return None
    return key, query, fill


def _padding_parts(where: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value] | None:
    """(allowed, m, fill) of ``Where(Equal(F + Cast(m), 0), fill, F)``."""
    if len(where.inputs) != 3:
        return None
    condition, fill, masked = where.inputs
    equal = condition.producer() if condition is not None else None
    if equal is None or equal.op_type != "Equal" or masked is None:
        return None
    total, zero = equal.inputs
    add = total.producer() if total is not None else None
    if add is None or add.op_type != "Add" or _constant(zero) != 0.0:
        return None
    rows = next((v for v in add.inputs if v is not masked), None)
    if masked not in add.inputs or rows is None:
        return None
    cast = rows.producer()
    if cast is None or cast.op_type != "Cast" or cast.inputs[0] is None:
        return None
    source = cast.inputs[0]
    inner = _broadcast_source(masked)
    if source.dtype not in _INTEGERS or inner is None:
        return None
    inner_where = inner.producer()
    allowed, inner_zero, inner_fill = inner_where.inputs  # type: ignore[union-attr]
    fill_value = _constant(fill)
    if fill_value is None or fill_value > _FILL or not np.isfinite(fill_value):
        return None
    if _constant(inner_zero) != 0.0 or _constant(inner_fill) != fill_value:
        return None
    out_dims = known_dims(where.outputs[0])
    if out_dims is None or _broadcast(known_dims(allowed), known_dims(source)) != out_dims:
        return None
    return allowed, source, fill  # type: ignore[return-value]


def _broadcast_source(value: ir.Value) -> ir.Value | None:
    """The ``Where(allowed, 0, fill)`` that ``value`` broadcasts along leading axes only
    (Unsqueeze before its last axes, Expand), so element ``[..., i, j]`` is its ``[i, j]``."""
    base: ir.Value | None = value
    chain: list[ir.Node] = []
    for _ in range(_WALK):
        producer = base.producer() if base is not None else None
        if producer is None:
            return None
        if producer.op_type == "Where":
            break
        if producer.op_type not in ("Unsqueeze", "Expand", "Identity"):
            return None
        chain.append(producer)
        base = producer.inputs[0]
    else:
        return None
    rank = len(base.shape) if base is not None and base.shape is not None else None
    if rank is None:
        return None
    for node in chain:
        if node.op_type == "Unsqueeze":
            axes, out_rank = axes_of(node), len(node.outputs[0].shape or [])
            if axes is None or any(a % out_rank >= out_rank - rank for a in axes):
                return None
    return base


def _identity_grid(indices: ir.Value | None, dims: list[Dim]) -> bool:
    """Whether ``indices[..., k]`` is the index along axis ``k`` of a ``dims`` tensor."""
    parts = grid_parts(indices, dims)
    return parts is not None and all(_grid_part(p, k, dims) for k, p in enumerate(parts))


def _grid_part(part: ir.Value | None, axis: int, dims: list[Dim]) -> bool:
    """``part`` is a grid component (``grid_component``) of a view of ``Range(0,
    dims[axis])``."""
    values = grid_component(part, axis, dims)
    return values is not None and _range_start(values) == 0


def _range_start(value: ir.Value | None) -> Dim:
    """The start of the ``Range(start, _, 1)`` that ``value`` is a view of (order kept:
    Reshape, Unsqueeze, Cast), or None."""
    for _ in range(_WALK):
        producer = value.producer() if value is not None else None
        if producer is None:
            return None
        if producer.op_type == "Range":
            if scalar(producer.inputs[2]) != 1:
                return None
            start = scalar(producer.inputs[0])
            return start if start is not None else _dim_name(producer.inputs[0])
        if producer.op_type not in _VIEWS:
            return None
        value = producer.inputs[0]
    return None


def _dim_name(value: ir.Value | None) -> Dim:
    """``"size"`` when ``value`` is a size read from a shape (never negative), else None."""
    for _ in range(_WALK):
        producer = value.producer() if value is not None else None
        if producer is None:
            return None
        if producer.op_type == "Shape":
            return "size"
        if producer.op_type not in ("Gather", "Cast", "Squeeze", "Unsqueeze", "Reshape"):
            return None
        value = producer.inputs[0]
    return None


def _nonnegative(start: Dim) -> bool:
    return start == "size" or (isinstance(start, int) and start >= 0)


def _filled_constant(value: ir.Value | None) -> ir.Value | None:
    """The fill of ``ConstantOfShape`` (or a constant tensor) that is one finite value at
    most -1e30, as a scalar constant; else None."""
    producer = value.producer() if value is not None else None
    if producer is not None and producer.op_type == "ConstantOfShape":
        tensor = producer.attributes.get("value")
        array = tensor.value.numpy() if tensor is not None else None
    else:
        array = constant_array(value) if value is not None else None
    if array is None or array.dtype != np.float32 or array.size == 0:
        return None
    first = float(array.reshape(-1)[0])
    if not np.all(array == first) or not np.isfinite(first) or first > _FILL:
        return None
    filled = ir.Value(name=None, const_value=ir.tensor(np.array(first, np.float32)))
    filled.dtype, filled.shape = ir.DataType.FLOAT, ir.Shape([])
    return filled


def _constant(value: ir.Value | None) -> float | None:
    array = constant_array(value) if value is not None else None
    if array is None or array.size != 1:
        return None
    return float(array.reshape(-1)[0])


def _broadcast(a: list[Dim] | None, b: list[Dim] | None) -> list[Dim] | None:
    """Numpy's broadcast of two known shapes, or None where it cannot be told."""
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    a, b = [1] * (rank - len(a)) + a, [1] * (rank - len(b)) + b
    out: list[Dim] = []
    for x, y in zip(a, b, strict=True):
        if x is None or y is None or (x != y and 1 not in (x, y)):
            return None
        out.append(y if x == 1 else x)
    return out


def _float(number: float, fresh_name: Callable[[str], str]) -> ir.Value:
    value = ir.Value(name=fresh_name("fill_zero"), const_value=ir.tensor(np.float32(number)))
    value.dtype, value.shape = ir.DataType.FLOAT, ir.Shape([])
    return value


def _typed_like(value: ir.Value, like: ir.Value, name: str) -> None:
    value.name, value.dtype, value.shape = name, like.dtype, like.shape


def _feeds_softmax(value: ir.Value) -> bool:
    """Whether some Softmax reads ``value`` through the ops a mask passes."""
    pending, seen = [(value, 0)], set()
    while pending:
        current, depth = pending.pop()
        for use in current.uses():
            reader = use.node
            if reader.op_type == "Softmax":
                return True
            passes = reader.op_type in _TO_SOFTMAX or appends_sink_column(reader, current)
            if depth < _WALK and passes and id(reader) not in seen:
                seen.add(id(reader))
                pending.append((reader.outputs[0], depth + 1))
    return False
