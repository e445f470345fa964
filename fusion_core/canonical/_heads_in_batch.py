"""Rule ``heads_in_batch``: attention computed over heads folded into the batch (``[B * N,
S, H]``, ``bmm``: XGLM, BART-era and other older exports) is computed over ``[B, N, S,
H]``, the layout the attention patterns read.

Such graphs fold the heads into the batch before each product and unfold them after::

    merge(x) = Reshape(x, [B * N, S, H])       of x: [B, N, S, H]
    split(y) = Reshape(y, [B, N, S, L])        of y: [B * N, S, L]

Every op between a merge and a split that acts on each leading index alone (a batched
MatMul, a Softmax over the last axis) gives the same elements when applied to the
unmerged values, so::

    split(MatMul(merge(a), merge(b)))            ->  MatMul(a, b)
    split(MatMul(merge(a), Transpose(merge(b), [0, 2, 1])))
                                                 ->  MatMul(a, Transpose(b, [0, 1, 3, 2]))
    Softmax(merge(x), axis=-1)                   ->  merge(Softmax(x, axis=-1))

exactly. A merge is proven from the shapes: rank 4 to rank 3 with the last two
dimensions known and equal, so the first is the product of the two leading ones; a
split the other way round, to the very shape the product has unmerged.

Between the MatMul and the split, the scores may be scaled and a folded bias added
(BLOOM's ALiBi: ``baddbmm(alibi, Q, K^T, alpha=1 / sqrt(H))``, the bias ``[B * N, 1, L]``):
a scale by a scalar constant is the same after the split, and since a Reshape only
renumbers elements, ``split(s + c) = split(s) + unfold(c)`` for any ``c: [B * N or 1, s,
l]`` (``s, l`` broadcasting to ``S, L``, in either form alike) unfolded by the same
rule, ``Reshape(Unsqueeze(c, 1), [-1, N, 0, 0])``; so they
move after the split too (opset 13 on, where Unsqueeze takes its axes as an input). The
bias must be proven a fold (a Reshape of ``[B, N, ...]``, perhaps scaled): a leading size
merely inferred equal to the scores' may be 1 at run time. A scalar scale of either
operand of the product (DeBERTa divides its folded K^T) is the same scale of the unfolded
operand.

TorchScript also reads the folded product's shape (``Shape``) to build Reshape targets:
the reads that only built the split's own target go with it; any other whole-shape read
reads the unfolded product's shape folded back, ``[B * N, S, X]`` from ``[B, N, S, X]``.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import by_op_type, int64s, replace
from autofusion.fusion_core.canonical._shape_values import known_dims, proven_same
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import SizeProof

__all__ = ["RULE", "heads_unfolded"]

RULE = "heads_in_batch"
_ONNX = ("", "ai.onnx")


def heads_unfolded(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Unfold every batched Softmax of a merge, and every batched MatMul of merges that a
    split reads; how many. Each size a fold or an unfold needs is decided by
    ``proven_same``: the graph's proof first, the labels only where it cannot tell (an
    inference's auto-merge of ``B`` and ``N`` labels ``[N, B, S, H]`` folded as the
    ``[B, N, S, H]`` it is multiplied with)."""
    proof = SizeProof()  # one walk: the folds of every layer read the same sizes
    return by_op_type(
        graph,
        {
            "Softmax": lambda node: _softmax(graph, node, fresh_name, mark, proof),
            "Reshape": lambda node: _split_matmul(graph, node, fresh_name, mark, proof),
        },
    )


def _split_matmul(graph: ir.Graph, split: ir.Node, fresh_name, mark: str, proof) -> int:
    if split.outputs[0].is_graph_output() or split.inputs[0] is None:
        return 0
    want = known_dims(split.outputs[0])
    shape_reads = _shape_reads(graph, split)
    found = _scaled_scores(graph, split.inputs[0], want, {id(n) for n in shape_reads})
    if found is None:
        return 0
    inner, steps = found
    new = _matmul(inner, split.outputs[0], proof)
    if new is None or (steps and (want is None or not isinstance(want[1], int))):
        return 0
    scores = new[-1].outputs[0]
    a, b = new[-1].inputs
    if a is not None and b is not None and a.shape is not None and b.shape is not None:
        # [B, N, S, L] from the operands: the split's own shape may name L otherwise
        scores.shape = ir.Shape([*a.shape[:3], b.shape[3]])
    shape = scores.shape
    for step, other in reversed(steps):  # the scale and the bias, after the split
        if step.op_type == "Add":
            new += _unfolded(graph, other, want, fresh_name)  # type: ignore[arg-type]
            other = new[-1].outputs[0]
        new.append(ir.Node("", step.op_type, [scores, other]))
        scores = new[-1].outputs[0]
        scores.shape = shape
    _named(new, fresh_name)
    for node in new:
        node.outputs[0].dtype = split.outputs[0].dtype
    out = new[-1].outputs[0]
    out.dtype, out.shape = split.outputs[0].dtype, shape or split.outputs[0].shape
    merges = [v.producer() for v in inner.inputs if v is not None]
    replace(graph, split, new, mark, RULE)
    for read in shape_reads:  # gone with the split's target, or the folded shape again
        dead = _dead_from(read)
        if dead:
            graph.remove(dead, safe=True)
        else:
            _fold_shape(graph, read, out, fresh_name, mark)
    graph.remove([*(s for s, _ in steps), inner], safe=True)
    _drop_unread(graph, merges)
    return 1


