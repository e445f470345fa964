"""Where a block of experts reads its tokens and where it ends (``_block.py``).

The **hidden states** the experts read are the router's input where the router is one
linear of them (``x @ W_r``). A router may compute its own features first (ZAYA: a
down_proj to a narrower width, a norm and an MLP before its logits): then the experts
read a value that input is computed from, the input of one of the router's linears with
another width, the nearest first (``hidden_states``).

The block's **output** is a value after the router that every path from the router's
results goes through (a dominator) shaped like the hidden states: their rank and width,
or the rank of the value they are a flattening of (``root``), where the experts' sum is
shaped back to [B, S, D] before what follows reads it (Inkling: the routed and the shared
experts' sums added as [B, S, D]). A value the router computes alone (a dense routing
matrix [tokens, experts], shaped like a router's own features as wide as there are
experts) is no such output (``_block.py``). Which of these the block computes, and with
which experts, the proof says (``_proof.py``), never the shapes alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = ["LAYOUT", "dominators", "hidden_states", "root", "shaped_like", "summands"]

# Ops that only move data: a value read through them is still the hidden states.
LAYOUT = frozenset({"Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze"})
_SCAN_LIMIT = 2000  # nodes scanned after the router for the block's output
_MOST_TERMS = 6  # terms of such an output tried beside shared experts (summands)
_FEATURE_WALK = 64  # nodes of a router's own features walked back (ZAYA's: about 30)
_MOST_HIDDEN = 3  # the router's input and the inputs of its linears of other widths
_LINEAR = frozenset({"MatMul", "Gemm"})


def root(hidden: ir.Value) -> ir.Value:
    """The earliest value ``hidden`` is a reshaping of (a norm's [batch, seq, hidden])."""
    value = hidden
    for _ in range(8):
        node = value.producer()
        if node is None or node.op_type not in LAYOUT or not node.inputs:
            return value
        value = node.inputs[0]
    return value


def _width(value: ir.Value) -> int | None:
    shape = value.shape
    if shape is None or len(shape) < 2 or not isinstance(shape[-1], int):
        return None
    return shape[-1]


def hidden_states(router_input: ir.Value) -> list[ir.Value]:
    """The values the experts may read as the hidden states, likeliest first: the
    router's input, then the data input of each linear by a constant that the router's
    input is computed from with a width not seen yet, in the order a walk back (breadth
    first, ``_FEATURE_WALK`` nodes at most) meets them."""
    found = [router_input]
    widths = {_width(router_input)}
    todo, seen = [router_input], set()
    while todo and len(seen) < _FEATURE_WALK and len(found) < _MOST_HIDDEN:
        node = todo.pop(0).producer()
        if node is None or id(node) in seen or node.op_type in ("Shape", "Size"):
            continue
        seen.add(id(node))
        data = [v for v in node.inputs if v is not None and constant_array(v) is None]
        linear = node.op_type in _LINEAR and len(node.inputs) > 1
        if linear and constant_array(node.inputs[1]) is not None:
            value = node.inputs[0]
            width = _width(value)
            if width is not None and width not in widths and value.dtype == router_input.dtype:
                widths.add(width)
                found.append(value)
        todo.extend(data)
    return found


def shaped_like(value: ir.Value, hidden: ir.Value, flattened: ir.Value) -> bool:
    """Whether ``value`` has the width of ``hidden`` and its rank, or the rank of the
    value it is a ``flattened`` reshaping of (with that width too)."""
    shape, width = value.shape, _width(hidden)
    if shape is None or width is None or not shape or shape[-1] != width:
        return False
    ranks = {len(hidden.shape)}
    if _width(flattened) == width:
        ranks.add(len(flattened.shape))
    return len(shape) in ranks


def _readers(value: ir.Value) -> set[int]:
    """The nodes in a graph that read ``value`` (a node an earlier pass took out of the
    graph may still be listed as a use)."""
    return {id(use.node) for use in value.uses() if use.node.graph is not None}


def dominators(
    graph: ir.Graph, router: list[ir.Node], hidden: tuple[ir.Value, ir.Value]
) -> Iterator[tuple[ir.Value, list[ir.Node]]]:
    """The values after ``router`` that all of the router's results flow through, shaped
    like the hidden states (``hidden``: them and their root, ``shaped_like``), in graph
    order; each with the nodes that read the router's results up to it. (The first may
    be the experts' outputs per token and choice, [tokens * k, hidden], before their
    sum: the proof tells them apart.)"""
    order = list(graph)
    members = {id(n) for n in router}
    # from the first router node: a reader of an early one may come before the last
    # (an exporter's order puts one round of a two-round router's nodes after the next)
    start = min(i for i, n in enumerate(order) if id(n) in members)
    pending: dict[int, tuple[ir.Value, set[int]]] = {}
    for node in router:
        for value in node.outputs:
            readers = _readers(value) - members
            if readers or value.is_graph_output():
                pending[id(value)] = (value, readers)
    downstream: list[ir.Node] = []
    for node in order[start + 1 : start + 1 + _SCAN_LIMIT]:
        # each value once: a node may read one twice (Mul(r, r), a squared ReLU)
        read = list({id(v): v for v in node.inputs if v is not None and id(v) in pending}.values())
        if not read or id(node) in members:
            continue
        downstream.append(node)
        for value in read:
            readers = pending[id(value)][1]
            readers.discard(id(node))
            if not readers and not value.is_graph_output():
                del pending[id(value)]
        for value in node.outputs:
            readers = _readers(value)
            if readers or value.is_graph_output():
                pending[id(value)] = (value, readers)
        if len(pending) == 1:
            ((value, _),) = pending.values()
            if shaped_like(value, *hidden):
                yield value, list(downstream)
        if not pending:
            return


def summands(
    output: ir.Value, hidden: tuple[ir.Value, ir.Value], downstream: list[ir.Node]
) -> list[ir.Value]:
    """The terms of ``output = a + b (+ c ...)`` computed from the router's results,
    shaped like the hidden states (``shaped_like``), outer first: the routed experts' sum
    beside shared experts weighted by gates the router computes too (Inkling), where the
    sum of all is no MoE."""
    made = {id(v) for n in downstream for v in n.outputs}
    found: list[ir.Value] = []
    todo = [output]
    while todo and len(found) < _MOST_TERMS:
        node = todo.pop(0).producer()
        if node is None or node.op_type != "Add":
            continue
        for value in node.inputs:
            if value is not None and id(value) in made and shaped_like(value, *hidden):
                found.append(value)
                todo.append(value)
    return found
