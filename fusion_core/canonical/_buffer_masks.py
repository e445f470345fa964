"""Rule ``buffer_mask``: a causal mask sliced out of a constant buffer (GPT-2's and
GPT-Neo's ``bias[:, :, L - S : L, :L]``, ``bias`` the ``tril`` of ``[N, N]`` ones, or
GPT-Neo's local layers' band ``tril(ones) xor tril(ones, -W)``) is computed instead:
``key <= query`` (``And key > query - W`` for the band) with ``key = Range(0, L)`` on
the key axis and ``query = Range(P, L)`` on the query axis, the spelling the causal and
window proofs read, of shape ``[1, 1, S, L]``.

Why it is exact: ``bias[i, j]`` is ``j <= i`` (and ``j > i - W``). Where ``L <= N`` the
slice picks rows ``P .. L - 1`` and columns ``0 .. L - 1`` of it, so element ``(s, j)``
is ``bias[P + s, j]``, the computed mask's element. Where ``L > N`` the slice is clamped
to ``N`` columns, and the rule applies only where each reader is a ``Where`` of the
scores, whose key axis is ``L`` (read off the shapes: the slice's end is the sum of the
dimensions the scores' key axis adds up): ``N`` columns (``N >= 2``) against ``L > N``
do not broadcast, so the original graph fails there and no input it runs on changes.
The shapes ``torch.export`` writes for the slice (``[.., Max(0, -P + Min(N, P + S)),
Min(N, P + S)]``) equal ``[S, L]`` only while ``P + S <= N``; the computed mask's
``[1, 1, S, L]`` is what the attention rewriters take.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.canonical._shape_values import Dim, dim_entries, known_dims
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "buffer_masks"]

RULE = "buffer_mask"
_ONNX = ("", "ai.onnx")
_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Cast"})
_DEPTH = 8


def buffer_masks(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Compute each causal (or banded) mask sliced from a constant buffer; how many."""
    if graph.opset_imports.get("", 0) < 13:  # Unsqueeze's axes as an input
        return 0
    done = 0
    for node in list(graph):
        found = _buffer_slice(node)
        if found is None:
            continue
        rows, start, end, window, rank = found
        sizes = _mask_sizes(node.outputs[0], start, end)
        if sizes is None:
            continue
        n = rows.inputs[0].shape[-1]  # type: ignore[union-attr,index]
        new = _computed(start, end, window, rank, fresh_name)
        for made in new:
            made.name = fresh_name(f"{RULE}_{made.op_type}")
            made.outputs[0].name = fresh_name(f"{RULE}_{made.op_type.lower()}")
        new[-1].outputs[0].dtype = ir.DataType.BOOL
        new[-1].outputs[0].shape = ir.Shape([1] * (rank - 2) + list(sizes))
        replace(graph, node, new, mark, RULE)
        drop_unread(graph, [rows])
        _sizes_where_run(graph, start, sizes[0], n)
        done += 1
    return done


def _sizes_where_run(graph: ir.Graph, start: ir.Value, rows: Dim, n: Dim) -> None:
    """Write the sizes torch.export carried from the slice through the graph
    (``Max(0, -P + Min(N, P + S))`` for S, ``Min(N, P + S)`` for L) as S and P + S: the
    graph runs only where ``P + S <= N`` (see above), and there they are equal."""
    past = dim_entries(start)
    if not isinstance(rows, str) or past is None or len(past) != 1 or not isinstance(past[0], str):
        return
    total = f"{past[0]} + {rows}"
    spelled = {
        f"Max(0, -{past[0]} + Min({n}, {total}))": rows,
        f"Min({n}, {total})": total,
        f"Max(0, -{past[0]} + {total})": rows,  # the Min written first
    }
    for value in _values(graph):
        if value.shape is None or not any(isinstance(d, ir.SymbolicDim) for d in value.shape):
            continue
        dims = [
            _simpler(d.value, spelled) if isinstance(d, ir.SymbolicDim) else d for d in value.shape
        ]
        if dims != list(value.shape):
            value.shape = ir.Shape(dims)


def _simpler(dim: str | None, spelled: dict[str, str]) -> str | None:
    for _ in range(_DEPTH):
        if dim is None:
            return None
        before = dim
        for long, short in spelled.items():
            dim = dim.replace(long, short)
        if dim == before:
            break
    return dim


def _values(graph: ir.Graph):
    yield from graph.inputs
    for node in graph:
        yield from node.outputs


def _buffer_slice(node: ir.Node) -> tuple[ir.Node, ir.Value, ir.Value, int | None, int] | None:
    """(row Slice, start P, end L, window or None, rank) of ``Slice(Slice(buffer, P:L on
    the query axis), 0:L on the key axis)`` with a causal or banded constant buffer."""
    cols = _slice_parts(node)
    if cols is None or cols[2] != -1 or constant_array(cols[0]) is None:
        return None
    rows_value = node.inputs[0]
    rows = rows_value.producer() if rows_value is not None else None
    parts = _slice_parts(rows) if rows is not None else None
    if rows is None or parts is None or parts[2] != -2 or len(rows_value.uses()) != 1:  # type: ignore[union-attr]
        return None
    start, end = parts[0], parts[1]
    if np.any(constant_array(cols[0]) != 0) or not _same_size(cols[1], end):
        return None
    buffer = constant_array(rows.inputs[0])
    window = _band(buffer) if buffer is not None else False
    if window is False:
        return None
    return rows, start, end, window, buffer.ndim  # type: ignore[union-attr,return-value]


