"""What the fourth survey's MoE reproductions share: a graph writer, the experts block as
transformers 5's ``batched_mm`` exports it (each token's k chosen experts' stacked
weights gathered, SwiGLU or another activation, weighted, summed per token), its numpy
reference, and a runner that checks onnxruntime against the reference and prints what
the fusion makes of the block. Not a reproduction of its own.

The routers are each file's own: moe_router_mlp_skip_expert.py and
moe_shared_gates.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort

from autofusion.fusion_core.testing import GraphWriter

HIDDEN, EXPERTS, K, INTER = 16, 4, 2, 8
RTOL, ATOL = 1e-4, 1e-5  # the MoE kernel sums the experts in another order


class Graph(GraphWriter):
    """``GraphWriter`` with a float32 scalar constant."""

    def f32(self, value: float, hint: str = "scalar") -> str:
        return self.const(np.array(value, np.float32), hint)


def swiglu(g: Graph, gate: str, up: str) -> str:
    return g.one("Mul", g.one("Mul", gate, g.one("Sigmoid", gate)), up)


def batched_experts(
    g: Graph,
    x: str,
    weights: str,
    chosen: str,
    *,
    k: int = K,
    experts: int = EXPERTS,
    activation: Callable[[Graph, str, str], str] = swiglu,
    gated: bool = True,
) -> str:
    """sum_j weights[t, j] * down_e(act(gate_e(x_t), up_e(x_t))), e = chosen[t, j], as
    ``batched_mm`` writes it: x repeated k times, the chosen experts' [out, in] weights
    gathered, a column MatMul per linear. ``gated=False``: one up projection, no gate
    (act reads it twice: ``activation(g, up, up)``)."""
    ids = g.one("Reshape", chosen, g.ints(-1))
    tiled = g.one("Expand", g.one("Unsqueeze", x, g.ints(1)), g.ints(1, k, 1))
    rows = g.one("Reshape", tiled, g.ints(-1, HIDDEN))

    def linear(value: str, array: np.ndarray, hint: str) -> str:
        gathered = g.one("Gather", g.const(array, hint), ids, axis=0)
        column = g.one("Unsqueeze", value, g.ints(-1))
        return g.one("Squeeze", g.one("MatMul", gathered, column), g.ints(-1))

    up = linear(rows, g.weight(experts, INTER, HIDDEN), "up_w")
    gate = linear(rows, g.weight(experts, INTER, HIDDEN), "gate_w") if gated else up
    down = linear(activation(g, gate, up), g.weight(experts, HIDDEN, INTER), "down_w")
    scale = g.one("Unsqueeze", g.one("Reshape", weights, g.ints(-1)), g.ints(-1))
    per_token = g.one("Reshape", g.one("Mul", down, scale), g.ints(-1, k, HIDDEN))
    return g.one("ReduceSum", per_token, g.ints(1), keepdims=0)


def experts_reference(
    arrays: dict, x: np.ndarray, weights: np.ndarray, chosen: np.ndarray, act=None
) -> np.ndarray:
    """numpy of ``batched_experts`` (float64); ``act(gate, up)`` defaults to SwiGLU."""
    act = act or (lambda gate, up: gate / (1 + np.exp(-gate)) * up)
    out = np.zeros((len(x), HIDDEN))
    for t, j in np.ndindex(*chosen.shape):
        e = chosen[t, j]
        up = arrays["up_w"][e] @ x[t]
        gate = arrays["gate_w"][e] @ x[t] if "gate_w" in arrays else up
        out[t] += weights[t, j] * (arrays["down_w"][e] @ act(gate, up))
    return out


def check_and_report(
    cases: dict[str, Callable[[], tuple[onnx.ModelProto, Callable]]], tokens: int = 6
) -> None:
    """Each case: (model, reference(hidden) -> output). onnxruntime must match the
    reference; then what optimize() makes of it (the MoE ops, the first MoE near miss)."""
    rng = np.random.default_rng(1)
    for make in cases.values():
        model, reference = make()
        shape = [d.dim_value or tokens for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = rng.standard_normal(shape).astype(np.float32)
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        (got,) = session.run(None, {"hidden": x})
        np.testing.assert_allclose(got, reference(x.astype(np.float64)), rtol=RTOL, atol=ATOL)
    print("onnxruntime matches the reference in every case")
    try:  # what the fusion makes of it, where the project is importable
        from autofusion.fusion_core import OptimizeConfig, optimize
    except ImportError:
        return
    config = OptimizeConfig(target="onnxruntime", target_profile="cpu-roofline")
    for name, make in cases.items():
        result = optimize(make()[0], config)
        fused = {op: n for op, n in result.ops_after.items() if op.endswith("MoE")}
        misses = [f"{m.pattern}: {m.reason[:300]}" for m in result.near_misses]
        moe = [m for m in misses if m.startswith("moe_")]
        bugs = [r.failed for r in result.rejected]
        bug = f"; BUG: {bugs}" if bugs else ""
        print(f"{name}: {fused or 'no MoE'}; near miss: {moe[:1]}{bug}")
