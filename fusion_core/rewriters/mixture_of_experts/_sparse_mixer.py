"""Routers that pick by ArgMax (PhiMoE's sparsemixer): where their logits are.

transformers' ``sparsemixer`` (``models/phimoe/modeling_phimoe.py``, inference: no
jitter, no sampling) picks two experts in two rounds, for scores ``s = x @ W_r``::

    e1 = argmax(s);  m1 = s[e1]
    w1 = softmax(where((m1 - s) / max(|s|, m1) > 2 eps, -inf, s))[e1]
    s' = s with s'[e1] = -inf;  e2 = argmax(s');  m2 = s'[e2]
    w2 = softmax(where((m2 - s) / max(|s|, m2) > 2 eps, -inf, s'))[e2]

so each weight is a softmax over only the experts within ``2 eps`` (relative) of that
round's maximum: about 1 when no other expert is that close, and w1 + w2 up to 2.
onnxruntime 1.32's CPU ``MoE`` accepts ``use_sparse_mixer = 1`` (k must be 2) but routes
exactly as without it (the softmax over all experts, its top 2; only the CUDA kernel's
``sparse_mixer_top2`` implements the masking), so the kernel is not asked to: the
router stays as the graph computes it and the kernel is fed its choice and weights
(``_any_router.py``). The pattern ``moe_sparse_mixer`` binds one round (its ArgMax, the
masked Softmax and the GatherElements of the chosen weight); this finds the logits the
rounds start from.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_tensor
from autofusion.fusion_core.rewriters.mixture_of_experts._block import router_input

__all__ = ["argmax_logits"]

_DEPTH = 12  # steps back from the ArgMax (a later round reads the earlier's masks)


def argmax_logits(argmax: ir.Node) -> ir.Value | str:
    """The router's logits (a MatMul or Gemm of the hidden states by a constant) that the
    ArgMax's scores are computed from, the nearest first; or why there are none."""
    todo, seen = [(argmax.inputs[0] if argmax.inputs else None, 0)], set()
    while todo:
        value, depth = todo.pop(0)
        if value is None or id(value) in seen or depth > _DEPTH:
            continue
        seen.add(id(value))
        if not isinstance(router_input(value), str):
            return value
        node = value.producer()
        if node is not None:
            todo += [(v, depth + 1) for v in node.inputs if constant_tensor(v) is None]
    return (
        f"ArgMax {argmax.name!r} does not pick from a router's logits (a MatMul or Gemm "
        "by a constant matrix)"
    )
