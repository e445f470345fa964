"""Rule ``window_mask``: a mask added to the scores on a view of their windows is added
to the scores themselves, tiled over the batch.

Swin-V2's shifted windows give each of the ``W`` windows of an image its own mask ``m``
(``[W, S, S]``), which it adds on a 5-D view of the scores ``s`` (``[B * W, N, S, L]``,
the windows of each image in the batch axis) and views back::

    Reshape(Add(Reshape(s, [B, W, N, S, L]), m5), [B * W, N, S, L])      m5: [1, W, *]

(transformers adds it twice: one Add per mask, in order). Row ``b * W + w`` of the
batch axis is window ``w`` of image ``b``, so each element receives the same mask
element in::

    Add(s, Tile(m4, [B, 1, 1, 1]))           m4 = m5 without its leading 1: [W, *]

the same sum of the same numbers, in the same order: exact, bit for bit. ``B`` is the
scores' rows over ``m4``'s, read from shapes at run time: the rows of a value above the
scores proven as long (the query's ``[B * W, S, C]`` projection; a Shape of the scores
themselves would be a second reader inside the attention block). The tiled mask is
viewed as ``[rows, *]`` so that the sizes proof keeps the scores' batch axis through the
Add (a Tile's is a size of its own, and every head split after it would lose its proof).
The scores then reach the Softmax through Adds, where the attention pattern takes the
(summed) bias.

It applies where the sizes are proven (``fusion_core.sizes``): the first Reshape splits
the scores' batch axis alone (the last three kept), the second merges it back (the
scores' shape again), and each mask is 1 on the view's first axis and broadcasts into
the view. Every value between the two Reshapes is read by the next step alone. The
tiled mask is as large as one head of the scores, which the view's broadcast Add read
anyway, and the values are the original's: nothing is undone where no fusion took it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, take_place
from autofusion.fusion_core.sizes import ONE, SizeProof, proven_equal

__all__ = ["RULE", "window_masks"]

RULE = "window_mask"
_ONNX = ("", "ai.onnx")
_SHAPE_SLICES = 15  # Shape's start and end
_SEARCH = 24  # values above the scores searched for the projection
Fresh = Callable[[str], str]


def window_masks(graph: ir.Graph, fresh_name: Fresh, mark: str) -> int:
    """Add every mask added on a window view of scores to the scores; how many views."""
    if graph.opset_imports.get("", 0) < _SHAPE_SLICES:
        return 0
    proof = SizeProof()
    done = 0
    for node in list(graph):
        if node.graph is not graph or node.op_type != "Reshape" or node.domain not in _ONNX:
            continue
        found = _window_view(node, proof)
        if found is not None:
            _rewrite(graph, node, *found, fresh_name, mark)
            done += 1
    return done


def _same(proof: SizeProof, a: ir.Value, i: int, b: ir.Value, j: int) -> bool:
    return proven_equal(proof.size(a, i), proof.size(b, j)) is True


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _window_view(split: ir.Node, proof: SizeProof) -> tuple[list, ir.Node, ir.Value] | None:
    """(the Adds in order with their masks, the Reshape back, a value to read the rows
    from: ``_rows_read``) where ``split`` views the
    scores' windows and masks are added to the view before it is viewed back."""
    scores, view = split.inputs[0], split.outputs[0]
    if scores is None or len(scores.shape or ()) != 4 or len(view.shape or ()) != 5:
        return None
    adds: list[tuple[ir.Node, ir.Value]] = []
    value, reader = view, _only_reader(view)
    while reader is not None and reader.op_type == "Add" and reader.domain in _ONNX:
        others = [v for v in reader.inputs if v is not value]
        if len(reader.inputs) != 2 or len(others) != 1 or others[0] is None:
            return None
        adds.append((reader, others[0]))
        value = reader.outputs[0]
        reader = _only_reader(value)
    back = reader
    if not adds or back is None or back.op_type != "Reshape" or back.domain not in _ONNX:
        return None
    out = back.outputs[0]
    if len(out.shape or ()) != 4 or not _kept(proof, scores, view, value, out):
        return None
    for _, mask in adds:
        rank = len(mask.shape or ())
        if not 0 < rank <= 5 or (rank == 5 and proof.size(mask, 0) != ONE):
            return None  # a mask of its own per image: no tile of the windows'
    rows = _rows_read(scores, proof)
    return (adds, back, rows) if rows is not None else None


def _rows_read(scores: ir.Value, proof: SizeProof) -> ir.Value | None:
    """A value above the scores whose first axis is proven theirs, to read the rows from:
    the ``[B * W, S, C]`` projection a head split of the scores' query or key views
    (nothing between the scores and their Softmax may be read twice, and no attention
    fusion takes the projection away)."""
    seen, frontier = 0, [scores]
    while frontier and seen < _SEARCH:
        value = frontier.pop(0)
        node = value.producer()
        seen += 1
        if node is None or node.domain not in _ONNX:
            continue
        source = node.inputs[0] if node.inputs else None
        split = node.op_type == "Reshape" and len(value.shape or ()) == 4
        if split and len(source.shape or ()) == 3 and _same(proof, source, 0, scores, 0):  # type: ignore[union-attr]
            return source
        frontier += [v for v in node.inputs if v is not None and v.producer() is not None]
    return None