_SLICE_INPUTS = 10  # opset from which Slice takes its bounds as inputs
_PLUMBING_LIMIT = 24  # nodes a shape read feeds, at most, to be dropped with the split


def _shape_reads(graph: ir.Graph, split: ir.Node) -> list[ir.Node]:
    """The whole-shape ``Shape`` reads of the value the split unfolds, besides the split
    (TorchScript builds Reshape targets from them), from opset 10 on."""
    value = split.inputs[0]
    if graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0)) < _SLICE_INPUTS:
        return []
    return [
        u.node
        for u in value.uses()  # type: ignore[union-attr]
        if u.node is not split
        and u.node.op_type == "Shape"
        and u.node.domain in _ONNX
        and not u.node.attributes  # no start or end: the whole shape
        and not u.node.outputs[0].is_graph_output()
    ]


def _dead_from(read: ir.Node) -> list[ir.Node]:
    """``read`` and what it feeds, readers first, where all of it feeds nothing else (the
    target of the split just replaced); empty where any of it is still read."""
    found: dict[int, ir.Node] = {}
    pending = [read]
    while pending:
        node = pending.pop()
        if id(node) in found:
            continue
        if len(found) == _PLUMBING_LIMIT:
            return []
        found[id(node)] = node
        for out in node.outputs:
            if out.is_graph_output():
                return []
            pending += [u.node for u in out.uses()]
    order = {id(n): i for i, n in enumerate(read.graph or [])}
    return sorted(found.values(), key=lambda n: -order.get(id(n), 0))


def _fold_shape(graph: ir.Graph, read: ir.Node, unfolded: ir.Value, fresh_name, mark) -> None:
    """``Shape(fold(y))`` as ``[B * N, S, X]`` from ``Shape(y)`` of ``y: [B, N, S, X]``."""
    shape = ir.Node("", "Shape", [unfolded])
    parts = []
    for start, end in ((0, 1), (1, 2), (2, 4)):
        bounds = [int64s(graph, fresh_name, [start]), int64s(graph, fresh_name, [end])]
        parts.append(ir.Node("", "Slice", [shape.outputs[0], *bounds]))
    rows = ir.Node("", "Mul", [parts[0].outputs[0], parts[1].outputs[0]])
    folded = ir.Node(
        "", "Concat", [rows.outputs[0], parts[2].outputs[0]], [ir.AttrInt64("axis", 0)]
    )
    nodes = [shape, *parts, rows, folded]
    _named(nodes, fresh_name)
    for node in nodes:
        node.outputs[0].dtype = ir.DataType.INT64
    folded.outputs[0].shape = ir.Shape([3])
    replace(graph, read, nodes, mark, RULE)


_UNSQUEEZE_AXES_INPUT = 13  # opset from which Unsqueeze reads its axes as an input


def _scaled_scores(graph: ir.Graph, value: ir.Value, want: list | None, shape_reads: set[int]):
    """(the MatMul, the steps from it to ``value`` outermost first: (node, its other
    operand)) where ``value`` is the batched MatMul, scaled by scalar constants and with
    folded biases added, each read once (``value`` also by its ``shape_reads``); None
    otherwise."""
    steps = []
    node = value.producer()
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))

    def read_once(value: ir.Value) -> bool:
        readers = [u.node for u in value.uses() if id(u.node) not in shape_reads]
        return len(readers) == 1 and not value.is_graph_output()

    while node is not None and node.op_type in ("Mul", "Div", "Add") and len(steps) < 4:
        if node.domain not in _ONNX or not read_once(value):
            return None
        step = _step(node, opset, want)
        if step is None:
            return None
        steps.append((node, step[1]))
        value = step[0]
        node = value.producer()
    if node is None or node.op_type != "MatMul" or node.domain not in _ONNX:
        return None
    if not read_once(value) or (steps and shape_reads):  # shape reads of the top value only
        return None
    return node, steps


