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
(BLOOM's ALiBi, WavLM's gated position bias): they move after the split, unfolded
(``_folded_scores.py``). A scalar scale of either
operand of the product (DeBERTa divides its folded K^T) is the same scale of the unfolded
operand.

Where no split reads the folded scores (WavLM: F.multi_head_attention_forward's bmm path,
its heads folded from a sequence-first layout, ``sequence_first_fold``), the Softmax
reads them: ``Softmax(z, -1)`` is ``merge(Softmax(unfold(z), -1))``, the merge's target
``[-1, S, L]`` read from the unfolded probabilities' own shape, so the product of the
probabilities and the values is a MatMul of merges its split unfolds.

TorchScript also reads the folded product's shape (``Shape``) to build Reshape targets:
the reads that only built the split's own target go with it; any other whole-shape read
reads the unfolded product's shape folded back, ``[B * N, S, X]`` from ``[B, N, S, X]``.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import by_op_type, int64s, replace
from autofusion.fusion_core.canonical._folded_scores import Step, scaled_scores, unfolded_bias
from autofusion.fusion_core.canonical._folded_shape_reads import dead_from, fold_shape, shape_reads
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import SizeProof, declared, known_dims, proven_equal, proven_same

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
    reads = shape_reads(graph, split)
    found = scaled_scores(graph, split.inputs[0], {id(n) for n in reads}, proof)
    if found is None:
        return 0
    inner, steps = found
    new = _unfolded(graph, inner, steps, split.outputs[0], fresh_name, proof)
    if new is None:
        return 0
    out = new[-1].outputs[0]
    out.dtype, out.shape = split.outputs[0].dtype, out.shape or split.outputs[0].shape
    merges = [v.producer() for v in inner.inputs if v is not None]
    replace(graph, split, new, mark, RULE)
    for read in reads:  # gone with the split's target, or the folded shape again
        dead = dead_from(read)
        if dead:
            graph.remove(dead, safe=True)
        else:
            fold_shape(graph, read, out, fresh_name, mark, RULE)
    graph.remove([*(s for s, _ in steps), inner], safe=True)
    _drop_unread(graph, merges)
    return 1


def _unfolded(
    graph: ir.Graph, inner: ir.Node, steps: list[Step], split: ir.Value | None, fresh_name, proof
) -> list[ir.Node] | None:
    """The nodes computing the folded ``inner`` MatMul and its ``steps`` over ``[B, N, S,
    L]`` (the last node's output), named and typed; None where the operands are no
    proven folds (or ``split`` unfolds the product otherwise)."""
    new = _matmul(inner, split, proof)
    if new is None:
        return None
    scores = new[-1].outputs[0]
    a, b = new[-1].inputs
    heads = known_dims(a)
    if steps and (heads is None or not isinstance(heads[1], int)):
        return None  # the bias unfolds to N heads: a number
    if a is not None and b is not None and a.shape is not None and b.shape is not None:
        # [B, N, S, L] from the operands: the split's own shape may name L otherwise
        scores.shape = ir.Shape([*a.shape[:3], b.shape[3]])
    shape = scores.shape
    for step, other in reversed(steps):  # the scale and the bias, after the split
        if step.op_type == "Add":
            new += unfolded_bias(graph, other, heads, fresh_name, proof)  # type: ignore[arg-type]
            other = new[-1].outputs[0]
        new.append(ir.Node("", step.op_type, [scores, other]))
        scores = new[-1].outputs[0]
        scores.shape = shape
    _named(new, fresh_name)
    for node in new:
        node.outputs[0].dtype = inner.outputs[0].dtype
    return new


def _softmax(graph: ir.Graph, node: ir.Node, fresh_name, mark: str, proof) -> int:
    """``Softmax(Reshape(x, t), -1)`` of a merge is ``Reshape(Softmax(x, -1), t)``."""
    if attribute_value(node, "axis", -1) not in (-1, 2) or node.outputs[0].is_graph_output():
        return 0
    x = _unmerged(node.inputs[0], proof)
    if x is None:
        return _softmax_of_scores(graph, node, fresh_name, mark, proof)
    merge = node.inputs[0].producer()  # type: ignore[union-attr]
    softmax = ir.Node("", "Softmax", [x], [ir.AttrInt64("axis", -1)])
    again = ir.Node("", "Reshape", [softmax.outputs[0], merge.inputs[1]])  # type: ignore[union-attr]
    softmax.outputs[0].dtype, softmax.outputs[0].shape = x.dtype, x.shape
    again.outputs[0].dtype, again.outputs[0].shape = node.outputs[0].dtype, node.outputs[0].shape
    _named([softmax, again], fresh_name)
    replace(graph, node, [softmax, again], mark, RULE)
    _drop_unread(graph, [merge])
    return 1


