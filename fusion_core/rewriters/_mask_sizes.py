"""Whether an attention mask has the shape onnxruntime's kernels take, decided from the
sizes the graph proves (``fusion_core.sizes``), never from the labels a shape inference
put on the mask and the scores: onnxruntime's symbolic inference merges symbols it
cannot compare (two sizes get one label, a false match) and labels equal sizes apart (a
false refusal). Shared by ``attention`` and ``group_query_attention`` through
``_attention_mask``.

The scores reach back through the kernels earlier rounds fused (the rotary embedding
of q and k, the norms before the projections, an earlier layer's attention):
``FusedSizeProof`` (``_fused_sizes``, shared with ``group_query_attention``) reads them.
"""

from __future__ import annotations

import re

import onnx_ir as ir

from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof
from autofusion.fusion_core.sizes import ONE, Size, is_own, known_dims

__all__ = ["attention_bias", "decided", "shown_sizes"]

_ONNX = ("", "ai.onnx")
_DEPTH = 12  # ops read through by ``_at_least`` and ``_values_of``
_KEEP_AXES = frozenset({"Identity", "Cast", "Not", "Neg", "Abs", "IsNaN", "IsInf"})
_BROADCASTS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Where", "And", "Or", "Xor", "Equal", "Less",
        "LessOrEqual", "Greater", "GreaterOrEqual", "Max", "Min", "Sum",
    }
)  # fmt: skip
_OWN_ATOM = re.compile(r"^@(.*)#[0-9a-f]+\[(\d+)\]$")  # sizes' atom of a value's own size


def attention_bias(
    add: ir.Node, scale: ir.Node, op: str = "MultiHeadAttention", *, one_query: bool = False
) -> ir.Value | str:
    """The mask added to the scores, if onnxruntime's kernel ``op`` takes it as it is
    (``one_query``: or with one row for every query, [B or 1, heads or 1, 1, L], which
    the caller expands: ``expand_queries``): its batch, heads and rows proven the
    scores' (or 1 where the kernel broadcasts them), its keys the scores' wherever the
    graph runs (``_keys_follow``). Where sizes cannot tell an axis (``decided``: a
    value an earlier fusion made without a shape, an op it does not read), the labels
    do, as before sizes could."""
    scores = scale.outputs[0]
    mask = next(v for v in add.inputs if v is not scores)
    if any(v is None or v.shape is None or len(v.shape) != 4 for v in (mask, scores)):
        return f"the mask {mask.name!r} is not known to be rank 4 like the scores"
    proof = FusedSizeProof()
    wanted = [proof.size(scores, axis) for axis in range(4)]
    have = [proof.bound(mask, axis) for axis in range(4)]
    labels, scores_labels = known_dims(mask) or [None] * 4, known_dims(scores) or [None] * 4
    # batch and heads may be 1 (the kernel broadcasts them); the query rows too where the
    # caller expands them. The leading three axes are not contracted after the Add (the
    # MatMul by the values broadcasts the first two): only a proof of equality holds there
    for axis, one in enumerate((True, True, one_query, False)):
        size, want = have[axis], wanted[axis]
        if (one and size == ONE) or (want is not None and size == want):
            continue
        if axis == 3 and _keys_follow(proof, add, mask, want):
            continue
        label, scores_label = labels[axis], scores_labels[axis]
        by_labels = (one and label == 1) or (label is not None and label == scores_label)
        if decided(size) and decided(want) or not by_labels:
            return (
                f"the mask {mask.name!r} has sizes {shown_sizes(have)} (labels {labels}); "
                f"{op} takes [B or 1, heads or 1, S, L] for scores of sizes "
                f"{shown_sizes(wanted)} (labels {scores_labels})"
            )
    return mask


def decided(size: Size | None) -> bool:
    """Whether ``size`` is proven from the graph's inputs and constants (no value's own
    size, which is all sizes can say of a value made without a shape)."""
    return size is not None and not is_own(size)