def _step(node: ir.Node, opset: int, want: list | None) -> tuple[ir.Value, ir.Value] | None:
    """(the scores operand, the other) of a scale by a scalar constant or an Add of a
    ``[B * N or 1, 1 or S, L]`` bias to ``[B * N, S, L]`` scores (``want``: the unfolded
    ``[B, N, S, L]``); None otherwise."""
    out = known_dims(node.outputs[0])
    if out is None or len(out) != 3:
        return None
    orders = [(0, 1)] if node.op_type == "Div" else [(0, 1), (1, 0)]
    for mine, other in orders:
        scores, operand = node.inputs[mine], node.inputs[other]
        if scores is None or operand is None or known_dims(scores) != out:
            continue
        if node.op_type != "Add":
            array = constant_array(operand)
            if array is not None and array.size == 1:
                return scores, operand
        elif opset >= _UNSQUEEZE_AXES_INPUT and _foldable(operand, out, want):
            return scores, operand
    return None


def _foldable(bias: ir.Value, scores: list, want: list | None) -> bool:
    """The bias is one row for every batch and head (a leading 1), or the fold of a
    ``[B, N, ...]`` value by a Reshape: then its rows are the scores' rows. (A leading
    size merely inferred equal to the scores' may be 1 at run time, where the Add
    broadcasts and an unfold to N heads would not.) Its trailing sizes may be any: the
    unfold keeps them, so the Add broadcasts them as before (BLOOM's decode step reads
    ALiBi's key length from the mask, a symbol other than the scores' ``past + seq``)."""
    dims = known_dims(bias)
    if dims is None or len(dims) != 3 or want is None or dims[0] is None:
        return False
    if dims[0] == 1:
        return True
    fold = bias.producer()
    for _ in range(3):  # through a scale by a scalar (TorchScript's baddbmm beta) or a Cast
        if fold is None or fold.op_type not in ("Mul", "Div", "Cast") or not fold.inputs:
            break
        if fold.op_type != "Cast" and not _scalar(fold.inputs[1]):
            break
        fold = fold.inputs[0].producer() if fold.inputs[0] is not None else None
    source = fold.inputs[0] if fold is not None and _is_reshape(fold) else None
    leading = known_dims(source)
    return dims[0] == scores[0] and leading is not None and leading[:2] == want[:2]


def _scalar(value: ir.Value | None) -> bool:
    array = constant_array(value)
    return array is not None and array.size == 1


def _unfolded(graph: ir.Graph, bias: ir.Value, want: list, fresh_name) -> list[ir.Node]:
    """``bias: [B * N or 1, s, l]`` as ``[B or 1, N or 1, s, l]``, folded as the scores
    (``want``: their ``[B, N, S, L]``)."""
    dims = known_dims(bias)
    assert dims is not None
    unsqueeze = ir.Node("", "Unsqueeze", [bias, int64s(graph, fresh_name, [1])])
    unsqueeze.outputs[0].shape = ir.Shape([bias.shape[0], 1, *bias.shape[1:]])  # type: ignore[index]
    if dims[0] == 1:  # the same for every batch and head: a leading 1 more
        return [unsqueeze]
    target = int64s(graph, fresh_name, [-1, want[1], 0, 0])
    reshape = ir.Node("", "Reshape", [unsqueeze.outputs[0], target])
    reshape.outputs[0].shape = ir.Shape([want[0], want[1], *bias.shape[1:]])  # type: ignore[index]
    return [unsqueeze, reshape]


def _softmax(graph: ir.Graph, node: ir.Node, fresh_name, mark: str, proof) -> int:
    """``Softmax(Reshape(x, t), -1)`` of a merge is ``Reshape(Softmax(x, -1), t)``."""
    x = _unmerged(node.inputs[0], proof)
    if x is None or attribute_value(node, "axis", -1) not in (-1, 2):
        return 0
    if node.outputs[0].is_graph_output():
        return 0
    merge = node.inputs[0].producer()  # type: ignore[union-attr]
    softmax = ir.Node("", "Softmax", [x], [ir.AttrInt64("axis", -1)])
    again = ir.Node("", "Reshape", [softmax.outputs[0], merge.inputs[1]])  # type: ignore[union-attr]
    softmax.outputs[0].dtype, softmax.outputs[0].shape = x.dtype, x.shape
    again.outputs[0].dtype, again.outputs[0].shape = node.outputs[0].dtype, node.outputs[0].shape
    _named([softmax, again], fresh_name)
    replace(graph, node, [softmax, again], mark, RULE)
    _drop_unread(graph, [merge])
    return 1


def _named(nodes: list[ir.Node], fresh_name) -> None:
    for node in nodes:
        node.name = fresh_name(f"{RULE}_{node.op_type}")
        node.outputs[0].name = fresh_name(f"{RULE}_{node.op_type.lower()}")


