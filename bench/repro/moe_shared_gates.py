"""A sigmoid router whose weights are normalized over the chosen experts AND the shared
experts' own gates, by a log-sum-exp of log-sigmoids (Inkling).

Seen in: inkling_text torchscript: "MoE 0 of 2" and no near miss at all (no MoE pattern
anchors on it). (Its dynamo export fails.)

InklingTopkRouter writes (E routed experts, S shared ones, one logit each)
    l      = x W_r^T                                   [T, E + S]
    chosen = TopK(Sigmoid(l)[:, :E] + bias, k)[1]       bias: e_score_correction_bias
    g      = Concat(GatherElements(l[:, :E], chosen), l[:, E:])       the raw logits
    a      = Log(Sigmoid(g));  w = Exp(a - ReduceLogSumExp(a)) * route_scale * global_scale
    routed weights w[:, :k]; the shared experts' gammas w[:, k:] weigh their outputs
TorchScript writes LogSigmoid as Log(Sigmoid) and the log-softmax as ReduceLogSumExp,
Sub, Exp.

Math: Exp(Log s_i - log sum_j s_j) = s_i / sum_j s_j, s = sigmoid: the routed weights
are sigmoid(l_c) / (sum over the chosen of sigmoid + sum over the shared of sigmoid),
times a scale. It is GLM-4-MoE's renormalized sigmoid router (which fuses) but for the
shared experts' gates in the denominator: w_routed = sigmoid-renormalized weights times
sum_chosen s / (sum_chosen s + sum_shared s), a per-token factor the any-router path
(_any_router.py: the router's own weights fed to the kernel) computes as written. The
shared experts stay outside the MoE, weighted by their gammas. The anchors miss it:
the GatherElements reads the logits' Slice, not a Sigmoid, and the Sigmoid comes after
a Concat.
Cases: the control (GLM-4-MoE's renormalized sigmoid router, no shared gate) and
Inkling's (one shared expert, its gate in the denominator).

Run: .venv/bin/python bench/repro/moe_shared_gates.py
"""

from __future__ import annotations

import numpy as np
from moe_common import (
    EXPERTS,
    HIDDEN,
    INTER,
    Graph,
    K,
    batched_experts,
    check_and_report,
    experts_reference,
    swiglu,
)

SHARED = 1
ROUTE_SCALE = 2.0


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _shared_expert(g: Graph, x: str, gamma: str) -> tuple[str, dict]:
    up, gate, down = (
        g.weight(INTER, HIDDEN),
        g.weight(INTER, HIDDEN),
        g.weight(HIDDEN, INTER),
    )
    u = g.one("MatMul", x, g.const(np.ascontiguousarray(up.T), "shared_up"))
    v = g.one("MatMul", x, g.const(np.ascontiguousarray(gate.T), "shared_gate"))
    h = g.one("Mul", swiglu(g, v, u), gamma)
    out = g.one("MatMul", h, g.const(np.ascontiguousarray(down.T), "shared_down"))
    return out, {"up": up, "gate": gate, "down": down}


def block(*, shared_gate: bool):
    """hidden [tokens, HIDDEN] -> the same. ``shared_gate`` False: the control."""
    g = Graph()
    classes = EXPERTS + (SHARED if shared_gate else 0)
    router = g.weight(classes, HIDDEN)
    logits = g.one("MatMul", "hidden", g.const(np.ascontiguousarray(router.T), "router"))
    scores = g.one("Sigmoid", logits)
    if shared_gate:
        zero, cut, last = g.ints(0), g.ints(EXPERTS), g.ints(1)
        routed_scores = g.one("Slice", scores, zero, cut, last)
        routed_logits = g.one("Slice", logits, zero, cut, last)
        shared_logits = g.one("Slice", logits, cut, g.ints(classes), last)
    else:
        routed_scores = scores
    bias = g.const(np.zeros(EXPERTS, np.float32), "bias")
    chosen = g.op("TopK", g.one("Add", routed_scores, bias), g.ints(K), outputs=2, axis=-1)[1]
    if shared_gate:
        picked = g.one("GatherElements", routed_logits, chosen, axis=-1)
        both = g.one("Concat", picked, shared_logits, axis=-1)
        log_s = g.one("Log", g.one("Sigmoid", both))
        total = g.one("ReduceLogSumExp", log_s, g.ints(-1), keepdims=1)
        w = g.one("Mul", g.one("Exp", g.one("Sub", log_s, total)), g.f32(ROUTE_SCALE))
        weights = g.one("Slice", w, g.ints(0), g.ints(K), g.ints(1))
        gamma = g.one("Slice", w, g.ints(K), g.ints(K + SHARED), g.ints(1))
    else:
        picked = g.one("GatherElements", scores, chosen, axis=-1)
        total = g.one("ReduceSum", picked, g.ints(-1), keepdims=1)
        weights = g.one("Mul", g.one("Div", picked, total), g.f32(ROUTE_SCALE))
    y = batched_experts(g, "hidden", weights, chosen)
    if shared_gate:
        shared, parts = _shared_expert(g, "hidden", gamma)
        y = g.one("Add", y, shared)
    out = g.one("Add", y, "hidden")
    model = g.model("shared_gates", out, ["tokens", HIDDEN])

    def reference(x):
        logit = x @ router.T.astype(np.float64)
        s = _sigmoid(logit)
        c = np.argsort(-s[:, :EXPERTS], axis=-1, kind="stable")[:, :K]
        picked_s = np.take_along_axis(s, c, -1)
        denominator = picked_s.sum(-1, keepdims=True)
        if shared_gate:
            denominator = denominator + s[:, EXPERTS:].sum(-1, keepdims=True)
        w = picked_s / denominator * ROUTE_SCALE
        y = experts_reference(g.arrays, x, w, c)
        if shared_gate:
            gamma = s[:, EXPERTS:] / denominator * ROUTE_SCALE
            v = x @ parts["gate"].T
            y = y + (v / (1 + np.exp(-v)) * (x @ parts["up"].T) * gamma) @ parts["down"].T
        return y + x

    return model, reference


CASES = {
    "control: renormalized sigmoid router (GLM-4-MoE)": lambda: block(shared_gate=False),
    "Inkling: the shared expert's gate in the denominator": lambda: block(shared_gate=True),
}

if __name__ == "__main__":
    check_and_report(CASES)
