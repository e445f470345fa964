"""Rule ``gelu_spelling``: a GELU block, in whatever spelling ``_gelu_reads`` reads it,
written in the one spelling each GELU pattern matches (``gelu_erf.yaml``,
``gelu_tanh.yaml``)::

    erf:   Mul(Mul(x, 0.5), Add(Erf(Div(x, sqrt(2))), 1))
    tanh:  Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), 0.044715)), sqrt(2/pi))), 1))

The block is replaced as a whole: what it computes is the same function of ``x`` (the
reading proved it, coefficient by coefficient), rounded in another order, as the fused
kernel that takes it rounds in its own. A block already in that spelling is left as it
is, so the rule is idempotent. The new output node stands for the old nodes in its
provenance and keeps, in its metadata, the old block written out (ops, names, the
constants' values); ``undo_gelu_spellings`` rebuilds it where no fusion took the new
one, so a GELU nothing fused (below opset 20 on the generic target, a priced loss)
comes out as it went in.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import new_initializer, take_place
from autofusion.fusion_core.canonical._gelu_reads import GeluBlock, read_gelu
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.provenance import REPLACED_NODES

__all__ = ["gelu_spellings", "undo_gelu_spellings"]

RULE = "gelu_spelling"
_OLD = "autofusion.gelu_spelling.old"  # on the written output: the old block, for the undo
_WRITTEN = "autofusion.gelu_spelling.written"  # and the names of the nodes written
_COMMUTATIVE = ("Add", "Mul")
_DIGITS = 5  # constants compared at 5 significant digits (the reading checked 1e-5)


def gelu_spellings(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every GELU-shaped block not in the patterns' spelling in it; how many."""
    done = 0
    for node in list(graph):
        if node.graph is not graph or node.op_type not in ("Erf", "Tanh"):
            continue
        if node.metadata_props.get(mark) == RULE:
            continue  # written by this rule
        block = read_gelu(node)
        if block is None:
            continue
        constants = _constants(block)
        if _tree(block.output, block.x) == _canonical_tree(block.kind, constants):
            continue
        _write(block, constants, graph, fresh_name, mark)
        done += 1
    return done


def _constants(block: GeluBlock) -> dict[str, float]:
    """The constants of the patterns' spelling that compute what ``block`` does: ``a x
    + b x t`` is ``(x * b) * (t + a / b)``; the Erf's ``s x`` is ``x / (1 / s)``, the
    Tanh's ``a x + b x^3`` is ``(x + x^3 * (b / a)) * a``."""
    a, b = block.gate
    found = {"half": b, "one": a / b}
    if block.kind == "Erf":
        found["root"] = 1.0 / block.argument[1]
    else:
        found["scale"] = block.argument[1]
        found["cube"] = block.argument[3] / block.argument[1]
    return found


def _tree(value: ir.Value, x: ir.Value) -> tuple:
    """The expression computing ``value`` from ``x`` as a nested tuple, operands of Add
    and Mul sorted, constants rounded: equal trees are one spelling."""
    if value is x:
        return ("x",)
    array = constant_array(value)
    if array is not None and array.size == 1:
        return ("c", float(f"{float(array.reshape(-1)[0]):.{_DIGITS}g}"))
    node = value.producer()
    if node is None:
        return ("?", value.name)
    children = [_tree(v, x) if v is not None else ("",) for v in node.inputs]
    return (node.op_type, *(sorted(children) if node.op_type in _COMMUTATIVE else children))


def _canonical_tree(kind: str, k: dict[str, float]) -> tuple:
    def c(number: float) -> tuple:
        return ("c", float(f"{number:.{_DIGITS}g}"))

    def op(name: str, *children: tuple) -> tuple:
        return (name, *(sorted(children) if name in _COMMUTATIVE else children))

    x = ("x",)
    if kind == "Erf":
        gate = op("Erf", op("Div", x, c(k["root"])))
    else:
        cube = op("Mul", op("Pow", x, c(3)), c(k["cube"]))
        gate = op("Tanh", op("Mul", op("Add", x, cube), c(k["scale"])))
    return op("Mul", op("Mul", x, c(k["half"])), op("Add", gate, c(k["one"])))


