"""A router whose logits are [batch, seq, experts + 1] (an MLP on the unflattened hidden
states) and whose last class is a "skip" expert that computes nothing (ZAYA).

Seen in: zaya torchscript, dynamo, dynamo_kv: "MoE 0 of 2", first near miss
  moe_softmax_pick: rewriter 'mixture_of_experts': the router's logits 'linear_9' are
  not [tokens, experts]

ZayaRouter writes (top_k = 1 in ZAYA; k = 2 here shows the same)
    r      = router_mlp(down_proj(x))                  [B, S, E + 1], x still [B, S, D]
    p      = Softmax(r)                                 over E experts and the skip class
    chosen = TopK(p + balancing_biases, k)[1]           biases: 0 ..., -1 for the skip
    w      = GatherElements(p, chosen, axis=2)
    w      = Where(chosen == E, 0, w); chosen = Where(chosen == E, 0, chosen)
    experts(x.view(B * S, D), chosen.view(-1, k), w.view(-1, k))   E experts, no skip

Two steps are new:
1. The logits are 3-D: the router runs before the [B*S, D] flattening the experts read.
   Softmax, TopK and GatherElements over the last axis commute with that Reshape
   (Reshape(r, [-1, E+1]) first gives the same rows), so the router's [B, S, E+1] is
   [tokens, experts] once its leading axes are merged: the rewriter may merge them
   (Reshape of the logits) instead of refusing.
2. The skip class: expert E is a zero expert (its output 0) that still takes part in
   the softmax and the choice; its weight is zeroed and its index sent to expert 0.
   That is an MoE over E + 1 experts whose last expert's weights are all zero (or the
   router's own choice and weights, _any_router.py, over E + 1 with a zero expert).
   The balancing bias is a selection bias (not all zero): the any-router path.
Cases: the control (2-D logits, E classes), 3-D logits alone, and ZAYA's (3-D, skip).

Run: .venv/bin/python bench/repro/moe_router_mlp_skip_expert.py
"""

from __future__ import annotations

import numpy as np
from moe_common import (
    EXPERTS,
    HIDDEN,
    Graph,
    K,
    batched_experts,
    check_and_report,
    experts_reference,
)


def block(*, three_d: bool, skip: bool):
    """hidden [1, tokens, HIDDEN] -> the same; the router on [1, T, D] when ``three_d``,
    else on the flattened [T, D]; ``skip``: one more class, the skip expert."""
    g = Graph()
    classes = EXPERTS + (1 if skip else 0)
    router = g.weight(classes, HIDDEN)
    flat = g.one("Reshape", "hidden", g.ints(-1, HIDDEN))
    source = "hidden" if three_d else flat
    logits = g.one("MatMul", source, g.const(np.ascontiguousarray(router.T), "router"))
    probs = g.one("Softmax", logits, axis=-1)
    biases = np.zeros(classes, np.float32)
    if skip:
        biases[-1] = -1.0
    choice = g.one("Add", probs, g.const(biases, "balancing"))
    chosen = g.op("TopK", choice, g.ints(K), outputs=2, axis=-1)[1]
    weights = g.one("GatherElements", probs, chosen, axis=-1)
    if skip:
        is_skip = g.one("Equal", chosen, g.const(np.array(EXPERTS, np.int64), "skip_id"))
        weights = g.one("Where", is_skip, g.f32(0.0, "zero_f"), weights)
        chosen = g.one("Where", is_skip, g.const(np.array(0, np.int64), "zero_i"), chosen)
    weights = g.one("Reshape", weights, g.ints(-1, K))
    chosen = g.one("Reshape", chosen, g.ints(-1, K))
    y = batched_experts(g, flat, weights, chosen)
    out = g.one("Add", g.one("Reshape", y, g.one("Shape", "hidden")), "hidden")
    model = g.model("router_mlp_skip", out, [1, "tokens", HIDDEN])

    def reference(x):
        rows = x.reshape(-1, HIDDEN)
        logit = rows @ router.T.astype(np.float64)
        p = np.exp(logit - logit.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        picked = np.argsort(-(p + biases), axis=-1, kind="stable")[:, :K]
        w = np.take_along_axis(p, picked, -1)
        if skip:
            w = np.where(picked == EXPERTS, 0.0, w)
            picked = np.where(picked == EXPERTS, 0, picked)
        return (experts_reference(g.arrays, rows, w, picked) + rows).reshape(x.shape)

    return model, reference


CASES = {
    "control: the router on [tokens, D], E classes": lambda: block(three_d=False, skip=False),
    "3-D logits [1, T, E]": lambda: block(three_d=True, skip=False),
    "ZAYA: 3-D logits, a skip class": lambda: block(three_d=True, skip=True),
}

if __name__ == "__main__":
    check_and_report(CASES)
