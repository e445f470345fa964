"""PhiMoE's sparsemixer router, and why com.microsoft.MoE does not compute it on CPU.

transformers' ``sparsemixer`` (``models/phimoe/modeling_phimoe.py``, inference: no
jitter, no sampling) picks two experts in two rounds, for scores ``s = x @ W_r``::

    e1 = argmax(s);  m1 = s[e1]
    w1 = softmax(where((m1 - s) / max(|s|, m1) > 2 eps, -inf, s))[e1]
    s' = s with s'[e1] = -inf;  e2 = argmax(s');  m2 = s'[e2]
    w2 = softmax(where((m2 - s) / max(|s|, m2) > 2 eps, -inf, s'))[e2]

so each weight is a softmax over only the experts within ``2 eps`` (relative) of that
round's maximum: about 1 when no other expert is that close, and w1 + w2 up to 2.
onnxruntime 1.32's CPU ``MoE`` accepts ``use_sparse_mixer = 1`` (k must be 2) but routes
exactly as without it, probed with identity experts that write each routing weight into
a column of their own: the softmax over all experts, its top 2, renormalized or not, so
the two weights sum to at most 1. (The CUDA kernel's ``sparse_mixer_top2`` implements
the masking; no CPU kernel does.) The pattern ``moe_sparse_mixer`` binds the masked
Softmax and the ArgMax whose choice it gathers; this module names the difference.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.mixture_of_experts._block import router_input

__all__ = ["sparse_mixer_reason"]


def _scores(argmax: ir.Node) -> ir.Value | None:
    """The router's scores the ArgMax reads: directly (first round) or with the first
    choice scattered to -inf (second round)."""
    value = argmax.inputs[0] if argmax.inputs else None
    node = value.producer() if value is not None else None
    if node is not None and node.op_type == "ScatterElements" and node.inputs:
        return node.inputs[0]
    return value


def _threshold(softmax: ir.Node) -> float | None:
    """2 eps: the constant the relative gap is compared with (a Greater) in the mask
    before the Softmax, however the mask is spelled (a Where of the scores, or the
    canonical form's Where of a Not added to them), a few steps back."""
    todo, seen = [(softmax, 0)], set()
    while todo:
        node, depth = todo.pop()
        if node is None or id(node) in seen or depth > 4:
            continue
        seen.add(id(node))
        if node.op_type == "Greater" and len(node.inputs) == 2:
            array = constant_array(node.inputs[1])
            if array is not None and array.size == 1:
                return float(array.reshape(-1)[0])
        if node.op_type in ("Softmax", "Add", "Where", "Cast", "Not"):
            todo += [(v.producer(), depth + 1) for v in node.inputs if v is not None]
    return None


def sparse_mixer_reason(argmax: ir.Node, softmax: ir.Node) -> str:
    """Why a sparsemixer router and its experts stay as they are (or, when the ArgMax
    does not read a router's scores, why this is not one)."""
    scores = _scores(argmax)
    if scores is None:
        return f"ArgMax {argmax.name!r} reads nothing"
    found = router_input(scores)
    if isinstance(found, str):
        return found
    threshold = _threshold(softmax)
    if threshold is None:
        return (
            f"not a sparsemixer router: Softmax {softmax.name!r} is not of scores masked "
            "where their gap to the maximum is greater than a constant"
        )
    return (
        "sparsemixer router (PhiMoE: ArgMax picks, no TopK): onnxruntime 1.32's CPU MoE "
        "accepts use_sparse_mixer=1 but routes as without it (softmax over all experts, "
        "top 2: the two weights sum to at most 1), while sparsemixer weights each chosen "
        f"expert by a softmax over only the experts within {threshold:g} (relative) of "
        "that round's maximum, the first choice masked out of the second (each weight "
        "near 1)"
    )
