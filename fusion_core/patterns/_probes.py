"""Probes: predicates on one graph node, registered by name, that a pattern's ``explain``
names (``explain: {node: softmax, when: attention_softmax}``).

A probe is code for what a pattern cannot say: which graph nodes deserve a near miss
when no binding reached them (``_explain.py`` grows the binding from each). The spec
checks a probe's name at registration, so the registry sits below the spec.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = ["PROBES", "attention_softmax", "router_softmax"]


def _activation(value: ir.Value | None) -> bool:
    return value is not None and constant_array(value) is None


def attention_softmax(node: ir.Node) -> bool:
    """A Softmax of scores: its input comes from a MatMul of two activations, possibly
    through a few elementwise steps (scale, mask, Where, Cast) and reshapes (DeBERTa
    reshapes its scores between the relative-position Add and the mask's Where)."""
    todo, seen = [(node.inputs[0] if node.inputs else None, 0)], set()
    while todo:
        value, depth = todo.pop()
        producer = value.producer() if value is not None else None
        if producer is None or id(producer) in seen or depth > 6:
            continue
        seen.add(id(producer))
        if producer.op_type == "MatMul":
            if all(_activation(v) for v in producer.inputs[:2]):
                return True
        elif producer.op_type in ("Add", "Sub", "Mul", "Div", "Where", "Cast"):
            todo += [(v, depth + 1) for v in producer.inputs if _activation(v)]
        elif producer.op_type in ("Reshape", "Squeeze", "Unsqueeze") and producer.inputs:
            todo.append((producer.inputs[0], depth + 1))
    return False


# What a router's probabilities are read by: the choice of experts (TopK, or a gather of
# the chosen weights: PhiMoE's sparsemixer, whose selection has no TopK).
_SELECTIONS = frozenset({"TopK", "GatherElements", "GatherND", "ArgMax"})
_ROUTER_STEPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Greater", "Less", "ReduceMax", "Abs"}
)


def router_softmax(node: ir.Node) -> bool:
    """A Softmax over experts that picks some of them: its input comes from a MatMul or
    Gemm by a constant 2-D weight (the router) through elementwise steps and reductions
    (masks, a max), and a selection (TopK, GatherElements, ...) reads it. A classifier's
    Softmax (a graph output, no selection after it) is not one."""
    out = node.outputs[0]
    if out.is_graph_output() or not any(u.node.op_type in _SELECTIONS for u in out.uses()):
        return False
    todo, seen = [(node.inputs[0] if node.inputs else None, 0)], set()
    while todo:
        value, depth = todo.pop()
        producer = value.producer() if value is not None else None
        if producer is None or id(producer) in seen or depth > 8:
            continue
        seen.add(id(producer))
        if producer.op_type in ("MatMul", "Gemm") and len(producer.inputs) > 1:
            weight = constant_array(producer.inputs[1])
            if weight is not None and weight.ndim == 2:
                return True
        elif producer.op_type in _ROUTER_STEPS:
            todo += [(v, depth + 1) for v in producer.inputs if _activation(v)]
    return False


PROBES: dict[str, Callable[[ir.Node], bool]] = {
    "attention_softmax": attention_softmax,
    "router_softmax": router_softmax,
}
