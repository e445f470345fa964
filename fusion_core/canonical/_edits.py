"""The graph edits every canonical rule makes: a small int64 constant, new nodes in the
place of old ones, marked with the rule that wrote them, and the one node an undo puts
back in their place."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx_ir as ir

__all__ = [
    "INTEGER_TYPES",
    "array_initializer",
    "by_op_type",
    "drop_unread",
    "int64s",
    "new_initializer",
    "put_back",
    "replace",
    "take_place",
]

# The element types of the masks exporters compute (attention_mask and its comparisons).
INTEGER_TYPES = frozenset(
    {
        ir.DataType.BOOL,
        ir.DataType.INT64,
        ir.DataType.INT32,
        ir.DataType.INT16,
        ir.DataType.INT8,
        ir.DataType.UINT8,
    }
)


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


def new_initializer(
    graph: ir.Graph,
    name: str,
    number: float | list[int],
    dtype: ir.DataType | None,
    shape: tuple[int, ...] | None = None,
) -> ir.Value:
    """A new initializer holding ``number`` (filled to ``shape`` where one is given),
    named ``name`` or, where that is taken, with a suffix; float32 without a ``dtype``."""
    numpy_type = dtype.numpy() if dtype is not None else np.float32
    array = np.array(number, numpy_type) if shape is None else np.full(shape, number, numpy_type)
    return array_initializer(graph, name, array)


def free_name(graph: ir.Graph, name: str) -> str:
    """``name``, or with a suffix where an initializer has it: an undo names what it puts
    back after the node it rewrites, and a pass over a model an undo wrote before (each
    stage of progressive validation starts from the last one's output) finds it taken."""
    unique, k = name, 0
    while unique in graph.initializers:
        k += 1
        unique = f"{name}_{k}"
    return unique


def array_initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    """A new initializer holding ``array``, named ``name`` or, where that is taken, with
    a suffix."""
    unique = free_name(graph, name)
    value = ir.Value(name=unique, shape=ir.Shape(array.shape), const_value=ir.tensor(array))
    value.dtype = ir.DataType.from_numpy(array.dtype)
    graph.register_initializer(value)
    return value


def take_place(old: ir.Value, new: ir.Value) -> None:
    """``new`` takes ``old``'s readers, its name and its place among the graph outputs."""
    name, old.name = old.name, None
    new.name = name or new.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)


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


def put_back(graph: ir.Graph, node: ir.Node, last: ir.Node, written: list[ir.Node]) -> None:
    """Put ``node`` (the spelling the graph had) where a rule's ``written`` nodes stand:
    it takes the place, type and readers of ``last``'s output, and ``written`` (``last``
    among them) go. The undo of every rule that no fusion took."""
    out, again = last.outputs[0], node.outputs[0]
    again.dtype, again.shape = out.dtype, out.shape
    again.name = f"{out.name}_{node.op_type.lower()}"
    node.name = node.name or f"{last.name}_{node.op_type}"
    graph.insert_before(last, [node])
    out.replace_all_uses_with(again)
    graph.remove(written, safe=True)


def by_op_type(graph: ir.Graph, steps: Mapping[str, Callable[[ir.Node], int]]) -> int:
    """Run each ONNX-domain node still in ``graph`` through the step for its op type;
    how many the steps rewrote (nodes a step adds wait for the next pass)."""
    done = 0
    for node in list(graph):
        step = steps.get(node.op_type)
        if step is not None and node.graph is graph and node.domain in ("", "ai.onnx"):
            done += step(node)
    return done


def drop_unread(graph: ir.Graph, nodes: list[ir.Node | None]) -> None:
    """Remove the nodes a rewrite left unread, and what only they read."""
    pending = [n for n in nodes if n is not None]
    while pending:
        node = pending.pop()
        if node.graph is not graph or any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        inputs = [v.producer() for v in node.inputs if v is not None]
        graph.remove(node, safe=True)
        pending += [p for p in inputs if p is not None]