def _slice_parts(node: ir.Node) -> tuple[ir.Value, ir.Value, int] | None:
    """(start, end, axis counted from the end) of a one-axis, step-1 Slice."""
    if node.op_type != "Slice" or node.domain not in _ONNX or len(node.inputs) < 4:
        return None
    data, starts, ends, axes = node.inputs[:4]
    steps = constant_array(node.inputs[4]) if len(node.inputs) > 4 else np.array([1])
    axis = constant_array(axes)
    if data is None or data.shape is None or axis is None or axis.size != 1 or steps is None:
        return None
    if steps.size != 1 or int(steps.item()) != 1 or starts is None or ends is None:
        return None
    return starts, ends, int(axis.item()) % len(data.shape) - len(data.shape)


def _band(buffer: np.ndarray) -> int | None | bool:
    """None for a ``tril`` of ones ``[1, .., N, N]`` (``N >= 2``), ``W`` for the band
    ``j <= i and j > i - W``, False for anything else."""
    if buffer.dtype != np.bool_ or buffer.ndim < 2 or any(d != 1 for d in buffer.shape[:-2]):
        return False
    n = buffer.shape[-1]
    if n < 2 or buffer.shape[-2] != n:
        return False
    square = buffer.reshape(n, n)
    i, j = np.indices((n, n))
    if np.array_equal(square, j <= i):
        return None
    window = int(square[-1].sum())  # the last row holds the whole band
    if 1 <= window < n and np.array_equal(square, (j <= i) & (j > i - window)):
        return window
    return False


def _mask_sizes(mask: ir.Value, start: ir.Value, end: ir.Value) -> tuple[Dim, Dim] | None:
    """(S, L) of the scores every reader of ``mask`` fills, where ``end`` adds up to L
    and ``end - start`` to S (as the dimensions' names say), else None."""
    end_terms, start_terms = _terms(end), _terms(start)
    if end_terms is None or start_terms is None or not mask.uses():
        return None
    sizes: set[tuple[Dim, Dim]] = set()
    for use in mask.uses():
        where = use.node
        if where.op_type != "Where" or use.idx != 0 or not reads_into_softmax(where.outputs[0]):
            return None
        for data in where.inputs[1:]:
            dims = known_dims(data)
            if dims is not None and len(dims) >= 2 and _terms_of_dim(dims[-1]) == end_terms:
                sizes.add((dims[-2], dims[-1]))
    if len(sizes) != 1:
        return None
    rows, keys = sizes.pop()
    if _terms_of_dim(rows) != end_terms - start_terms or start_terms - end_terms:
        return None
    return rows, keys


def _terms(value: ir.Value | None, depth: int = 0) -> Counter | None:
    """The dimensions (names or numbers) a one-element size computation adds up."""
    producer = value.producer() if value is not None else None
    if depth > _DEPTH or value is None:
        return None
    if producer is not None and producer.domain in _ONNX and producer.op_type == "Add":
        parts = [_terms(v, depth + 1) for v in producer.inputs]
        return None if None in parts else parts[0] + parts[1]  # type: ignore[operator]
    if producer is not None and producer.op_type in _VIEWS and producer.domain in _ONNX:
        found = _terms(producer.inputs[0], depth + 1)
        if found is not None:
            return found
    entries = dim_entries(value)
    if entries is None or len(entries) != 1 or entries[0] is None:
        return None
    return _terms_of_dim(entries[0])


def _terms_of_dim(dim: Dim) -> Counter | None:
    """The terms of a dimension: a number, a name, or names joined by `` + `` (how
    torch.export writes a sum of sizes)."""
    if dim is None:
        return None
    if isinstance(dim, int):
        return Counter({dim: 1}) if dim else Counter()
    terms = [t.strip() for t in str(dim).split(" + ")]
    if any(not t or any(c in t for c in "-*/()") for t in terms):
        return None
    return Counter(int(t) if t.isdigit() else t for t in terms)


def _same_size(a: ir.Value | None, b: ir.Value | None) -> bool:
    if a is b:
        return True
    terms = _terms(a)
    return terms is not None and terms == _terms(b)


def _computed(
    start: ir.Value, end: ir.Value, window: int | None, rank: int, fresh_name
) -> list[ir.Node]:
    """``Range(0, L)`` on the last axis against ``Range(P, L)`` on the one before it:
    ``key <= query`` (and ``key > query - W``)."""
    zero, one = (_int64(v, fresh_name) for v in (0, 1))
    first, last = ir.Node("", "Squeeze", [start]), ir.Node("", "Squeeze", [end])
    key = ir.Node("", "Range", [zero, last.outputs[0], one])
    query = ir.Node("", "Range", [first.outputs[0], last.outputs[0], one])
    key_axes = _int64(list(range(rank - 1)), fresh_name)
    query_axes = _int64([*range(rank - 2), rank - 1], fresh_name)
    keys = ir.Node("", "Unsqueeze", [key.outputs[0], key_axes])
    queries = ir.Node("", "Unsqueeze", [query.outputs[0], query_axes])
    causal = ir.Node("", "LessOrEqual", [keys.outputs[0], queries.outputs[0]])
    nodes = [first, last, key, query, keys, queries, causal]
    if window is not None:
        lowest = ir.Node("", "Sub", [queries.outputs[0], _int64(window, fresh_name)])
        far = ir.Node("", "Greater", [keys.outputs[0], lowest.outputs[0]])
        both = ir.Node("", "And", [causal.outputs[0], far.outputs[0]])
        nodes += [lowest, far, both]
    return nodes


def _int64(values: int | list[int], fresh_name) -> ir.Value:
    array = np.array(values, np.int64)
    value = ir.Value(name=fresh_name(f"{RULE}_const"), const_value=ir.tensor(array))
    value.dtype, value.shape = ir.DataType.INT64, ir.Shape(list(array.shape))
    return value
