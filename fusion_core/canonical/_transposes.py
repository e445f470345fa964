"""Rules ``transpose_after_norm`` and ``transpose_after_rotary``: ops that act on each
head's features read the heads before their Transpose, not after it.

Qwen3 normalizes each query and key head before the head Transpose, Gemma-3 and
Persimmon after it (``q_norm(q.view(..).transpose(1, 2))``), and the rotary embedding
then rotates the transposed heads. The patterns read the first order: the head split,
then the Transpose, then the attention.

* ``transpose_after_norm``: a norm over the last axis (LayerNormalization,
  RMSNormalization, com.microsoft's SimplifiedLayerNormalization, ``axis`` the last)
  computes each row of that axis from the row alone and scales it by a vector along
  that axis, so for a Transpose that keeps the last axis last
  ``Norm(Transpose(x, perm)) == Transpose(Norm(x), perm)``: the same arithmetic on the
  same rows. ``head_split`` then finds the norm between the split and the Transpose.
* ``transpose_after_rotary``: a fused RotaryEmbedding of ``[B, N, S, H]`` heads
  ``Transpose(y, [0, 2, 1, 3])`` rotates each ``(b, n, s)`` row by position ``s``; its
  3-D form (``num_heads = N``) rotates the rows of ``Reshape(y, [B, S, N * H])`` by the
  same positions, so ``Transpose(Reshape(Rotary3D(Reshape(y)), [B, S, N, H]))`` is the
  same value, and the attention patterns read the Reshape as its head split. ``N`` and
  ``H`` are ``y``'s labels where the graph proves no other size there
  (``_fixed_sizes.fixed_size``): a stale label would rotate rows of the wrong width.

Both move data only where the original moved it too, and compute nothing new.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import replace
from autofusion.fusion_core.canonical._fixed_sizes import fixed_size
from autofusion.fusion_core.sizes import SizeProof

__all__ = ["transpose_after_norms", "transpose_after_rotaries"]

MS_DOMAIN = "com.microsoft"
_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]
_NORMS = {  # onnxruntime registers SimplifiedLayerNormalization in the ONNX domain
    ("", "LayerNormalization"),
    ("", "RMSNormalization"),
    ("", "SimplifiedLayerNormalization"),
    (MS_DOMAIN, "SimplifiedLayerNormalization"),
    (MS_DOMAIN, "LayerNormalization"),
}
_ROTARIES = {("", "RotaryEmbedding"), (MS_DOMAIN, "RotaryEmbedding")}


def transpose_after_norms(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Swap every last-axis norm with the Transpose it alone reads; how many swapped."""
    swapped = 0
    for norm in list(graph):
        transpose = _transpose_before_norm(norm)
        if transpose is None:
            continue
        source = transpose.inputs[0]
        early = _copy(norm, [source, *norm.inputs[1:]], fresh_name)
        _describe(early.outputs[0], source, fresh_name("transpose_after_norm_normed"))
        late = _transpose(early.outputs[0], transpose, norm.outputs[0], fresh_name)
        replace(graph, norm, [early, late], mark, "transpose_after_norm")
        graph.remove(transpose, safe=True)
        swapped += 1
    return swapped


