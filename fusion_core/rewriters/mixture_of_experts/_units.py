"""Experts written one by one: a SwiGLU MLP per expert, each with its own weights.

An exporter that unrolls the experts' loop (optimum's export of transformers' eager
Qwen3-MoE and Mixtral: NonZero of the expert's mask, a Gather of its tokens, its MLP,
ScatterElements or ScatterND back) or computes every expert on every token and masks
them writes each expert as ``down(silu(x @ W_gate) * (x @ W_up))`` with constant 2-D
weights. This finds those units, in graph order: an unrolled loop runs the experts in
order, so the i-th unit is expert i, which the proof (``_proof.py``) then checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = ["Unit", "swiglu_units"]


@dataclass
class Unit:
    """One expert's weights, each [in, out] as its MatMul reads them."""

    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


def _weight(node: ir.Node | None) -> tuple[ir.Value, np.ndarray] | None:
    """(input, weight) of ``x @ W`` with a constant 2-D W, else None."""
    if node is None or node.op_type != "MatMul" or len(node.inputs) != 2:
        return None
    weight = constant_array(node.inputs[1])
    if weight is None or weight.ndim != 2:
        return None
    return node.inputs[0], weight


def _silu_of(value: ir.Value | None) -> ir.Value | None:
    """``x`` when ``value`` is silu(x): x * Sigmoid(x) either way round, or the
    QuickGelu(alpha=1) the silu pattern makes of it."""
    node = value.producer() if value is not None else None
    if node is None:
        return None
    if node.op_type == "QuickGelu" and node.domain == "com.microsoft":
        alpha = node.attributes.get("alpha")
        return node.inputs[0] if alpha is None or alpha.value == 1.0 else None
    if node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    for x, other in (node.inputs, node.inputs[::-1]):
        sigmoid = other.producer() if other is not None else None
        if sigmoid is not None and sigmoid.op_type == "Sigmoid" and sigmoid.inputs[0] is x:
            return x
    return None


def _unit(down: ir.Node) -> Unit | None:
    found = _weight(down)
    if found is None:
        return None
    product, down_weight = found
    mul = product.producer()
    if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2:
        return None
    for activated, other in (mul.inputs, mul.inputs[::-1]):
        gate_in = _silu_of(activated)
        gate = _weight(gate_in.producer()) if gate_in is not None else None
        up = _weight(other.producer()) if other is not None else None
        if gate is not None and up is not None and gate[0] is up[0]:
            return Unit(gate[1], up[1], down_weight)
    return None


def swiglu_units(nodes: list[ir.Node]) -> list[Unit]:
    """The SwiGLU MLPs among ``nodes`` (in graph order), by their down projection."""
    return [u for u in (_unit(n) for n in nodes if n.op_type == "MatMul") if u is not None]
