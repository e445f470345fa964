"""A router that runs before the tokens are flattened: logits ``[B, S, E]`` (ZAYA).

The experts read the hidden states as ``[B * S, D]``; ZAYA's router MLP runs on them
unflattened, so its logits are ``[B, S, E]``. Every step of a router acts on the last
axis (Softmax, TopK, GatherElements, a selection bias, a Where), and such steps commute
with merging the leading axes::

    route(Reshape(r, [-1, E])) = Reshape(route(r), [-1, k])

so the routing ``com.microsoft.MoE`` is given (its ``router_probs`` are 2-D) reads the
logits merged, and the kernel the hidden states merged (a copy of the graph's own router,
``Routing.unmerged``, reads the logits as the graph does and gives the choice and weights
[B * S, k] as the graph's router does: only the hidden states are merged)::

    y = Reshape(routed(Reshape(x, [-1, D]), Reshape(r, [-1, E])), Shape(x))

This is not assumed: the proof (``_proof.py``) runs the block on ``[B, S, E]`` logits
(two sequences of three tokens where both axes are symbolic) and what is emitted on the
same ones, and a router whose steps do not commute (an axis other than the last, a
Reshape to ``[B, S * k]``) gives other values and is refused.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.rewriters.mixture_of_experts._proof import Emitted, Routing

__all__ = ["merged"]


def merged(routing: Routing, classes: int, width: int) -> Routing:
    """``routing`` over the logits' and the hidden states' leading axes merged (logits
    with ``classes`` on their last axis, hidden states ``width`` wide), its output
    shaped back as the hidden states."""

    def emit(hidden, logits, experts, constant, outside) -> Emitted:
        rows = constant("merged_tokens", np.array([-1, width], np.int64))
        flat_hidden = ir.node("Reshape", [hidden, rows])
        flats = [flat_hidden]
        if not routing.unmerged:  # the kernel's own routing reads [tokens, classes]
            scores = constant("merged_logits", np.array([-1, classes], np.int64))
            flats.append(ir.node("Reshape", [logits, scores]))
        for flat, value in zip(flats, (hidden, logits), strict=False):
            flat.outputs[0].dtype = value.dtype  # the patterns read the router's dtype
        read = flats[1].outputs[0] if len(flats) > 1 else logits
        inner = routing.emit(flat_hidden.outputs[0], read, experts, constant, outside)
        shape = ir.node("Shape", [hidden])
        back = ir.node("Reshape", [inner.output, shape.outputs[0]])
        nodes = [*flats, *inner.nodes, shape, back]
        return Emitted(nodes, back.outputs[0], inner.kept)

    return replace(routing, emit=emit)