def _keys_follow(proof: FusedSizeProof, add: ir.Node, mask: ir.Value, keys: Size | None) -> bool:
    """Whether the mask has the scores' ``keys`` wherever the graph runs, without a proof
    of equality: ``_at_least`` the keys where they are 2 or more, and the values the
    Softmax of the sum multiplies proven to have the scores' keys.

    ONNX broadcasting (https://onnx.ai/onnx/repo-docs/Broadcasting.html) runs
    ``Add(scores, mask)`` only where the mask's keys are the scores' ``L`` or 1, or
    ``L`` is 1. A mask ``_at_least`` ``L`` is ``L`` wherever ``L >= 2``. Where ``L`` is
    1 the sum has the mask's keys, and its Softmax multiplies values of ``L`` keys (a
    MatMul contracts them, no broadcast): the graph runs only where the mask has 1 key
    too. So the mask has ``L`` keys wherever the graph runs, never 1 against more (which
    the kernel refuses) and never more than the scores (which would enlarge them)."""
    if keys is None or not _at_least(proof, mask, 3, keys, 0):
        return False
    values = _values_of(add)
    return values is not None and proof.size(values, -2) == keys


def _at_least(
    proof: FusedSizeProof, value: ir.Value | None, axis: int, size: Size, depth: int
) -> bool:
    """Whether ``value`` has ``size`` on ``axis`` wherever ``size >= 2`` and the graph
    runs: proven ``size``; ``size`` capped (``min(size, c)``, ``c`` 0 or at least 2: a
    constant's length cut at ``size``, ``k * floor(size / k)`` for ``k >= 2``; so not 1
    where ``size`` is not, and a broadcast against ``size`` makes it ``size``, as
    MiniMax-M3's key length ``Min(S, -2 * ((-S) Div 2))``); or a broadcast (an
    elementwise op, an Expand) of which one input has it: a broadcast runs only where
    every input is 1 or the one size other than 1."""
    found = proof.bound(value, axis)
    if found is not None and (found == size or Size(found.atoms, found.constant) == size):
        return found == size or found.capped
    node = value.producer() if value is not None else None
    if node is None or node.domain not in _ONNX or depth > _DEPTH or value.shape is None:
        return False
    rank = len(value.shape)
    if node.op_type in _KEEP_AXES:
        return _at_least(proof, node.inputs[0], axis, size, depth + 1)
    if node.op_type == "Transpose":
        perm = node.attributes.get_ints("perm", None)
        return perm is not None and _at_least(proof, node.inputs[0], perm[axis], size, depth + 1)
    operands = node.inputs[:1] if node.op_type == "Expand" else node.inputs
    if node.op_type not in _BROADCASTS and node.op_type != "Expand":
        return False
    for operand in operands:
        shape = operand.shape if operand is not None else None
        at = axis - (rank - len(shape)) if shape is not None else -1
        if at >= 0 and _at_least(proof, operand, at, size, depth + 1):
            return True
    return False


def _values_of(add: ir.Node) -> ir.Value | None:
    """The values the Softmax of ``add``'s sum multiplies (input 1 of the MatMul its
    probabilities reach through the ops that keep them: the Softmax, the SDPA NaN
    guard's Where, a Cast), or None."""
    value = add.outputs[0]
    for _ in range(_DEPTH):
        # the NaN guard Where(IsNaN(P), 0, P) reads P twice
        users = [use.node for use in value.uses() if use.node.op_type != "IsNaN"]
        node = users[0] if len(users) == 1 else None
        if node is None or node.domain not in _ONNX:
            return None
        if node.op_type == "MatMul" and node.inputs[0] is value:
            return node.inputs[1]
        if node.op_type not in ("Softmax", "Where", "Cast", "Identity"):
            return None
        value = node.outputs[0]
    return None


def shown_sizes(sizes: list[Size | None]) -> list[str]:
    """Proven sizes as text: ``batch``, ``past + seq``, ``8``; a capped one ``min(S,
    ..)``; a value's own size by the value's name; ``?`` where nothing is proven."""
    shown = []
    for size in sizes:
        if size is None:
            shown.append("?")
            continue
        terms = [_OWN_ATOM.sub(r"own size of \1[\2]", atom) for atom in size.atoms]
        if size.constant or not terms:
            terms.append(str(size.constant))
        text = " + ".join(terms)
        shown.append(f"min({text}, ..)" if size.capped else text)
    return shown