def _kept(proof: SizeProof, scores: ir.Value, view: ir.Value, total: ir.Value, out) -> bool:
    """Whether the view splits the scores' batch axis alone, the masks widen no axis of
    it, and the Reshape back gives the scores' last three sizes."""
    return (
        all(_same(proof, view, k + 1, scores, k) for k in (1, 2, 3))
        and all(_same(proof, total, k, view, k) for k in range(5))
        and all(_same(proof, out, k, total, k + 1) for k in (1, 2, 3))
    )


def _rewrite(
    graph: ir.Graph,
    split: ir.Node,
    adds: list,
    back: ir.Node,
    rows: ir.Value,
    fresh_name: Fresh,
    mark: str,
) -> None:
    """The Adds on the scores, each mask as ``_tiled`` makes it; the last takes the
    Reshape back's readers and name."""
    scores = split.inputs[0]
    made: list[ir.Node] = []
    tiled: dict[ir.Value, ir.Value] = {}
    value = scores
    for add, mask in adds:
        if mask not in tiled:
            tiled[mask] = _tiled(mask, scores, rows, made, fresh_name)
        inputs = [value, tiled[mask]] if add.inputs[0] is not mask else [tiled[mask], value]
        made.append(ir.Node("", "Add", inputs, name=fresh_name(f"{RULE}_Add")))
        value = made[-1].outputs[0]
        value.name = fresh_name(f"{RULE}_scores")
        value.dtype, value.shape = scores.dtype, scores.shape
    for node in made:
        node.metadata_props[mark] = RULE
        for v in node.inputs:
            new = v is not None and v.const_value is not None and v.producer() is None
            if new and v.name not in graph.initializers:  # type: ignore[union-attr]
                graph.register_initializer(v)  # type: ignore[arg-type]
    graph.insert_before(back, made)
    take_place(back.outputs[0], value)
    drop_unread(graph, [back])


def _ints(name: str, values: list[int]) -> ir.Value:
    value = ir.Value(
        name=name, shape=ir.Shape([len(values)]), const_value=ir.tensor(np.array(values, np.int64))
    )
    value.dtype = ir.DataType.INT64
    return value


def _tiled(
    mask: ir.Value, scores: ir.Value, source: ir.Value, made: list, fresh_name: Fresh
) -> ir.Value:
    """``mask`` as it broadcasts against the 4-D scores: a 5-D mask without its leading
    1 (Squeeze), tiled over the images where it has one row per window."""
    rank = len(mask.shape)  # type: ignore[arg-type]
    if rank < 4:
        return mask  # it broadcasts over the batch and the windows alike
    if rank == 5:
        squeeze = ir.Node("", "Squeeze", [mask, _ints(fresh_name(f"{RULE}_axes"), [0])])
        squeeze.name = fresh_name(f"{RULE}_Squeeze")
        squeeze.outputs[0].name = fresh_name(f"{RULE}_mask")
        squeeze.outputs[0].dtype = mask.dtype
        squeeze.outputs[0].shape = ir.Shape(list(mask.shape)[1:])  # type: ignore[arg-type]
        made.append(squeeze)
        mask = squeeze.outputs[0]
    dims = list(mask.shape)  # type: ignore[arg-type]
    if dims[0] == 1:
        return mask
    first = [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)]
    rows = ir.Node("", "Shape", [source], first)  # the scores' rows
    windows = ir.Node("", "Shape", [mask], first)
    images = ir.Node("", "Div", [rows.outputs[0], windows.outputs[0]])
    ones = _ints(fresh_name(f"{RULE}_ones"), [1, 1, 1])
    repeats = ir.Node("", "Concat", [images.outputs[0], ones], [ir.AttrInt64("axis", 0)])
    tile = ir.Node("", "Tile", [mask, repeats.outputs[0]])
    # viewed as [rows of the scores, the mask's own]: sizes proves the tiled mask's
    # batch axis the scores' (a Tile's is a size of its own)
    rest = ir.Node("", "Shape", [mask], [ir.AttrInt64("start", 1)])
    target = ir.Node("", "Concat", [rows.outputs[0], rest.outputs[0]], [ir.AttrInt64("axis", 0)])
    view = ir.Node("", "Reshape", [tile.outputs[0], target.outputs[0]])
    lengths = ((rows, 1), (windows, 1), (images, 1), (repeats, 4), (rest, 3), (target, 4))
    for node, length in lengths:
        node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.INT64, ir.Shape([length])
    for node in (tile, view):
        node.outputs[0].dtype = mask.dtype
        node.outputs[0].shape = ir.Shape([scores.shape[0], *dims[1:]])  # type: ignore[index]
    new = [rows, windows, images, repeats, tile, rest, target, view]
    for node in new:
        node.name = fresh_name(f"{RULE}_{node.op_type}")
        node.outputs[0].name = fresh_name(f"{RULE}_{node.op_type.lower()}")
    made += new
    return view.outputs[0]
