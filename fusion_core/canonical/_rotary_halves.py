"""Rule ``rotary_halves``: a rotary embedding written on the two halves of each head
(gpt-oss's ``_apply_rotary_emb``) in the rotate-half spelling the rotary pattern reads.

gpt-oss splits each head ``x`` (``[B, N, S, 2h]``) in two, ``x1, x2 = chunk(x, 2, -1)``
(two Slices, or one Split), and rotates each pair ``(x1_i, x2_i)`` by an angle whose
cosine and sine ``c`` and ``s`` hold one entry per pair (``[.., S, h]``)::

    y = Concat(x1 * c - x2 * s, x2 * c + x1 * s, axis=-1)

Hugging Face's ``rotate_half`` spelling of the same rotation, with the angles repeated
over both halves, is what ``rotary_embedding.yaml`` matches::

    y = x * Concat(c, c) + Concat(-x2, x1) * Concat(s, s)

The first half is ``x1 * c + (-x2) * s``, the second ``x2 * c + x1 * s``: the same
products summed in the same way (negation is exact, ``a - b`` is ``a + (-b)``), so the
two are equal bit for bit. The halves become Slices of ``x`` (a Split's two outputs are
the same elements), which also keeps ``slice_before_transpose`` from reading them as a
fused projection's parts: ``x`` itself is read now.

``undo_rotary_halves`` writes the first spelling back where no fusion took the second.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import permutations

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, int64s, replace
from autofusion.fusion_core.sizes import known_dims, scalar

__all__ = ["last_axis_bounds", "rotary_halves", "undo_rotary_halves"]

RULE = "rotary_halves"
_SUM = "autofusion.rotary_halves"  # on the Add a rule wrote: the undo starts there
_ONNX = ("", "ai.onnx")
_BIG = 2**31 - 1  # a Slice end at least this large means "to the end"


def rotary_halves(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every rotation of two halves in the rotate-half spelling; how many."""
    done = 0
    for node in list(graph):
        if node.graph is not graph:
            continue  # removed by an earlier step of this sweep
        found = _halves_rotation(node)
        if found is None or node.outputs[0].is_graph_output():
            continue
        x, half, cos, sin, old = found
        new = _rotate_half(graph, fresh_name, mark, (x, half, cos, sin), node.outputs[0])
        replace(graph, node, new, mark, RULE)
        new[-1].metadata_props[_SUM] = "1"
        drop_unread(graph, old)
        done += 1
    return done


def undo_rotary_halves(graph: ir.Graph, mark: str) -> int:
    """Put the two-halves spelling back for every rotation this rule wrote that no
    fusion took (its Add and what only it reads still there); how many."""
    undone = 0
    for add in [
        n for n in graph if n.metadata_props.get(mark) == RULE and _SUM in n.metadata_props
    ]:
        parts = _written_parts(add, mark)
        if parts is None:
            continue
        (x_cos, rot_sin), (low, high, cos, sin) = parts
        out = add.outputs[0]
        nodes = [
            ir.Node("", "Mul", [low.outputs[0], cos]),
            ir.Node("", "Mul", [high.outputs[0], sin]),
            ir.Node("", "Mul", [high.outputs[0], cos]),
            ir.Node("", "Mul", [low.outputs[0], sin]),
        ]
        first = ir.Node("", "Sub", [nodes[0].outputs[0], nodes[1].outputs[0]])
        second = ir.Node("", "Add", [nodes[2].outputs[0], nodes[3].outputs[0]])
        joined = ir.Node("", "Concat", [first.outputs[0], second.outputs[0]], [_last_axis()])
        nodes = [*nodes[:2], first, *nodes[2:], second, joined]  # the order it was written in
        for node in nodes[:-1]:
            _like_half(node.outputs[0], low.outputs[0], out)
        joined.outputs[0].dtype, joined.outputs[0].shape = out.dtype, out.shape
        joined.outputs[0].name = f"{out.name}_halves"
        graph.insert_before(add, nodes)
        out.replace_all_uses_with(joined.outputs[0])
        graph.remove(add, safe=True)
        drop_unread(graph, [x_cos, rot_sin])
        undone += 1
    return undone


