"""Rule ``cosine_heads``: an L2 normalization of each head's rows after the head
Transpose computed before it.

Swin-V2's cosine attention normalizes the query and key heads after their Transpose,
``F.normalize(q, dim=-1)``, which both torch exporters write as::

    x = Transpose(y, [0, 2, 1, 3]);  n = ReduceL2(x, axes=[-1], keepdims=1)
    q = Div(x, Expand(Clip(n, eps), Shape(x)))

(the norm also as ``Sqrt`` or ``Pow(., 0.5)`` of ``ReduceSum`` of ``Mul(x, x)`` or
``Pow(x, 2)``, or ``ReduceSumSquare(x)``; the clamp as ``Clip(n, eps)`` or ``Max(n, eps)``,
or none; the quotient as ``Mul(x, Reciprocal(.))``). Each row of the last axis is
normalized from its own values alone, and a Transpose that keeps the last axis last
moves whole rows, so::

    normalize(Transpose(y, p)) == Transpose(normalize(y), p)        p[-1] = rank - 1

with the same arithmetic on the same numbers: exact, bit for bit. An Expand whose target
is proven (``fusion_core.sizes``) to be the normalized value's own shape, or 1, changes
nothing the quotient's broadcast does not, and goes (with the Shape read only by it).
The normalization then sits between the head split and its Transpose, where
``head_split`` finds ops that act per head (as Qwen3's q/k norms) and the attention
pattern finds its head Transpose. Nothing is computed that the original did not, so
there is no undo (as for ``transpose_after_norm``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, take_place
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import ONE, SizeProof, axes_of, proven_equal

__all__ = ["RULE", "cosine_heads"]

RULE = "cosine_heads"
_ONNX = ("", "ai.onnx")
_CLAMPS = frozenset({"Clip", "Max"})
_SUMS = frozenset({"ReduceSum", "ReduceSumSquare"})


@dataclass(frozen=True)
class _Norm:
    """``out`` = ``x`` over (or times the Reciprocal of) its rows' clamped L2 norm:
    ``turn`` the Transpose that gives ``x``, ``chain`` the nodes from ``x`` to the divisor
    in graph order (an Expand included; a Shape of ``x`` it reads goes with it)."""

    out: ir.Node
    turn: ir.Node
    chain: tuple[ir.Node, ...]


def cosine_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Compute every L2 normalization of a transposed value's last axis before the
    Transpose; how many."""
    proof = SizeProof()
    done = 0
    for node in list(graph):
        if node.graph is not graph:
            continue  # taken out by an earlier move
        found = _normalized(node, proof)
        if found is not None:
            _move(graph, found, fresh_name, mark)
            done += 1
    return done


def _only(value: ir.Value | None, op_types: frozenset[str] | set[str]) -> ir.Node | None:
    node = value.producer() if value is not None else None
    ok = node is not None and node.op_type in op_types and node.domain in _ONNX
    return node if ok else None


def _normalized(out: ir.Node, proof: SizeProof) -> _Norm | None:
    """The normalization ``out`` ends, where it is one of a transposed value's rows."""
    if out.domain not in _ONNX or out.op_type not in ("Div", "Mul") or len(out.inputs) != 2:
        return None
    for side in (0, 1) if out.op_type == "Mul" else (0,):
        x, divisor = out.inputs[side], out.inputs[1 - side]
        turn = _only(x, {"Transpose"})
        if turn is None or x is None or x.shape is None or divisor is None:
            continue
        perm = list(attribute_value(turn, "perm", []) or [])
        if not perm or perm[-1] != len(perm) - 1:
            continue  # the rows would change
        chain = _divisor(divisor, x, out.op_type == "Mul", proof)
        if chain is not None and _read_inside(x, out, chain):
            return _Norm(out, turn, tuple(chain))
    return None


def _divisor(value: ir.Value, x: ir.Value, inverted: bool, proof: SizeProof) -> list | None:
    """The nodes computing ``value`` as ``[Reciprocal of] [Expand] [clamp] ||x||`` (first
    to last), else None."""
    chain: list[ir.Node] = []
    if inverted:
        node = _only(value, {"Reciprocal"})
        if node is None:
            return None
        chain.append(node)
        value = node.inputs[0]
    for _ in range(3):  # an Expand and a clamp, in either order
        node = _only(value, {"Expand", *_CLAMPS})
        if node is None:
            break
        if node.op_type == "Expand":
            if not _expand_kept(node, x, proof):
                return None
            value = node.inputs[0]
        else:
            value = _clamped(node)
            if value is None:
                return None
        chain.append(node)
    norm = _l2_of(value, x)
    return None if norm is None else [*norm, *reversed(chain)]


def _l2_of(value: ir.Value | None, x: ir.Value) -> list[ir.Node] | None:
    """The nodes of ``||x||`` over the last axis, kept (first to last), else None."""
    node = _only(value, {"ReduceL2"})
    if node is not None:
        return [node] if _last_axis_sum(node, x) else None
    root = _only(value, {"Sqrt", "Pow"})
    if root is None or (root.op_type == "Pow" and not _is_number(root.inputs[1], 0.5)):
        return None
    total = _only(root.inputs[0], _SUMS)
    if total is None:
        return None
    if total.op_type == "ReduceSumSquare":
        return [total, root] if _last_axis_sum(total, x) else None
    square = _only(total.inputs[0], {"Mul", "Pow"})
    if square is None or square.inputs[0] is not x:
        return None
    if square.op_type == "Mul" and square.inputs[1] is not x:
        return None
    if square.op_type == "Pow" and not _is_number(square.inputs[1], 2.0):
        return None
    return [square, total, root] if _last_axis_sum(total, x, square.outputs[0]) else None


