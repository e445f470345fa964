"""Rule ``rotary_sign``: a rotation by minus the angle written with ``rotate_half``'s
halves swapped, in the sign the rotary pattern reads.

nanochat (and anyone who turns the other way) rotates each head ``x`` (halves ``x1``,
``x2``) with ``Concat(x2, -x1)``, the negative of Hugging Face's ``rotate_half``::

    y = x * cos + Concat(x2, -x1) * Unsqueeze(t, a)        (sine t)

which is ``x * cos + Concat(-x2, x1) * Unsqueeze(-t, a)``: the rotate-half spelling
``rotary_embedding.yaml`` matches, turning by the angle whose sine is ``-t``. Negation is
exact, so both compute the same bits. The Neg moves onto the table before its Unsqueeze,
where the rotary rewriter reads the cache (an elementwise step of the angle, as a Cast
is). No undo: the graph computes the same with one Neg on each side, where no fusion
takes it, and a table's Neg is cheaper than a head's.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import replace
from autofusion.fusion_core.canonical._rotary_halves import last_axis_bounds
from autofusion.fusion_core.sizes import known_dims

__all__ = ["rotary_signs"]

RULE = "rotary_sign"
_ONNX = ("", "ai.onnx")


def rotary_signs(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every ``Concat(x2, -x1) * Unsqueeze(t)`` as ``Concat(-x2, x1) *
    Unsqueeze(-t)``; how many."""
    done = 0
    negated: dict[int, ir.Value] = {}  # id of a sine read -> Unsqueeze(-t), one per sine
    for node in list(graph):
        if node.graph is not graph:
            continue
        found = _swapped_halves(node)
        if found is None:
            continue
        high, neg, low, muls = found
        flipped = ir.Node("", "Neg", [high], name=fresh_name("rotary_sign_neg"))
        _like(flipped.outputs[0], high, fresh_name)
        concat = ir.Node(
            "", "Concat", [flipped.outputs[0], low], node.attributes.values(), name=node.name
        )
        _like(concat.outputs[0], node.outputs[0], fresh_name)
        replace(graph, node, [flipped, concat], mark, RULE)
        for mul in muls:
            _negate_sine(graph, mul, concat.outputs[0], (fresh_name, mark), negated)
        if not neg.outputs[0].uses():
            graph.remove(neg, safe=True)
        done += 1
    return done


def _swapped_halves(node: ir.Node) -> tuple | None:
    """(x2, the Neg, x1, the Muls reading it) of ``Concat(x2, Neg(x1))`` on the last axis
    of 4-D heads, ``x1, x2`` the halves of one value, every reader a Mul by an Unsqueeze."""
    if node.op_type != "Concat" or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    out = node.outputs[0]
    dims = known_dims(out)
    if dims is None or len(dims) != 4 or not isinstance(dims[3], int) or out.is_graph_output():
        return None
    axis = node.attributes.get("axis")
    if axis is None or axis.value not in (-1, 3):
        return None
    high, negated = node.inputs
    neg = negated.producer() if negated is not None else None
    if neg is None or neg.op_type != "Neg" or len(negated.uses()) != 1 or high is None:
        return None
    low = neg.inputs[0]
    if low is None or not _halves(low, high, dims[3]):
        return None
    muls = [use.node for use in out.uses()]
    if not muls or any(not _mul_by_unsqueeze(mul, out) for mul in muls):
        return None
    return high, neg, low, muls


def _halves(low: ir.Value, high: ir.Value, size: int) -> bool:
    """Whether ``low`` and ``high`` are the Slices ``x[..., :h]`` and ``x[..., h:]``."""
    a, b = low.producer(), high.producer()
    if a is None or b is None or a.op_type != "Slice" or b.op_type != "Slice" or size % 2:
        return False
    if a.inputs[0] is None or a.inputs[0] is not b.inputs[0]:
        return False
    half = size // 2
    return last_axis_bounds(a, size) == (0, half) and last_axis_bounds(b, size) == (half, size)


def _mul_by_unsqueeze(mul: ir.Node, rotated: ir.Value) -> bool:
    if mul.op_type != "Mul" or mul.domain not in _ONNX or len(mul.inputs) != 2:
        return False
    other = mul.inputs[1] if mul.inputs[0] is rotated else mul.inputs[0]
    producer = other.producer() if other is not None else None
    return producer is not None and producer.op_type == "Unsqueeze" and other is not rotated


def _negate_sine(
    graph: ir.Graph, mul: ir.Node, rotated: ir.Value, naming: tuple, negated: dict
) -> None:
    """``mul`` reads ``rotated`` and ``Unsqueeze(-t)`` where it read ``Unsqueeze(t)``
    (written once per sine: q and k share theirs)."""
    fresh_name, mark = naming
    index = 1 if mul.inputs[0] is rotated else 0
    sine = mul.inputs[index]
    if id(sine) in negated:
        mul.replace_input_with(index, negated[id(sine)])
        return
    unsqueeze = sine.producer()  # type: ignore[union-attr]
    table = unsqueeze.inputs[0]  # type: ignore[union-attr]
    neg = ir.Node("", "Neg", [table], name=fresh_name("rotary_sign_sine"))
    _like(neg.outputs[0], table, fresh_name)
    again = ir.Node(
        "",
        "Unsqueeze",
        [neg.outputs[0], *unsqueeze.inputs[1:]],  # type: ignore[union-attr]
        unsqueeze.attributes.values(),  # type: ignore[union-attr]
        name=fresh_name("rotary_sign_unsqueeze"),
    )
    _like(again.outputs[0], sine, fresh_name)  # type: ignore[arg-type]
    for node in (neg, again):
        node.metadata_props[mark] = RULE
    graph.insert_before(mul, [neg, again])
    mul.replace_input_with(index, again.outputs[0])
    negated[id(sine)] = again.outputs[0]


def _like(value: ir.Value, source: ir.Value | None, fresh_name: Callable[[str], str]) -> None:
    if source is not None:
        value.dtype, value.shape = source.dtype, source.shape
        value.name = fresh_name(f"{source.name or 'rotary'}_sign")