def _halves_rotation(node: ir.Node) -> tuple | None:
    """(x, h, c, s, the nodes it replaces) of ``Concat(x1 * c - x2 * s, x2 * c + x1 *
    s)`` with ``x1, x2`` the halves of ``x``'s last axis, or None."""
    if node.op_type != "Concat" or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    dims = known_dims(node.outputs[0])
    if dims is None or len(dims) != 4 or _axis(node, 4) != 3:
        return None
    first, second = (v.producer() if v is not None else None for v in node.inputs)
    if first is None or second is None or first.op_type != "Sub" or second.op_type != "Add":
        return None
    products = [_mul(v) for v in (*first.inputs, *second.inputs)]
    if any(p is None for p in products) or any(len(v.uses()) != 1 for v in node.inputs):
        return None
    plus_c, minus_s, sum_a, sum_b = products
    for (x1, c), (x2, s) in ((a, b) for a in permutations(plus_c) for b in permutations(minus_s)):
        wanted = {frozenset((id(x2), id(c))), frozenset((id(x1), id(s)))}
        if {frozenset(map(id, sum_a)), frozenset(map(id, sum_b))} != wanted or x1 is x2:
            continue
        halves = _halves_of(x1, x2)
        if halves is None or not _per_pair(c, halves[1]) or not _per_pair(s, halves[1]):
            continue
        old = [v.producer() for v in (*first.inputs, *second.inputs)]
        return (*halves, c, s, [first, second, *old])
    return None


def _mul(value: ir.Value | None) -> tuple[ir.Value, ir.Value] | None:
    """The two operands of the Mul computing ``value``, which only one reader reads."""
    producer = value.producer() if value is not None else None
    if producer is None or producer.op_type != "Mul" or producer.domain not in _ONNX:
        return None
    if len(value.uses()) != 1 or None in producer.inputs:  # type: ignore[union-attr]
        return None
    return producer.inputs[0], producer.inputs[1]  # type: ignore[return-value]


def _halves_of(first: ir.Value, second: ir.Value) -> tuple[ir.Value, int] | None:
    """(x, h) where ``first`` and ``second`` are ``x[..., :h]`` and ``x[..., h:]`` and
    ``x``'s last axis is ``2h``: two Slices of it, or the two outputs of one Split."""
    a, b = first.producer(), second.producer()
    if a is None or b is None or a.domain not in _ONNX or b.domain not in _ONNX:
        return None
    source = a.inputs[0] if a.inputs else None
    dims = known_dims(source)
    if source is None or dims is None or len(dims) != 4 or not isinstance(dims[3], int):
        return None
    size = dims[3]
    # heads of 2 features aside: Concat(c, c) of one angle is a repeat repeat_kv rewrites
    if size % 2 or size < 4 or not b.inputs or b.inputs[0] is not source:
        return None
    half = size // 2
    if a is b and a.op_type == "Split" and _axis(a, 4) == 3 and len(a.outputs) == 2:
        parts = [known_dims(v) for v in a.outputs]
        if a.outputs[0] is first and all(p is not None and p[3] == half for p in parts):
            return source, half
        return None
    slices = a.op_type == b.op_type == "Slice"
    if (
        slices
        and last_axis_bounds(a, size) == (0, half)
        and last_axis_bounds(b, size) == (half, size)
    ):
        return source, half
    return None


def last_axis_bounds(node: ir.Node, size: int) -> tuple[int, int] | None:
    """[start, end) of a Slice of the last axis with step 1, or None."""
    if len(node.inputs) < 4:
        return None
    start, end, axis = (scalar(v) for v in node.inputs[1:4])
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if start is None or end is None or axis not in (-1, 3) or step != 1:
        return None
    start, end = (v + size if v < 0 else v for v in (start, end))
    return max(start, 0), min(end if end < _BIG else size, size)


def _per_pair(angle: ir.Value, half: int) -> bool:
    """Whether ``angle`` holds one entry per pair (its last axis is ``h``) and broadcasts
    over the heads without raising their rank."""
    dims = known_dims(angle)
    return dims is not None and 1 <= len(dims) <= 4 and dims[-1] == half


def _axis(node: ir.Node, rank: int) -> int | None:
    attr = node.attributes.get("axis")
    axis = attr.value if attr is not None else 0
    return axis + rank if isinstance(axis, int) and axis < 0 else axis


def _last_axis() -> ir.Attr:
    return ir.AttrInt64("axis", -1)


