"""A pre-pass: drop an Expand that only broadcasts what MatMul would broadcast itself.

transformers' rotary embedding computes its angles as ``inv_freq[None, :, None]
.expand(batch, -1, 1) @ position_ids[:, None, :]``; the exporters write the expand as
an ``Expand`` to a shape computed at run time (``Shape``, ``Gather``, ``Concat``,
``Reshape`` and torch's ``-1`` handling, ``Equal`` and ``Where``): eight small nodes
that a decoder runs at every decode step. MatMul broadcasts its batch dimensions, so
``MatMul(Expand(x, s), y) = MatMul(x, y)`` whenever the Expand leaves the matrix
dimensions of ``x`` as they are and each batch dimension it makes is what the MatMul's
output has there anyway: ``x``'s dimension is 1 and ``y``'s is the output's, or
``x``'s already is the output's. That is shown from the inferred shapes (symbolic
dimensions compare by name); anything unknown keeps the Expand.
"""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["BroadcastingExpandPass"]

_Dim = int | str | None


class BroadcastingExpandPass(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type != "Expand" or node.domain not in ("", "ai.onnx"):
                continue
            source, expanded = node.inputs[0], node.outputs[0]
            uses = list(expanded.uses())
            if source is None or expanded.is_graph_output() or not uses:
                continue
            if all(_broadcasts_alike(source, use.node, use.idx) for use in uses):
                for use in uses:
                    use.node.replace_input_with(use.idx, source)
                modified = True  # the Expand is left unused: remove_unused drops it
        return ir.passes.PassResult(model, modified)


def _dims(value: ir.Value | None) -> list[_Dim] | None:
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else (d.value or None) for d in value.shape]


def _broadcasts_alike(source: ir.Value, matmul: ir.Node, index: int) -> bool:
    """``matmul`` reading ``source`` at ``index`` gives the output it gives now."""
    if matmul.op_type != "MatMul" or matmul.domain not in ("", "ai.onnx") or index > 1:
        return False
    other = matmul.inputs[1 - index]
    x, expanded = _dims(source), _dims(matmul.inputs[index])
    y, out = _dims(other), _dims(matmul.outputs[0])
    if x is None or expanded is None or y is None or out is None:
        return False
    if len(x) < 2 or len(y) < 2 or x[-2:] != expanded[-2:] or None in x[-2:]:
        return False  # a vector, or matrix dimensions the Expand changes
    batch_x, batch_y, batch_out = x[:-2], y[:-2], out[:-2]
    if len(batch_out) < max(len(batch_x), len(batch_y)):
        return False
    for k in range(1, len(batch_out) + 1):
        dim_x = batch_x[-k] if k <= len(batch_x) else 1
        dim_y = batch_y[-k] if k <= len(batch_y) else 1
        want = batch_out[-k]
        if want is None or not (dim_x == want or (dim_x == 1 and dim_y == want)):
            return False
    return True
