"""Rule ``flat_head_split``: heads split straight from flattened rows are split from
the rows laid out as ``[B, S, C]`` first.

LeViT runs its Linear + BatchNorm1d on ``[B * S, C]`` rows and views them back as
``[B, S, C]`` before the head view; dynamo's optimizer merges the two Reshapes into one
from the rank-2 value (``Reshape(x, [-1, S, N, P])``, then a Split of each head's
``[kd, kd, vd]``), and the attention patterns find a query of rank 2. So::

    Reshape(x, [-1, S, N, P])  ->  Reshape(Reshape(x, [-1, S, C]), [-1, S, N, P])

for ``x`` of rank 2 with its last size ``C = N * P`` known and a constant target of
rank 4 whose entries after the first are known sizes (no 0 that copies a size of ``x``,
which the new input would change). A Reshape keeps the row-major order of the elements,
so the two Reshapes give the same tensor as the one: exact, and ``-1`` resolves to the
same ``B`` (``B * S * C`` elements either way).

``undo_flat_head_splits`` takes the inner Reshape out again where only Reshapes read it
(no fusion took the ``[B, S, C]`` rows): each reads ``x`` again, as the exporter wrote.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "flat_head_splits", "undo_flat_head_splits"]

RULE = "flat_head_split"
_ONNX = ("", "ai.onnx")


def flat_head_splits(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Read every head split of rank-2 rows through ``[B, S, C]`` rows; how many."""
    done = 0
    for node in list(graph):
        rows = _rows_target(node)
        if rows is None:
            continue
        source = node.inputs[0]
        inner = ir.Node(
            "",
            "Reshape",
            [source, int64s(graph, fresh_name, rows)],
            name=fresh_name(f"{RULE}_Reshape"),
        )
        out = inner.outputs[0]
        out.name = fresh_name(f"{RULE}_rows")
        out.dtype = source.dtype  # type: ignore[union-attr]
        batch = node.outputs[0].shape[0] if node.outputs[0].shape is not None else None
        out.shape = ir.Shape([batch, rows[1], rows[2]])
        inner.metadata_props[mark] = RULE
        graph.insert_before(node, [inner])
        node.replace_input_with(0, out)
        done += 1
    return done


def _rows_target(node: ir.Node) -> list[int] | None:
    """``[-1, S, C]`` where ``node`` splits the heads of rank-2 rows ``[B * S, C]`` as the
    docstring says, else None."""
    if node.op_type != "Reshape" or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    source, target = node.inputs
    if source is None or source.shape is None or len(source.shape) != 2:
        return None
    channels = source.shape[1]
    array = constant_array(target)
    if not isinstance(channels, int) or array is None or array.shape != (4,):
        return None
    allowzero = node.attributes.get("allowzero")
    if allowzero is not None and allowzero.value:
        return None
    first, sequence, heads, size = (int(v) for v in array)
    if first == 0 or min(sequence, heads, size) <= 0 or heads * size != channels or heads == 1:
        return None
    return [-1, sequence, channels]


def undo_flat_head_splits(graph: ir.Graph, mark: str) -> int:
    """Take out every ``[B, S, C]`` Reshape this rule put in that only Reshapes read;
    how many."""
    undone = 0
    for inner in [n for n in graph if n.metadata_props.get(mark) == RULE]:
        out = inner.outputs[0]
        readers = [use.node for use in out.uses()]
        if out.is_graph_output() or not readers:
            continue
        if not all(_plain_reshape(r) for r in readers):
            continue  # a fusion reads the rows
        out.replace_all_uses_with(inner.inputs[0])
        graph.remove(inner, safe=True)
        undone += 1
    return undone


def _plain_reshape(node: ir.Node) -> bool:
    """A Reshape to a constant target that copies no size of its input (no 0): it gives
    the same tensor from any input of the same elements."""
    if node.op_type != "Reshape" or node.domain not in _ONNX or len(node.inputs) != 2:
        return False
    array = constant_array(node.inputs[1])
    return array is not None and not np.any(array == 0)