def _rotate_half(
    graph: ir.Graph,
    fresh_name: Callable[[str], str],
    mark: str,
    found: tuple[ir.Value, int, ir.Value, ir.Value],
    old: ir.Value,
) -> list[ir.Node]:
    """``x * Concat(c, c) + Concat(-x2, x1) * Concat(s, s)``: the new nodes in order."""
    x, half, cos, sin = found
    axis = int64s(graph, fresh_name, [-1])
    bounds = [int64s(graph, fresh_name, [v]) for v in (0, half, 2 * half)]
    low = ir.Node("", "Slice", [x, bounds[0], bounds[1], axis], name=fresh_name("rotary_low"))
    high = ir.Node("", "Slice", [x, bounds[1], bounds[2], axis], name=fresh_name("rotary_high"))
    neg = ir.Node("", "Neg", [high.outputs[0]], name=fresh_name("rotary_neg"))
    rot = ir.Node(
        "",
        "Concat",
        [neg.outputs[0], low.outputs[0]],
        [_last_axis()],
        name=fresh_name("rotary_rot"),
    )
    new = [low, high, neg, rot]
    for node in new[:3]:
        _like_half(node.outputs[0], x, x)
    rot.outputs[0].dtype, rot.outputs[0].shape = x.dtype, x.shape
    angles = []
    for angle in (cos, sin):
        both = _repeated(angle, mark)
        if both is None:
            both = ir.Node(
                "", "Concat", [angle, angle], [_last_axis()], name=fresh_name("rotary_angle")
            )
            dims = list(angle.shape)  # type: ignore[arg-type]
            dims[-1] = 2 * half
            both.outputs[0].dtype, both.outputs[0].shape = angle.dtype, ir.Shape(dims)
            both.outputs[0].name = fresh_name(f"{angle.name}_both")
            new.append(both)
        angles.append(both.outputs[0])
    x_cos = ir.Node("", "Mul", [x, angles[0]], name=fresh_name("rotary_cos"))
    rot_sin = ir.Node("", "Mul", [rot.outputs[0], angles[1]], name=fresh_name("rotary_sin"))
    total = ir.Node("", "Add", [x_cos.outputs[0], rot_sin.outputs[0]], name=fresh_name("rotary"))
    for node in (x_cos, rot_sin, total):
        node.outputs[0].dtype, node.outputs[0].shape = old.dtype, old.shape
    return [*new, x_cos, rot_sin, total]


def _repeated(angle: ir.Value, mark: str) -> ir.Node | None:
    """The ``Concat(angle, angle)`` this rule wrote already (for another head), if any."""
    for use in angle.uses():
        node = use.node
        written = node.op_type == "Concat" and node.metadata_props.get(mark) == RULE
        if written and list(node.inputs) == [angle, angle]:
            return node
    return None


def _like_half(value: ir.Value, source: ir.Value, whole: ir.Value) -> None:
    """Type ``value`` as one half of ``whole``'s last axis (``source``'s element type)."""
    value.dtype = source.dtype
    dims = known_dims(whole)
    if dims is not None and isinstance(dims[-1], int):
        value.shape = ir.Shape([*whole.shape[:-1], dims[-1] // 2])  # type: ignore[index]


def _written_parts(add: ir.Node, mark: str) -> tuple | None:
    """((x * cos, rot * sin), (low, high, c, s)) of an Add this rule wrote, when it is
    still that and nothing else reads its steps; else None."""
    nodes = [v.producer() if v is not None else None for v in add.inputs]
    if len(nodes) != 2 or any(n is None or n.metadata_props.get(mark) != RULE for n in nodes):
        return None
    x_cos, rot_sin = nodes
    rot = rot_sin.inputs[0].producer() if rot_sin.inputs[0] is not None else None  # type: ignore[union-attr]
    neg = rot.inputs[0].producer() if rot is not None and rot.inputs[0] is not None else None
    if rot is None or neg is None or neg.op_type != "Neg" or rot.inputs[1] is None:
        return None
    low, high = rot.inputs[1].producer(), neg.inputs[0].producer()  # type: ignore[union-attr]
    angles = [v.producer() if v is not None else None for v in (x_cos.inputs[1], rot_sin.inputs[1])]  # type: ignore[union-attr]
    if low is None or high is None or any(a is None or a.op_type != "Concat" for a in angles):
        return None
    steps = (x_cos, rot_sin, rot, neg)
    if any(len(n.outputs[0].uses()) != 1 for n in steps):  # type: ignore[union-attr]
        return None
    cos, sin = (a.inputs[0] for a in angles)  # type: ignore[union-attr]
    return (x_cos, rot_sin), (low, high, cos, sin)
