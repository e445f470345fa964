"""What the experts may be: the candidates the proof (``_proof.py``) runs, in numpy.

onnxruntime's CPU ``com.microsoft.MoE`` with ``activation_type = swiglu`` (1.32,
``contrib_ops/cpu/moe/moe_utils.cc``) computes each chosen expert as::

    h = fc1[e] @ x + fc1_bias[e]                   # [2I]: gate, up, gate, up, ...
    g = min(h[0::2], limit);  u = clip(h[1::2], -limit, limit)
    y_e = fc2[e] @ (g * sigmoid(alpha * g) * (u + beta)) + fc2_bias[e]

with ``activation_alpha``, ``activation_beta`` and ``swiglu_limit`` (1.32's defaults 1,
0 and +inf are the plain SwiGLU ``silu(gate) * up``; gpt-oss's clamped SwiGLU is alpha
1.702, beta 1, limit 7). Which stacked weight is the gate, up and down, how a fused
gate/up weight is split (halves, or interleaved rows as gpt-oss stores them), which
bias goes with which, and the activation's constants are hypotheses; the constants are
read from the block's ops (a Mul before the Sigmoid, a Clip, an Add of a scalar) and
only proposed: running decides.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block, StackedWeight
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = [
    "Activation",
    "Constant",
    "Experts",
    "Layout",
    "activations",
    "as_moe",
    "layouts",
    "moe_attributes",
    "moe_node",
    "scaled",
]

# Makes the constant input ``hint`` holding an array: an initializer in the rewritten
# graph, a fed graph input in the proof's model (so that no weight is copied).
Constant = Callable[[str, np.ndarray], ir.Value]

_MOST = 4  # candidates kept per constant (alpha, beta, limit): at most 5 x 5 x 5 activations


@dataclass(frozen=True)
class Activation:
    """The kernel's SwiGLU constants; the defaults are the plain ``silu(gate) * up``."""

    alpha: float = 1.0
    beta: float = 0.0
    limit: float = math.inf

    def __call__(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        gate = np.minimum(gate, self.limit)
        up = np.clip(up, -self.limit, self.limit)
        return gate / (1.0 + np.exp(-self.alpha * gate)) * (up + self.beta)


@dataclass
class Layout:
    """One reading of the stacked weights: each [experts, out, in], biases [experts, out]."""

    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    gate_bias: np.ndarray | None = None
    up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None


@dataclass
class Experts:
    """The experts as com.microsoft.MoE takes them (CPU: SwiGLU, gate/up interleaved)."""

    k: int
    normalize: bool
    fc1: np.ndarray  # [experts, 2 * inter, hidden]: gate and up rows interleaved
    fc2: np.ndarray  # [experts, hidden, inter]
    fc1_bias: np.ndarray | None = None  # [experts, 2 * inter]
    fc2_bias: np.ndarray | None = None  # [experts, hidden]
    activation: Activation = Activation()


def as_moe(layout: Layout, activation: Activation, k: int, normalize: bool) -> Experts:
    experts, inter, hidden = layout.gate.shape
    fc1 = np.empty((experts, 2 * inter, hidden), np.float32)
    fc1[:, 0::2], fc1[:, 1::2] = layout.gate, layout.up  # the CPU kernel's interleaved SwiGLU
    fc1_bias = None
    if layout.gate_bias is not None or layout.up_bias is not None:
        fc1_bias = np.zeros((experts, 2 * inter), np.float32)
        for part, bias in ((0, layout.gate_bias), (1, layout.up_bias)):
            if bias is not None:
                fc1_bias[:, part::2] = bias
    fc2_bias = None if layout.down_bias is None else layout.down_bias.astype(np.float32)
    down = np.ascontiguousarray(layout.down, np.float32)
    return Experts(k, normalize, fc1, down, fc1_bias, fc2_bias, activation)


def moe_attributes(experts: Experts) -> dict[str, int | float | str]:
    """Every SwiGLU attribute spelled out: a later onnxruntime may change the defaults."""
    act = experts.activation
    return {
        "k": experts.k,
        "activation_type": "swiglu",
        "swiglu_fusion": 1,
        "normalize_routing_weights": int(experts.normalize),
        "activation_alpha": act.alpha,
        "activation_beta": act.beta,
        "swiglu_limit": act.limit,
    }


def moe_node(hidden: ir.Value, router: ir.Value, experts: Experts, constant: Constant) -> ir.Node:
    """The ``com.microsoft.MoE`` of the experts over ``hidden``, routed by the softmax of
    ``router`` (the kernel applies the softmax and the top-k itself)."""
    inputs = [
        None if array is None else constant(name, array)
        for name, array in (
            ("fc1", experts.fc1),
            ("fc1_bias", experts.fc1_bias),
            ("fc2", experts.fc2),
            ("fc2_bias", experts.fc2_bias),
        )
    ]
    return ir.node("MoE", [hidden, router, *inputs], moe_attributes(experts), domain=MS_DOMAIN)


def scaled(experts: Experts, scale: float) -> Experts:
    """The experts with every output times ``scale`` (a routing weight's constant factor,
    DeepSeek-V3's ``routed_scaling_factor``): sum_j w_j c (W2 a + b2) = c sum_j w_j (W2 a + b2)."""
    if scale == 1.0:
        return experts
    bias = experts.fc2_bias
    return replace(
        experts,
        fc2=(experts.fc2 * np.float32(scale)).astype(np.float32),
        fc2_bias=None if bias is None else (bias * np.float32(scale)).astype(np.float32),
    )


def _out_in(weight: StackedWeight) -> np.ndarray:
    """The weight as [experts, out, in]."""
    array = constant_array(weight.array_value)
    return array if weight.weight_first else np.swapaxes(array, 1, 2)


def _bias(weight: StackedWeight) -> np.ndarray | None:
    return constant_array(weight.bias) if weight.bias is not None else None


def _splits(rows: int) -> list[tuple[slice, slice]]:
    """(gate rows, up rows) of a fused gate/up weight: halves or interleaved, each way."""
    if rows % 2:
        return []
    half = rows // 2
    first, second = slice(0, half), slice(half, rows)
    even, odd = slice(0, rows, 2), slice(1, rows, 2)
    return [(first, second), (second, first), (even, odd), (odd, even)]


def layouts(block: Block) -> list[Layout]:
    """The readings of the block's experts' weights worth running."""
    if block.units:  # which is the gate is known: what the silu reads
        gate, up, down = (
            np.stack([getattr(u, part).T for u in block.units]) for part in ("gate", "up", "down")
        )
        return [Layout(gate, up, down)]
    position = {id(n): i for i, n in enumerate(block.nodes)}  # graph order
    ordered = sorted(block.weights, key=lambda w: position[id(w.matmul)])
    arrays, biases = [_out_in(w) for w in ordered], [_bias(w) for w in ordered]
    if len(arrays) == 2:
        (fused, down), (fused_bias, down_bias) = arrays, biases
        found = []
        for g, u in _splits(fused.shape[1]):
            gb, ub = (None, None) if fused_bias is None else (fused_bias[:, g], fused_bias[:, u])
            found.append(Layout(fused[:, g], fused[:, u], down, gb, ub, down_bias))
        return found
    if len(arrays) == 3:
        first, second, down = arrays
        fb, sb, db = biases
        return [Layout(first, second, down, fb, sb, db), Layout(second, first, down, sb, fb, db)]
    return []


def _scalar(value: ir.Value | None) -> float | None:
    array = constant_array(value)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def _constants(nodes: list[ir.Node]) -> tuple[set[float], set[float], set[float]]:
    """Scalars the block's ops read that may be SwiGLU's alpha, beta and limit."""
    alphas, betas, limits = set(), set(), set()
    for node in nodes:
        inputs = list(node.inputs)
        if node.op_type == "Sigmoid" and inputs[0] is not None:
            scale = inputs[0].producer()
            if scale is not None and scale.op_type == "Mul":
                alphas |= {a for a in map(_scalar, scale.inputs) if a is not None}
        elif node.op_type == "QuickGelu" and "alpha" in node.attributes:
            alphas.add(float(node.attributes["alpha"].value))
        elif node.op_type == "Clip" and len(inputs) > 2:
            limits |= {abs(b) for b in map(_scalar, inputs[1:3]) if b is not None}
        elif node.op_type in ("Min", "Max"):
            limits |= {abs(b) for b in map(_scalar, inputs) if b is not None}
        elif node.op_type == "Add":
            betas |= {b for b in map(_scalar, inputs) if b is not None}
    return alphas, betas, limits


def activations(nodes: list[ir.Node]) -> list[Activation]:
    """The plain SwiGLU first, then every combination of the constants the block reads."""
    alphas, betas, limits = (sorted(c)[:_MOST] for c in _constants(nodes))
    found = [Activation()]
    combos = itertools.product(
        sorted({*alphas, 1.0}), sorted({*betas, 0.0}), sorted({*limits, math.inf})
    )
    found += [Activation(a, b, c) for a, b, c in combos if Activation(a, b, c) != found[0]]
    return found
