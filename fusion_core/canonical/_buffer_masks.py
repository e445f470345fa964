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
``[1, 1, S, L]`` is what the attention rewriters take. A later layer's slice may end at
that key length, ``P + Max(0, -P + Min(N, L))`` (GPT-Neo's local layers): as the end of
a Slice over the buffer's ``N`` rows it is ``L``'s, ``L`` where ``L <= N`` and, beyond,
at least ``N``, clamped to ``N`` as ``L`` is (``_clamped_end``).

What no fusion took is put back (``undo_buffer_masks``): where every reader of the
computed mask is still the ``Where`` of scores a Softmax reads, the two Slices come back
with their own inputs, names and shapes (a constant no longer in the graph is made an
initializer of the value it had), and once no computed mask is left, every size label
the rule rewrote gets its old spelling. The record lives in the nodes' and values'
in-memory ``meta``: the undo runs on the same graph, in the same run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import array_initializer, drop_unread, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import Dim, dim_entries, known_dims

__all__ = ["RULE", "buffer_masks", "undo_buffer_masks"]

RULE = "buffer_mask"
_ONNX = ("", "ai.onnx")
_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Cast"})
_DEPTH = 8
_WAS = "autofusion.canonical.buffer_mask.was"  # on the computed mask's node: the Slices
_LABELS = "autofusion.canonical.buffer_mask.shape"  # on a relabeled value: its old shape


@dataclass(frozen=True)
class _Slice:
    """One Slice as the rule found it: enough to write it again."""

    name: str | None
    inputs: tuple[ir.Value | None, ...]
    constants: tuple[np.ndarray | None, ...]  # each input's value where constant
    out_name: str | None
    out_shape: ir.Shape | None
    out_dtype: ir.DataType | None

    @classmethod
    def of(cls, node: ir.Node) -> _Slice:
        out = node.outputs[0]
        constants = tuple(constant_array(v) if v is not None else None for v in node.inputs)
        return cls(node.name, tuple(node.inputs), constants, out.name, out.shape, out.dtype)


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
        n = rows.inputs[0].shape[-1]  # type: ignore[union-attr,index]
        sizes = _mask_sizes(node.outputs[0], start, end, n)
        if sizes is None:
            continue
        new = _computed(start, end, window, rank, fresh_name)
        for made in new:
            made.name = fresh_name(f"{RULE}_{made.op_type}")
            made.outputs[0].name = fresh_name(f"{RULE}_{made.op_type.lower()}")
        for made in new:  # each comparison and their And: the mask's shape
            if made.op_type in ("LessOrEqual", "Greater", "And"):
                made.outputs[0].dtype = ir.DataType.BOOL
                made.outputs[0].shape = ir.Shape([1] * (rank - 2) + list(sizes))
        new[-1].meta[_WAS] = (_Slice.of(rows), _Slice.of(node))
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
            value.meta.setdefault(_LABELS, value.shape)  # the first spelling, for the undo
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


def _mask_sizes(mask: ir.Value, start: ir.Value, end: ir.Value, n: int) -> tuple[Dim, Dim] | None:
    """(S, L) of the scores every reader of ``mask`` fills, where ``end`` adds up to L
    (or clamps like it over the buffer's ``n`` entries: ``_clamped_end``) and ``end -
    start`` to S (as the dimensions' names say), else None."""
    start_terms = _terms(start)
    end_terms = _terms(end) or _clamped_end(end, start_terms, n)
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


def _clamped_end(end: ir.Value, start: Counter | None, n: int) -> Counter | None:
    """The terms of ``T`` where ``end = P + Max(0, Min(n, T) - P)``, ``P`` the slice's
    start (``start``: its terms) and ``T`` a sum that holds them (``T >= P``), as
    torch.export writes GPT-Neo's local layers' key length; else None. As the end of a
    Slice over ``n`` entries it is ``T``'s: both are ``T`` where ``T <= n``, and beyond
    it ``P + Max(0, n - P) >= n`` clamps to ``n`` as ``T`` does."""
    if start is None:
        return None
    for p, clamped in _either_order(_operands(end, "Add")):
        for zero, diff in _either_order(_operands(clamped, "Max")):
            if _terms(p) != start or _number(zero) != 0:
                continue
            minus_p, low = _difference(diff)
            for bound, t in _either_order(_operands(low, "Min")):
                total = _terms(t)
                if _terms(minus_p) == start and _number(bound) == n and total is not None:
                    return total if not start - total else None
    return None


def _either_order(pair: tuple[ir.Value, ir.Value] | None) -> list[tuple[ir.Value, ir.Value]]:
    return [] if pair is None else [pair, (pair[1], pair[0])]


def _operands(value: ir.Value | None, op: str) -> tuple[ir.Value, ir.Value] | None:
    """The two inputs of ``value``'s producer ``op`` (through views), or None."""
    for _ in range(_DEPTH):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain not in _ONNX:
            return None
        if producer.op_type == op and len(producer.inputs) == 2 and None not in producer.inputs:
            return producer.inputs[0], producer.inputs[1]  # type: ignore[return-value]
        if producer.op_type not in _VIEWS:
            return None
        value = producer.inputs[0]
    return None


def _difference(value: ir.Value | None) -> tuple[ir.Value | None, ir.Value | None]:
    """(b, a) of ``a - b``, spelled ``Sub(a, b)`` or ``Add(a, Mul(-1, b))`` (either
    order), or (None, None)."""
    subtracted = _operands(value, "Sub")
    if subtracted is not None:
        return subtracted[1], subtracted[0]
    for a, scaled in _either_order(_operands(value, "Add")):
        for minus_one, b in _either_order(_operands(scaled, "Mul")):
            if _number(minus_one) == -1:
                return b, a
    return None, None


def _number(value: ir.Value | None) -> float | None:
    """The one number a constant holds, else None."""
    array = constant_array(value) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


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


def undo_buffer_masks(graph: ir.Graph, mark: str) -> int:
    """Put back the buffer's two Slices wherever no fusion took the computed mask (each
    reader still the ``Where`` of scores a Softmax reads), and, once no computed mask is
    left, the size labels the rule rewrote; how many masks."""
    undone = 0
    masks = [n for n in graph if n.metadata_props.get(mark) == RULE and _WAS in n.meta]
    for mask in masks:
        out = mask.outputs[0]
        readers = out.uses()
        if out.is_graph_output() or not readers or not all(_fills_scores(u) for u in readers):
            continue
        rows, cols = mask.meta[_WAS]
        inputs, later = _inputs_back(graph, rows, 0), _inputs_back(graph, cols, 1)
        if inputs is None or later is None:
            continue  # the start or end P, L is gone: the computed mask stays
        first = _written(rows, inputs)
        again = _written(cols, [first.outputs[0], *later])
        graph.insert_before(mask, [first, again])
        out.replace_all_uses_with(again.outputs[0])
        drop_unread(graph, [mask])  # the computed nodes; P and L stay, the Slices read them
        undone += 1
    _drop_unread_constants(graph)
    if undone == len(masks) and masks:  # no computed mask left: the labels are the graph's own
        for value in _values(graph):
            if _LABELS in value.meta:
                value.shape = value.meta.pop(_LABELS)
    return undone


def _fills_scores(use: ir.Usage) -> bool:
    """Whether ``use`` is still what the rule read: the condition of a Where into a Softmax."""
    where = use.node
    return (
        where.op_type == "Where"
        and where.domain in _ONNX
        and use.idx == 0
        and reads_into_softmax(where.outputs[0])
    )


def _inputs_back(graph: ir.Graph, was: _Slice, skip: int) -> list[ir.Value | None] | None:
    """The inputs of ``was`` after the first ``skip``, each as the graph has it now;
    None where one the Slice had is gone for good."""
    back = []
    for value, constant in zip(was.inputs[skip:], was.constants[skip:], strict=True):
        again = _available(graph, value, constant)
        if again is None and value is not None:
            return None
        back.append(again)
    return back


def _available(graph: ir.Graph, value: ir.Value | None, constant: np.ndarray | None):
    """``value`` where the graph still has it; else, for a constant, a new initializer of
    its name (a suffix where taken) and value; else None."""
    if value is None:
        return None
    producer = value.producer()
    if (
        value.is_graph_input()
        or (producer is not None and producer.graph is graph)
        or graph.initializers.get(value.name or "") is value
    ):
        return value
    if constant is None:
        return None
    return array_initializer(graph, value.name or f"{RULE}_const", constant)


def _written(was: _Slice, inputs: list[ir.Value | None]) -> ir.Node:
    """The Slice ``was`` describes, over ``inputs`` (trailing empty ones left off)."""
    while inputs and inputs[-1] is None:
        inputs.pop()
    node = ir.Node("", "Slice", inputs, name=was.name)
    out = node.outputs[0]
    out.name, out.shape, out.dtype = was.out_name, was.out_shape, was.out_dtype
    return node


def _drop_unread_constants(graph: ir.Graph) -> None:
    """Remove the initializers ``_computed`` made that nothing reads any more."""
    for name, value in list(graph.initializers.items()):
        if name.startswith(f"{RULE}_const") and not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
