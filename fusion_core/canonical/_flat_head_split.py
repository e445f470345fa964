"""Rule ``flat_head_split``: heads split straight from flattened rows are split from
the rows laid out as ``[B, S, C]`` first.

LeViT runs its Linear + BatchNorm1d on ``[B * S, C]`` rows and views them back as
``[B, S, C]`` before the head view; dynamo's optimizer merges the two Reshapes into one
from the rank-2 value (``Reshape(x, [-1, S, N, P])``, then a Split of each head's
``[kd, kd, vd]``), and the attention patterns find a query of rank 2. So::

    Reshape(x, [-1, S, N, P])  ->  Reshape(Reshape(x, [-1, S, C]), [-1, S, N, P])

for ``x`` of rank 2 with its last size ``C = N * P`` known and a target of rank 4 whose
entries ``fusion_core.sizes`` proves (``proof.entries``): ``N`` and ``P`` numbers, ``S``
and the first entry sizes that are never 0 (a 0 copies a size of ``x``, which the new
input would change) or ``-1`` first. The target is a constant, or computed from shapes as
dynamic-shape exports write it (``Concat(Gather(Shape(x0), 0), Gather(Shape(x0), 1), [N],
[P])``): then the rows' target is computed from it, ``Concat(Slice(target, 0, 2), [C])``
(``[B, S, C]``). A Reshape keeps the row-major order of the elements, so the two Reshapes
give the same tensor as the one: exact, and ``-1`` resolves to the same ``B`` (``B * S *
C`` elements either way). A head count only a label gives (a symbol, a dimension of an
input) is no head split here: the rule leaves it.

``undo_flat_head_splits`` takes the inner Reshape out again where only Reshapes read it
(no fusion took the ``[B, S, C]`` rows): each reads ``x`` again, as the exporter wrote.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.canonical._fixed_sizes import fixed_size
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import Size, SizeProof

__all__ = ["RULE", "flat_head_splits", "undo_flat_head_splits"]

RULE = "flat_head_split"
TARGET = f"{RULE}:target"  # the mark of the nodes that compute the rows' target
_ONNX = ("", "ai.onnx")
_MINUS_ONE = Size((), -1)


def flat_head_splits(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Read every head split of rank-2 rows through ``[B, S, C]`` rows; how many."""
    done, proof = 0, SizeProof()  # one walk: the targets of every layer read the same sizes
    for node in list(graph):
        found = _head_target(node, proof)
        if found is None:
            continue
        entries, channels = found
        source = node.inputs[0]
        made = _rows_target(graph, node, entries, channels, fresh_name, mark)
        inner = ir.Node("", "Reshape", [source, made], name=fresh_name(f"{RULE}_Reshape"))
        out = inner.outputs[0]
        out.name = fresh_name(f"{RULE}_rows")
        out.dtype = source.dtype  # type: ignore[union-attr]
        split = node.outputs[0].shape
        out.shape = ir.Shape(
            [None, None, channels] if split is None else [split[0], split[1], channels]
        )
        inner.metadata_props[mark] = RULE
        graph.insert_before(node, [inner])
        node.replace_input_with(0, out)
        done += 1
    return done


def _rows_target(
    graph: ir.Graph,
    node: ir.Node,
    entries: list[Size],
    channels: int,
    fresh_name: Callable[[str], str],
    mark: str,
) -> ir.Value:
    """``[-1, S, C]`` as a constant where ``S`` is a number; else ``[B, S, C]`` computed
    from the head split's target (its first two entries, then ``C``)."""
    sequence = entries[1].value
    if sequence is not None:
        return int64s(graph, fresh_name, [-1, sequence, channels])
    lead = ir.Node(
        "",
        "Slice",
        [node.inputs[1], int64s(graph, fresh_name, [0]), int64s(graph, fresh_name, [2])],
        name=fresh_name(f"{RULE}_Slice"),
    )
    joined = ir.Node(
        "",
        "Concat",
        [lead.outputs[0], int64s(graph, fresh_name, [channels])],
        [ir.AttrInt64("axis", 0)],
        name=fresh_name(f"{RULE}_Concat"),
    )
    for new, length in ((lead, 2), (joined, 3)):
        new.outputs[0].name = fresh_name(f"{RULE}_target")
        new.outputs[0].dtype, new.outputs[0].shape = ir.DataType.INT64, ir.Shape([length])
        new.metadata_props[mark] = TARGET
    graph.insert_before(node, [lead, joined])
    return joined.outputs[0]


