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

__all__ = ["PROBES", "attention_softmax"]


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


PROBES: dict[str, Callable[[ir.Node], bool]] = {"attention_softmax": attention_softmax}