def _last_axis_sum(node: ir.Node, x: ir.Value, data: ir.Value | None = None) -> bool:
    """Whether ``node`` reduces ``data`` (``x`` where not given) over its last axis only,
    keeping it."""
    rank = len(x.shape)  # type: ignore[arg-type]
    if node.inputs[0] is not (data if data is not None else x):
        return False
    axes = axes_of(node)
    return (
        axes is not None
        and len(axes) == 1
        and axes[0] % rank == rank - 1
        and attribute_value(node, "keepdims", 1) == 1
    )


def _is_number(value: ir.Value | None, number: float) -> bool:
    array = constant_array(value)
    return array is not None and array.size == 1 and float(array.reshape(-1)[0]) == number


def _clamped(node: ir.Node) -> ir.Value | None:
    """What a clamp by scalar constants clamps: ``Clip(n, lo[, hi])``, ``Max(n, eps)``
    either way round; None for any other clamp."""
    if node.op_type == "Max":
        if len(node.inputs) != 2:
            return None
        data = [v for v in node.inputs if constant_array(v) is None]
        bounds = [v for v in node.inputs if v not in data]
    else:
        data = node.inputs[:1]
        bounds = [v for v in node.inputs[1:] if v is not None and v.name != ""]
    if len(data) != 1 or data[0] is None:
        return None
    ok = all((a := constant_array(v)) is not None and a.size == 1 for v in bounds)
    return data[0] if ok else None


def _expand_kept(expand: ir.Node, x: ir.Value, proof: SizeProof) -> bool:
    """Whether the Expand's target is proven ``x``'s shape or 1 on each axis (aligned to
    the right), so that the quotient broadcasts to ``x``'s shape without it."""
    rank = len(x.shape)  # type: ignore[arg-type]
    entries = proof.entries(expand.inputs[1])
    if entries is None or len(entries) > rank:
        return False
    offset = rank - len(entries)
    return all(
        e == ONE or proven_equal(e, proof.size(x, offset + i)) is True
        for i, e in enumerate(entries)
    )


def _read_inside(x: ir.Value, out: ir.Node, chain: tuple[ir.Node, ...] | list) -> bool:
    """Whether nothing but the normalization reads ``x`` and its inner values: each
    chain value is read by the chain or ``out`` alone, ``x`` also by Shapes read only as
    the chain's Expand targets."""
    inside = {id(n) for n in chain} | {id(out)}
    for node in chain:
        value = node.outputs[0]
        if value.is_graph_output() or any(id(u.node) not in inside for u in value.uses()):
            return False
    if x.is_graph_output():
        return False
    for use in x.uses():
        if id(use.node) in inside:
            continue
        if use.node.op_type != "Shape" or not _targets_only(use.node.outputs[0], chain):
            return False
    return True


def _targets_only(shape: ir.Value, chain) -> bool:
    """Whether ``shape`` is read only as the target of one of ``chain``'s Expands."""
    expands = {id(n) for n in chain if n.op_type == "Expand"}
    uses = list(shape.uses())
    return (
        bool(uses)
        and not shape.is_graph_output()
        and all(id(u.node) in expands and u.idx == 1 for u in uses)
    )


def _move(graph: ir.Graph, norm: _Norm, fresh_name: Callable[[str], str], mark: str) -> None:
    """Write the normalization on the Transpose's input, the Transpose after it: it takes
    the old quotient's readers and name; what only the old one read goes."""
    x, y = norm.turn.outputs[0], norm.turn.inputs[0]
    perm = list(attribute_value(norm.turn, "perm", []))
    dims = list(y.shape) if y.shape is not None else [None] * len(perm)
    if y.shape is None:
        for axis, source in enumerate(perm):
            dims[source] = x.shape[axis]  # type: ignore[index]
    rows = [*dims[:-1], 1]
    mapped: dict[ir.Value, ir.Value] = {x: y}
    made: list[ir.Node] = []
    for node in [*norm.chain, norm.out]:
        if node.op_type == "Expand":  # the quotient broadcasts as it did
            mapped[node.outputs[0]] = mapped[node.inputs[0]]  # type: ignore[index]
            continue
        inputs = [mapped.get(v, v) if v is not None else None for v in node.inputs]
        attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        copy = ir.Node(node.domain, node.op_type, inputs, attributes, name=fresh_name(RULE))
        full = node is norm.out or (node.op_type in ("Mul", "Pow") and node.inputs[0] is x)
        copy.outputs[0].name = fresh_name(f"{RULE}_{node.op_type.lower()}")
        copy.outputs[0].dtype = node.outputs[0].dtype
        copy.outputs[0].shape = ir.Shape(dims if full else rows)
        mapped[node.outputs[0]] = copy.outputs[0]
        made.append(copy)
    turn = ir.Node(
        "",
        "Transpose",
        [made[-1].outputs[0]],
        [ir.AttrInt64s("perm", perm)],
        name=fresh_name(f"{RULE}_Transpose"),
    )
    turn.outputs[0].dtype, turn.outputs[0].shape = x.dtype, x.shape
    made.append(turn)
    for node in made:
        node.metadata_props[mark] = RULE
    graph.insert_before(norm.out, made)
    take_place(norm.out.outputs[0], turn.outputs[0])
    drop_unread(graph, [norm.out])