def _matmul(node: ir.Node, split: ir.Value, proof: SizeProof) -> list[ir.Node] | None:
    """The unfolded product (``[B, N, S, L]``) of the folded ``node`` ``split`` unfolds."""
    (left, left_scale), (right, right_scale) = (_scaled(v) for v in node.inputs[:2])
    a, b = _unmerged(left, proof), _unmerged(right, proof)
    swapped = None
    if b is None:  # K^T: Transpose(merge(k), [0, 2, 1])
        transpose = right.producer() if right is not None else None
        if (
            transpose is not None
            and transpose.op_type == "Transpose"
            and list(attribute_value(transpose, "perm", []) or []) == [0, 2, 1]
        ):
            swapped = _unmerged(transpose.inputs[0], proof)
    if a is None or (b is None and swapped is None):
        return None
    other = b if b is not None else swapped
    da, db, want = known_dims(a), known_dims(other), known_dims(split)
    if da is None or db is None or None in da or None in db:
        return None  # unknown leading dimensions prove no fold (nor which unfold)
    if not proven_same(proof, ((a, 0), (other, 0)), ((a, 1), (other, 1))):
        return None
    # The split must give [B, N, S, L]: its first three dimensions proven, the last then
    # follows from the element count (a Reshape keeps it), whatever symbol names it.
    kept = (((split, i), (a, i)) for i in range(3))
    if want is None or len(want) != 4 or not proven_same(proof, *kept):
        return None
    nodes = []
    if swapped is not None:
        turn = ir.Node("", "Transpose", [swapped], [ir.AttrInt64s("perm", [0, 1, 3, 2])])
        turn.outputs[0].dtype = swapped.dtype
        turn.outputs[0].shape = ir.Shape([swapped.shape[i] for i in (0, 1, 3, 2)])  # type: ignore[index]
        nodes.append(turn)
        b = turn.outputs[0]
    a, b = _scale_again(a, left_scale, nodes), _scale_again(b, right_scale, nodes)  # type: ignore[arg-type]
    nodes.append(ir.Node("", "MatMul", [a, b]))
    return nodes


def _scaled(value: ir.Value | None) -> tuple[ir.Value | None, ir.Node | None]:
    """(what a Mul or Div by a scalar constant scales, that node) for ``value`` read
    only by the product (DeBERTa scales its folded K^T), else (``value``, None)."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type not in ("Mul", "Div") or node.domain not in _ONNX:
        return value, None
    if len(value.uses()) != 1 or value.is_graph_output():  # type: ignore[union-attr]
        return value, None
    for mine, other in [(0, 1)] if node.op_type == "Div" else [(0, 1), (1, 0)]:
        factor = constant_array(node.inputs[other])
        if factor is not None and factor.size == 1:
            return node.inputs[mine], node
    return value, None


def _scale_again(operand: ir.Value, scale: ir.Node | None, nodes: list[ir.Node]) -> ir.Value:
    """``operand`` (unfolded) scaled as ``scale`` scaled its fold: the same op by the same
    scalar, elementwise, so the same values."""
    if scale is None:
        return operand
    factor = next(v for v in scale.inputs if constant_array(v) is not None)
    again = ir.Node("", scale.op_type, [operand, factor])
    again.outputs[0].dtype, again.outputs[0].shape = operand.dtype, operand.shape
    nodes.append(again)
    return again.outputs[0]


def _unmerged(value: ir.Value | None, proof: SizeProof) -> ir.Value | None:
    """``x`` where ``value = Reshape(x, [B * N, S, H])`` of a ``[B, N, S, H]`` x (the
    last two dimensions known and kept, ``proven_same``), else None."""
    merge = value.producer() if value is not None else None
    if merge is None or not _is_reshape(merge) or merge.inputs[0] is None:
        return None
    source = merge.inputs[0]
    before, after = known_dims(source), known_dims(value)
    if before is None or after is None or len(before) != 4 or len(after) != 3:
        return None
    kept = ((value, 1), (source, 2)), ((value, 2), (source, 3))
    if None in before[2:] or not proven_same(proof, *kept):
        return None
    return source


def _is_reshape(node: ir.Node) -> bool:
    return node.op_type == "Reshape" and node.domain in _ONNX


def _drop_unread(graph: ir.Graph, nodes: list[ir.Node | None]) -> None:
    """Remove the merges (and a K^T's Transpose of one, and a scale of either) the rewrite
    left unread."""
    pending = [n for n in nodes if n is not None]
    while pending:
        node = pending.pop()
        if node.graph is not graph or node.op_type not in ("Reshape", "Transpose", "Mul", "Div"):
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        source = node.inputs[0].producer() if node.inputs[0] is not None else None
        graph.remove(node, safe=True)
        if source is not None:
            pending.append(source)
