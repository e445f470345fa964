"""Rule ``copied_dims``: a Reshape target computed from shapes, whose computed entries
copy the input's own dimensions, becomes a constant with ``0`` there ("copy").

Exporters write a head split ``x.view(batch, seq, heads, head_dim)`` as a target
gathered and concatenated from ``Shape`` reads at run time (``Concat(Unsqueeze(Gather(
Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [-1], [32])``: 6 to 8 nodes per Reshape,
in every layer), which constant folding keeps since batch and sequence are symbolic.
Where each computed entry is proven the input's size at the same index
(``fusion_core.sizes``, never the symbol an inference put on the input: onnxruntime's
symbolic inference merges symbols it cannot compare, so a padded length can read
``sequence``) and the Reshape copies zeros (``allowzero = 0``), the constant target
with ``0`` at those entries reshapes the same data the same way; the shape arithmetic
then has no reader left and goes. A decode step of a small decoder runs a launch per
node, so this is time.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import SizeProof, dim_entries

__all__ = ["copy_reshape_dims"]


def copy_reshape_dims(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Make every such target a constant; how many."""
    del mark  # the new target is a constant, not a node
    done, proof = 0, SizeProof()
    for node in list(graph):
        target = _constant_target(node, proof)
        if target is None:
            continue
        node.replace_input_with(1, int64s(graph, fresh_name, target))
        done += 1
    return done


def _constant_target(node: ir.Node, proof: SizeProof) -> list[int] | None:
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return None
    source, target = node.inputs
    if (
        target is None
        or constant_array(target) is not None
        or attribute_value(node, "allowzero", 0)
    ):
        return None
    found, sizes = dim_entries(target), proof.entries(target)
    if found is None or not found or sizes is None or len(sizes) != len(found):
        return None
    made = []
    for i, entry in enumerate(found):
        if isinstance(entry, int):
            if entry == 0:
                return None  # already a copy: nothing to gain, and keeps the rule idempotent
            made.append(entry)
        elif isinstance(entry, str) and sizes[i] is not None and sizes[i] == proof.size(source, i):
            made.append(0)  # proven the input's own size there
        else:
            return None
    if made.count(-1) > 1:
        return None
    return made