def _head_target(node: ir.Node, proof: SizeProof) -> tuple[list[Size], int] | None:
    """The target's entries ``[B or -1, S, N, P]`` and ``C`` where ``node`` splits the
    heads of rank-2 rows ``[B * S, C]`` as the docstring says, else None."""
    if node.op_type != "Reshape" or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    source, target = node.inputs
    if source is None or source.shape is None or len(source.shape) != 2:
        return None
    allowzero = node.attributes.get("allowzero")
    if allowzero is not None and allowzero.value:
        return None
    channels, entries = fixed_size(proof, source, 1), proof.entries(target)
    if channels is None or entries is None or len(entries) != 4 or None in entries:
        return None
    first, sequence, heads, size = entries  # type: ignore[misc]
    if not (first == _MINUS_ONE or _never_zero(first)) or not _never_zero(sequence):
        return None
    if heads.value is None or size.value is None:
        return None  # a head count or size the graph does not prove: no head split here
    if heads.value <= 1 or size.value <= 0 or heads.value * size.value != channels:
        return None
    return entries, channels  # type: ignore[return-value]


def _never_zero(size: Size) -> bool:
    """A proven size that is never 0 nor -1: a positive number, or sizes plus a number
    that is not negative (as ``fusion_core.sizes`` reads a Reshape target's entry)."""
    if size.capped:
        return False
    return size.constant > 0 or (bool(size.atoms) and size.constant >= 0)


def undo_flat_head_splits(graph: ir.Graph, mark: str) -> int:
    """Take out every ``[B, S, C]`` Reshape this rule put in that only Reshapes read
    (with the nodes that computed its target); how many. A reader whose target copies
    the rows' ``B`` and ``S`` (``copied_dims`` writes ``[0, 0, N, P]`` once the rows are
    rank 3) reads the head split's computed target again, which gives the same sizes."""
    undone, proof = 0, SizeProof()
    for inner in [n for n in graph if n.metadata_props.get(mark) == RULE]:
        out, original = inner.outputs[0], _original_target(inner, mark)
        readers = [use.node for use in out.uses()]
        if out.is_graph_output() or not readers:
            continue
        again = [r for r in readers if not _plain_reshape(r, proof)]
        if original is None and again:
            continue  # a fusion reads the rows
        if not all(_same_target(r, original, out, proof) for r in again):  # type: ignore[arg-type]
            continue
        for reader in again:
            reader.replace_input_with(1, original)
        out.replace_all_uses_with(inner.inputs[0])
        made = inner.inputs[1].producer() if inner.inputs[1] is not None else None
        graph.remove(inner, safe=True)
        while made is not None and made.metadata_props.get(mark) == TARGET:
            if made.outputs[0].uses():
                break
            above = made.inputs[0].producer() if made.inputs[0] is not None else None
            graph.remove(made, safe=True)
            made = above
        undone += 1
    return undone


def _original_target(inner: ir.Node, mark: str) -> ir.Value | None:
    """The head split's target the rows' target was computed from (``_rows_target``:
    ``Concat(Slice(target, 0, 2), [C])``); None where it is a constant."""
    joined = inner.inputs[1].producer() if inner.inputs[1] is not None else None
    if joined is None or joined.metadata_props.get(mark) != TARGET:
        return None
    lead = joined.inputs[0].producer() if joined.inputs[0] is not None else None
    return lead.inputs[0] if lead is not None else None


def _same_target(node: ir.Node, original: ir.Value, rows: ir.Value, proof: SizeProof) -> bool:
    """Whether the Reshape ``node`` of ``rows`` reshapes them to ``original``'s entries:
    each entry proven the same, a 0 that copies proven the rows' size there."""
    if node.op_type != "Reshape" or node.domain not in _ONNX or len(node.inputs) != 2:
        return False
    allowzero = node.attributes.get("allowzero")
    if allowzero is not None and allowzero.value:
        return False
    mine, theirs = proof.entries(node.inputs[1]), proof.entries(original)
    if mine is None or theirs is None or len(mine) != len(theirs):
        return False
    copied = [proof.size(rows, i) if e == Size((), 0) else e for i, e in enumerate(mine)]
    return all(a is not None and a == b for a, b in zip(copied, theirs, strict=True))


def _plain_reshape(node: ir.Node, proof: SizeProof) -> bool:
    """A Reshape to a target that copies no size of its input (no 0: a constant, or
    entries proven -1 or never 0): it gives the same tensor from any input of the same
    elements."""
    if node.op_type != "Reshape" or node.domain not in _ONNX or len(node.inputs) != 2:
        return False
    array = constant_array(node.inputs[1])
    if array is not None:
        return not np.any(array == 0)
    entries = proof.entries(node.inputs[1])
    return entries is not None and all(
        e is not None and (e == _MINUS_ONE or _never_zero(e)) for e in entries
    )