def transpose_after_rotaries(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rotate the 3-D projection of every fused rotary's transposed heads; how many."""
    moved, proof = 0, SizeProof()  # one walk: the heads of every layer read the same sizes
    for rotary in list(graph):
        transpose = _head_transpose_before_rotary(rotary, proof)
        if transpose is None:
            continue
        heads = transpose.inputs[0]
        batch, sequence, count, size = list(heads.shape)  # type: ignore[arg-type]
        merge = _reshape(heads, [0, 0, count * size], [batch, sequence, count * size], fresh_name)
        rows = _copy(rotary, [merge.outputs[0], *rotary.inputs[1:]], fresh_name, num_heads=count)
        _describe(rows.outputs[0], merge.outputs[0], fresh_name("transpose_after_rotary_rows"))
        split = _reshape(rows.outputs[0], [0, 0, count, size], list(heads.shape), fresh_name)  # type: ignore[arg-type]
        late = _transpose(split.outputs[0], transpose, rotary.outputs[0], fresh_name)
        replace(graph, rotary, [merge, rows, split, late], mark, "transpose_after_rotary")
        graph.remove(transpose, safe=True)
        moved += 1
    return moved


def _transpose_before_norm(norm: ir.Node) -> ir.Node | None:
    """The Transpose ``norm`` normalizes the output of, where swapping the two changes
    nothing: the norm is over the last axis only, reads nothing but its scale and bias
    besides, and gives only its first output; the Transpose keeps the last axis last."""
    if (_domain(norm), norm.op_type) not in _NORMS:
        return None
    transpose = _sole_transpose(norm)
    if transpose is None:
        return None
    rank = len(norm.inputs[0].shape)  # type: ignore[arg-type,union-attr]
    perm = transpose.attributes.get("perm")
    if perm is None or list(perm.value)[-1] != rank - 1:
        return None
    axis = norm.attributes.get("axis")
    if (axis.value if axis is not None else -1) not in (-1, rank - 1):
        return None
    if any(v is not None and (v.shape is None or len(v.shape) > 1) for v in norm.inputs[1:]):
        return None  # a scale or bias that is not a vector along the last axis
    if any(v.uses() or v.is_graph_output() for v in norm.outputs[1:]):
        return None
    return transpose


def _head_transpose_before_rotary(rotary: ir.Node, proof: SizeProof) -> ir.Node | None:
    """The head Transpose of ``[B, S, N, H]`` heads (``N`` and ``H`` known numbers the
    graph does not contradict: ``fixed_size``) that a fused RotaryEmbedding alone reads."""
    if (_domain(rotary), rotary.op_type) not in _ROTARIES:
        return None
    transpose = _sole_transpose(rotary)
    if transpose is None:
        return None
    perm = transpose.attributes.get("perm")
    heads = transpose.inputs[0]
    if perm is None or list(perm.value) != _HEAD_PERM or heads is None or heads.shape is None:
        return None
    if len(heads.shape) != 4 or None in (fixed_size(proof, heads, a) for a in (2, 3)):
        return None
    return transpose


def _sole_transpose(node: ir.Node) -> ir.Node | None:
    """The ONNX Transpose whose output of known rank ``node`` alone reads, where
    ``node``'s own first output is not a graph output."""
    x = node.inputs[0] if node.inputs else None
    transpose = x.producer() if x is not None else None
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain not in _ONNX:
        return None
    if x.shape is None or len(x.uses()) != 1 or node.outputs[0].is_graph_output():  # type: ignore[union-attr]
        return None
    return transpose


def _domain(node: ir.Node) -> str:
    return "" if node.domain == "ai.onnx" else node.domain


def _copy(node: ir.Node, inputs: list, fresh_name: Callable[[str], str], **ints: int) -> ir.Node:
    attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
    attributes = [a for a in attributes if a.name not in ints]
    attributes += [ir.AttrInt64(name, value) for name, value in ints.items()]
    return ir.Node(
        node.domain,
        node.op_type,
        inputs,
        attributes,
        name=fresh_name(f"{node.name or node.op_type}_early"),
    )


def _reshape(
    source: ir.Value, target: list[int], dims: list, fresh_name: Callable[[str], str]
) -> ir.Node:
    shape = ir.Value(
        name=fresh_name("transpose_after_rotary_shape"),
        shape=ir.Shape([len(target)]),
        const_value=ir.tensor(np.array(target, np.int64)),
    )
    shape.dtype = ir.DataType.INT64
    node = ir.Node(
        "", "Reshape", [source, shape], name=fresh_name("transpose_after_rotary_Reshape")
    )
    node.outputs[0].name = fresh_name("transpose_after_rotary_reshaped")
    node.outputs[0].shape, node.outputs[0].dtype = ir.Shape(dims), source.dtype
    return node


def _transpose(
    source: ir.Value, like: ir.Node, out: ir.Value, fresh_name: Callable[[str], str]
) -> ir.Node:
    node = ir.Node(
        "",
        "Transpose",
        [source],
        [ir.Attr(a.name, a.type, a.value) for a in like.attributes.values()],
        name=fresh_name(f"{like.name or 'Transpose'}_late"),
    )
    node.outputs[0].name = fresh_name(out.name or "transposed")
    # a contrib op's output may carry no type (onnx's inference does not know it): the
    # rows it computes have its input's
    node.outputs[0].dtype = out.dtype if out.dtype is not None else source.dtype
    node.outputs[0].shape = out.shape
    return node


def _describe(value: ir.Value, like: ir.Value | None, name: str) -> None:
    value.name = name
    value.dtype = like.dtype if like is not None else None
    value.shape = (
        ir.Shape(list(like.shape)) if like is not None and like.shape is not None else None
    )