def _write(
    block: GeluBlock,
    k: dict[str, float],
    graph: ir.Graph,
    fresh_name: Callable[[str], str],
    mark: str,
) -> None:
    x, out = block.x, block.output
    old_constants = _old_constants(block, graph)

    def constant(number: float) -> ir.Value:
        """The block's own constant where it holds this value (a near miss then names
        it), else a new one."""
        typed = np.array(number, dtype=(x.dtype or ir.DataType.FLOAT).numpy())
        for value, array in old_constants:
            if array.dtype == typed.dtype and array.reshape(-1)[0] == typed:
                return value
        return new_initializer(graph, fresh_name(f"{RULE}_constant"), number, x.dtype)

    new: list[ir.Node] = []

    def node(op: str, *inputs: ir.Value) -> ir.Value:
        made = ir.Node("", op, list(inputs), name=fresh_name(f"{RULE}_{op}"))
        made.outputs[0].dtype, made.outputs[0].shape = out.dtype, out.shape
        made.outputs[0].name = fresh_name(f"{out.name or RULE}_{op.lower()}")
        made.metadata_props[mark], made.metadata_props[REPLACED_NODES] = RULE, "[]"
        new.append(made)
        return made.outputs[0]

    if block.kind == "Erf":
        gate = node("Erf", node("Div", x, constant(k["root"])))
    else:
        cube = node("Mul", node("Pow", x, constant(3)), constant(k["cube"]))
        inner = node("Add", x, cube)
        gate = node("Tanh", node("Mul", inner, constant(k["scale"])))
    one = node("Add", gate, constant(k["one"]))
    node("Mul", node("Mul", x, constant(k["half"])), one)
    new[-1].metadata_props[REPLACED_NODES] = json.dumps([n.name or n.op_type for n in block.nodes])
    new[-1].metadata_props[_OLD] = json.dumps(_old_block(block))
    new[-1].metadata_props[_WRITTEN] = json.dumps([n.name for n in new])
    graph.insert_before(block.nodes[0], new)
    take_place(out, new[-1].outputs[0])
    graph.remove(block.nodes[::-1], safe=True)


def _old_constants(block: GeluBlock, graph: ir.Graph) -> list[tuple[ir.Value, np.ndarray]]:
    inside = {id(n) for n in block.nodes}
    found = []
    for node in block.nodes:
        for value in node.inputs:
            if value is None or id(value.producer()) in inside:
                continue
            array = constant_array(value)
            if array is not None and array.size == 1 and value.name in graph.initializers:
                found.append((value, array))
    return found


def _old_block(block: GeluBlock) -> list[dict]:
    """The old nodes written out: op, name, output name, and each input as ``x``, the
    output of an earlier one, or a constant (value, dtype, shape, name)."""
    index = {id(n): i for i, n in enumerate(block.nodes)}
    entries = []
    for node in block.nodes:
        inputs: list[dict] = []
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if value is block.x:
                inputs.append({"x": True})
            elif producer is not None and id(producer) in index:
                inputs.append({"node": index[id(producer)]})
            else:
                array = constant_array(value)
                assert value is not None and array is not None  # the reading proved it
                inputs.append(
                    {
                        "value": array.reshape(-1)[0].item(),
                        "dtype": int(value.dtype or ir.DataType.FLOAT),
                        "shape": list(array.shape),
                        "name": value.name,
                    }
                )
        output = node.outputs[0].name
        entries.append({"op": node.op_type, "name": node.name, "output": output, "inputs": inputs})
    return entries


def undo_gelu_spellings(graph: ir.Graph, mark: str) -> int:
    """Rebuild the old block wherever the one written is still whole; how many."""
    by_name = {n.name: n for n in graph if n.name}
    undone = 0
    for node in list(graph):
        if node.metadata_props.get(mark) != RULE or _OLD not in node.metadata_props:
            continue
        written = [by_name.get(name) for name in json.loads(node.metadata_props[_WRITTEN])]
        if any(n is None or n.graph is not graph for n in written):
            continue  # a fusion took part of it
        old = json.loads(node.metadata_props[_OLD])
        _rebuild(graph, [n for n in written if n is not None], old)
        undone += 1
    return undone


def _rebuild(graph: ir.Graph, written: list[ir.Node], entries: list[dict]) -> None:
    out = written[-1].outputs[0]
    ids = {id(n) for n in written}
    x = next(
        v
        for n in written
        for v in n.inputs
        if v is not None and id(v.producer()) not in ids and constant_array(v) is None
    )
    old: list[ir.Node] = []
    for entry in entries:
        inputs = [_input(graph, spec, x, old) for spec in entry["inputs"]]
        node = ir.Node("", entry["op"], inputs, name=entry["name"])
        node.outputs[0].name = entry["output"]
        node.outputs[0].dtype, node.outputs[0].shape = out.dtype, out.shape
        old.append(node)
    graph.insert_before(written[0], old)
    take_place(out, old[-1].outputs[0])
    constants = [v for n in written for v in n.inputs if v is not None and v.producer() is None]
    graph.remove(written[::-1], safe=True)
    for value in constants:
        if value.name in graph.initializers and not value.uses() and not value.is_graph_input():
            graph.initializers.pop(value.name)  # the written block's own constants


def _input(graph: ir.Graph, spec: dict, x: ir.Value, old: list[ir.Node]) -> ir.Value:
    if "x" in spec:
        return x
    if "node" in spec:
        return old[spec["node"]].outputs[0]
    dtype, shape = ir.DataType(spec["dtype"]), tuple(spec["shape"])
    found = graph.initializers.get(spec["name"] or "")
    array = constant_array(found) if found is not None else None
    if array is not None and array.shape == shape and array.reshape(-1)[0] == spec["value"]:
        return found  # type: ignore[return-value]
    return new_initializer(graph, spec["name"] or f"{RULE}_constant", spec["value"], dtype, shape)
