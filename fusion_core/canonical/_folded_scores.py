"""The steps ``heads_in_batch`` moves from the folded scores to the unfolded ones: scalar
scales and folded biases between a batched MatMul (``[B * N, S, L]``) and its unfold.

BLOOM writes ``baddbmm(alibi, Q, K^T, alpha=1 / sqrt(H))`` on the folded heads, ALiBi
``[B * N, 1, L]``; WavLM (F.multi_head_attention_forward with ``need_weights=True``)
adds its gated relative position bias ``[B * N, S, L]``. A scale by a scalar constant is
the same after the unfold, and since a Reshape only renumbers elements, ``split(s + c) =
split(s) + unfold(c)`` for any ``c: [B * N or 1, s, l]`` (``s, l`` broadcasting to ``S,
L``, in either form alike) unfolded by the same rule, ``Reshape(Unsqueeze(c, 1), [-1, N,
0, 0])`` (opset 13 on, where Unsqueeze takes its axes as an input): exact.

The bias's rows must be one row for all (a 1 the graph proves) or as many as the scores'
(``B * N``, ``proven_same``: the graph's sizes first, labels only where they cannot
tell): a leading size merely labelled the scores' may be 1 at run time, where the Add
broadcasts and an unfold to N heads would not. Its trailing
sizes may be any: the unfold keeps them, so the Add broadcasts them as before (BLOOM's
decode step reads ALiBi's key length from the mask, a symbol other than the scores'
``past + seq``).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.canonical._identity import all_zero
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import ONE, SizeProof, known_dims, proven_same

__all__ = ["Step", "scaled_scores", "unfolded_bias"]

_ONNX = ("", "ai.onnx")
_UNSQUEEZE_AXES_INPUT = 13  # opset from which Unsqueeze reads its axes as an input
_MAX_STEPS = 4

Step = tuple[ir.Node, ir.Value]  # a scale or an Add, its operand other than the scores


def scaled_scores(
    graph: ir.Graph, value: ir.Value, shape_reads: set[int], proof: SizeProof
) -> tuple[ir.Node, list[Step]] | None:
    """(the MatMul, the steps from it to ``value`` outermost first) where ``value`` is a
    batched MatMul, scaled by scalar constants and with folded biases added, each read
    once (``value`` also by the nodes of ``shape_reads``); None otherwise."""
    steps: list[Step] = []
    node = value.producer()
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))

    def read_once(value: ir.Value) -> bool:
        readers = [u.node for u in value.uses() if id(u.node) not in shape_reads]
        return len(readers) == 1 and not value.is_graph_output()

    while node is not None and node.op_type in ("Mul", "Div", "Add") and len(steps) < _MAX_STEPS:
        if node.domain not in _ONNX or not read_once(value):
            return None
        step = _step(node, opset, proof)
        if step is None:
            return None
        steps.append((node, step[1]))
        value = step[0]
        node = value.producer()
    if node is None or node.op_type != "MatMul" or node.domain not in _ONNX:
        return None
    if not read_once(value) or (steps and shape_reads):  # shape reads of the top value only
        return None
    return node, steps


def _step(node: ir.Node, opset: int, proof: SizeProof) -> tuple[ir.Value, ir.Value] | None:
    """(the scores operand, the other) of a scale by a scalar constant or an Add of a
    ``[B * N or 1, s, l]`` bias to ``[B * N, S, L]`` scores; None otherwise."""
    out = known_dims(node.outputs[0])
    if out is None or len(out) != 3:
        return None
    orders = [(0, 1)] if node.op_type == "Div" else [(0, 1), (1, 0)]
    for mine, other in orders:
        scores, operand = node.inputs[mine], node.inputs[other]
        if scores is None or operand is None or known_dims(scores) != out:
            continue
        if node.op_type != "Add":
            if _scalar(operand):
                return scores, operand
        elif all_zero(operand):
            continue  # an Add of zeros: identity_zero_add's to take out, not a bias
        elif opset >= _UNSQUEEZE_AXES_INPUT and _foldable(operand, scores, proof):
            return scores, operand
    return None


def _foldable(bias: ir.Value, scores: ir.Value, proof: SizeProof) -> bool:
    """The bias is rank 3 and its rows are proven one row for every batch and head (a
    size the graph reads as 1), or the scores' rows (``proven_same``: the graph's proof,
    the labels only where it cannot tell; a bias of its own input size ``R`` labelled the
    scores' ``B * N`` is proven other)."""
    dims = known_dims(bias)
    if dims is None or len(dims) != 3:
        return False
    return proof.size(bias, 0) == ONE or proven_same(proof, ((bias, 0), (scores, 0)))


def _scalar(value: ir.Value | None) -> bool:
    array = constant_array(value)
    return array is not None and array.size == 1


def unfolded_bias(
    graph: ir.Graph, bias: ir.Value, want: list, fresh_name: Callable[[str], str], proof
) -> list[ir.Node]:
    """``bias: [B * N or 1, s, l]`` as ``[B or 1, N or 1, s, l]``, folded as the scores
    (``want``: their ``[B, N, S, L]``, ``N`` a number)."""
    unsqueeze = ir.Node("", "Unsqueeze", [bias, int64s(graph, fresh_name, [1])])
    unsqueeze.outputs[0].shape = ir.Shape([bias.shape[0], 1, *bias.shape[1:]])  # type: ignore[index]
    if proof.size(bias, 0) == ONE:  # the same for every batch and head: a leading 1 more
        return [unsqueeze]
    target = int64s(graph, fresh_name, [-1, want[1], 0, 0])
    reshape = ir.Node("", "Reshape", [unsqueeze.outputs[0], target])
    reshape.outputs[0].shape = ir.Shape([want[0], want[1], *bias.shape[1:]])  # type: ignore[index]
    return [unsqueeze, reshape]