def _softmax_of_scores(graph: ir.Graph, node: ir.Node, fresh_name, mark: str, proof) -> int:
    """``Softmax(z, -1)`` of folded scores ``z`` no split reads, whose probabilities a
    MatMul reads for a split (the context unfolded), is ``Reshape(Softmax(unfold(z), -1),
    Concat([-1], Shape(.., start=2)))``: the merge of the per-head probabilities, its
    ``S, L`` their own (proven by ``fusion_core.sizes``), its rows ``B * N`` by the
    element count."""
    if not _read_for_a_split(node.outputs[0]) or node.inputs[0] is None:
        return 0
    found = scaled_scores(graph, node.inputs[0], set(), proof)
    new = _unfolded(graph, *found, None, fresh_name, proof) if found is not None else None
    if found is None or new is None:
        return 0
    scores = new[-1].outputs[0]
    softmax = ir.Node("", "Softmax", [scores], [ir.AttrInt64("axis", -1)])
    shape = ir.Node("", "Shape", [softmax.outputs[0]], [ir.AttrInt64("start", 2)])
    target = ir.Node(
        "", "Concat", [int64s(graph, fresh_name, [-1]), shape.outputs[0]], [ir.AttrInt64("axis", 0)]
    )
    again = ir.Node("", "Reshape", [softmax.outputs[0], target.outputs[0]])
    _named([softmax, shape, target, again], fresh_name)
    softmax.outputs[0].dtype, softmax.outputs[0].shape = scores.dtype, scores.shape
    for index in (shape, target):
        index.outputs[0].dtype, index.outputs[0].shape = (
            ir.DataType.INT64,
            ir.Shape([2 + (index is target)]),
        )
    again.outputs[0].dtype, again.outputs[0].shape = node.outputs[0].dtype, node.outputs[0].shape
    inner, steps = found
    merges = [v.producer() for v in inner.inputs if v is not None]
    replace(graph, node, [*new, softmax, shape, target, again], mark, RULE)
    graph.remove([*(s for s, _ in steps), inner], safe=True)
    _drop_unread(graph, merges)
    return 1


def _read_for_a_split(probs: ir.Value) -> bool:
    """Whether ``probs`` is read by one MatMul alone, whose product a Reshape to rank 4
    reads: the unfold ``heads_in_batch`` then reads (not worth it otherwise)."""
    uses = list(probs.uses())
    if len(uses) != 1 or uses[0].node.op_type != "MatMul" or probs.is_graph_output():
        return False
    product = uses[0].node.outputs[0]
    return any(_is_reshape(u.node) and _rank(u.node.outputs[0]) == 4 for u in product.uses())


def _rank(value: ir.Value) -> int | None:
    return len(value.shape) if value.shape is not None else None


def _named(nodes: list[ir.Node], fresh_name) -> None:
    for node in nodes:
        node.name = fresh_name(f"{RULE}_{node.op_type}")
        node.outputs[0].name = fresh_name(f"{RULE}_{node.op_type.lower()}")


def _matmul(node: ir.Node, split: ir.Value | None, proof: SizeProof) -> list[ir.Node] | None:
    """The unfolded product (``[B, N, S, L]``) of the folded ``node`` ``split`` unfolds
    (None: its operands alone decide)."""
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
    if split is not None and (want is None or len(want) != 4 or not proven_same(proof, *kept)):
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
    last two dimensions known and kept, ``proven_same``; no label of ``x`` one the graph
    proves otherwise, ``_label_proven_other``), else None.

    The merge's target is computed, so onnxruntime's inference stops there and a lying
    label of ``x`` reaches nothing; read unfolded, ``x``'s labels become the new nodes'
    (Transpose, MatMul, Softmax), and onnxruntime plans its buffers by them: a ``k``
    ``[B, N, S, H]`` labelled ``[B, N, S, S]`` gave its buffer (rows of ``H``) to the
    ``[B, N, S, S]`` scores, and the model stopped at ``H != S``."""
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
    if merge.graph is None or _label_proven_other(proof, source, merge.graph):
        return None
    return source


def _label_proven_other(proof: SizeProof, x: ir.Value, graph: ir.Graph) -> bool:
    """Whether the graph proves a size of ``x`` other than its label: a number, or a
    symbol a graph input declares (``proven_equal`` False: two declared symbols are two
    sizes). A name an inference made up (``unk__0``, ``2*batch``) claims nothing the
    proof can test."""
    symbols = {
        dim.value
        for value in graph.inputs
        for dim in (value.shape or [])
        if isinstance(dim, ir.SymbolicDim) and dim.value
    }
    for axis, dim in enumerate(known_dims(x) or []):
        if dim is None or (isinstance(dim, str) and dim not in symbols):
            continue
        label = declared(dim if isinstance(dim, int) else ir.SymbolicDim(dim), x.name or "")
        if proven_equal(proof.size(x, axis), label) is False:
            return True
    return False


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
