"""The graph edits every canonical rule makes: a small int64 constant, and new nodes in
the place of old ones, marked with the rule that wrote them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

__all__ = ["int64s", "replace"]


def int64s(graph: ir.Graph, fresh_name: Callable[[str], str], values: list[int]) -> ir.Value:
    """A new int64 initializer holding ``values``."""
    value = ir.Value(
        name=fresh_name("canonical_ints"),
        shape=ir.Shape([len(values)]),
        const_value=ir.tensor(np.array(values, np.int64)),
    )
    value.dtype = ir.DataType.INT64
    graph.register_initializer(value)
    return value


def replace(graph: ir.Graph, old: ir.Node, new: list[ir.Node], mark: str, rule: str) -> None:
    """Put ``new`` in ``old``'s place: the first outputs of its last ``len(old.outputs)``
    nodes take the readers of ``old``'s outputs, in order. Each new node is marked with
    ``rule``, and constants built for it (no producer, not yet in the graph) become
    initializers."""
    for node in new:
        node.metadata_props[mark] = rule
        for value in node.inputs:
            if (
                value is not None
                and value.const_value is not None
                and value.producer() is None
                and value.name not in graph.initializers
            ):
                graph.register_initializer(value)
    graph.insert_before(old, new)
    for value, node in zip(old.outputs, new[-len(old.outputs) :], strict=True):
        value.replace_all_uses_with(node.outputs[0])
    graph.remove(old, safe=True)
