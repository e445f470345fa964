"""Rule ``head_split``: the head split is the last op before the head Transpose.

Attention, rotary and their patterns read a projection's heads as
``Transpose(Reshape(x, [B, S, N, H]), [0, 2, 1, 3])`` with ``x`` the ``[B, S, N * H]``
projection. Families put ops between the split and the Transpose: a per-head RMSNorm of
q and k (Qwen3, OLMo-2), the Slice or Split of one fused query_key_value projection split
by head (Falcon, GPT-NeoX). Whatever those ops are, merging their result back and
splitting it again changes no value::

    Transpose(y, perm=[0, 2, 1, 3])                 y: [B, S, N, H], not a Reshape's
      == Transpose(Reshape(Reshape(y, [0, 0, N * H]), [0, 0, N, H]), [0, 2, 1, 3])

(Reshape's ``0`` copies the input's dimension, so dynamic batch and sequence stay
dynamic), and the graph then reads ``x = Reshape(y, [0, 0, N * H])`` as the projection
the patterns expect: one rule, not one more copy of every attention and rotary pattern.

The head count ``N`` and size ``H`` written into the pair are the Transpose input's
labels where the graph proves no other size there (``_fixed_sizes.fixed_size``): a
stale label ``[B, S, 4, 2]`` of ``[B, S, 2, 4]`` heads would split them wrong.

It applies where the Transpose's input comes, through ops that keep rank 4 (or a
Gather that picks one of ``K`` per head from ``[B, S, N, K, H]``, Persimmon's fused
projection), from a Reshape of a rank-3 value to ``[B, S, N, ...]`` with the same ``N``:
a head split.
A pair no fusion consumed is taken out again by ``undo_unused``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._fixed_sizes import fixed_size
from autofusion.fusion_core.sizes import SizeProof

__all__ = ["MERGE", "RULE", "SPLIT", "split_heads_last"]

RULE = "head_split"
MERGE, SPLIT = f"{RULE}:merge", f"{RULE}:split"  # what each new node is, in its mark
_WALK = 12  # ops between the head split and the Transpose, at most
_HEAD_PERM = [0, 2, 1, 3]
MS_DOMAIN = "com.microsoft"
# Ops a path from the head split to the Transpose may take: what a per-head norm or the
# slicing of a fused projection is made of. A MatMul or a Softmax ends the path (the
# Transpose that merges the heads of ``P @ V`` is not a split's).
_PER_HEAD = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Cast", "Neg", "Abs",
        "ReduceMean", "ReduceSumSquare", "ReduceSum", "ReduceL2",
        "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
        "Slice", "Split",
    }
)  # fmt: skip


def split_heads_last(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Insert the merge/split pair before every head Transpose fed by a per-head op;
    each new node's ``metadata_props[mark]`` says which of the pair it is (``MERGE``,
    ``SPLIT``). ``fresh_name`` gives unique names. Returns how many pairs."""
    done, proof = 0, SizeProof()  # one walk: the heads of every layer read the same sizes
    for node in list(graph):
        heads = _applies(node, proof)
        if heads is not None:
            _insert_pair(graph, node, heads, fresh_name, mark)
            done += 1
    return done


def _applies(node: ir.Node, proof: SizeProof) -> tuple[int, int] | None:
    """The head count and size of the heads ``node`` transposes, where it is a head
    Transpose with a head split above it; else None."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return None
    perm = node.attributes.get("perm")
    if perm is None or list(perm.value) != _HEAD_PERM:
        return None
    heads = _heads_and_size(node.inputs[0], proof)
    producer = node.inputs[0].producer() if node.inputs[0] is not None else None
    if heads is None or producer is None or producer.op_type == "Reshape":
        return None
    return heads if _split_above(producer, heads[0], proof) else None


def _heads_and_size(value: ir.Value | None, proof: SizeProof) -> tuple[int, int] | None:
    if value is None or value.shape is None or len(value.shape) != 4:
        return None
    heads, size = fixed_size(proof, value, 2), fixed_size(proof, value, 3)
    return (heads, size) if heads is not None and size is not None else None


def _split_above(node: ir.Node, heads: int, proof: SizeProof) -> bool:
    """Whether a Reshape of a rank-3 value to ``[B, S, heads, ...]`` is above ``node``,
    through ops that act on each head's values (``_PER_HEAD``) on rank-4 values."""
    for _ in range(_WALK):
        if node.op_type == "Reshape":
            source, out = node.inputs[0], node.outputs[0]
            return (
                source is not None
                and source.shape is not None
                and len(source.shape) == 3
                and out.shape is not None
                and len(out.shape) >= 4
                and fixed_size(proof, out, 2) == heads
            )
        if _picks_per_head(node):
            node = node.inputs[0].producer()  # type: ignore[union-attr,assignment]
            if node is None:
                return False
            continue
        if node.op_type not in _PER_HEAD or node.domain not in ("", "ai.onnx", MS_DOMAIN):
            return False
        ranked = [
            v
            for v in node.inputs
            if v is not None and v.producer() is not None and v.shape is not None
        ]
        above = [v for v in ranked if len(v.shape) == 4]  # type: ignore[arg-type]
        if not above:
            return False
        node = above[0].producer()  # type: ignore[assignment]
    return False


def _picks_per_head(node: ir.Node) -> bool:
    """A Gather of one constant index on an axis past the heads of ``[B, S, N, K, H]``:
    Persimmon's fused projection, ``Reshape(qkv, [B, S, N, 3, H])``, picks q, k and v so."""
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
        return False
    data, index = node.inputs[0], node.inputs[1]
    if data.shape is None or len(data.shape) != 5 or index is None:
        return False
    axis = node.attributes.get("axis")
    picked = index.const_value
    return (
        axis is not None
        and axis.value in (3, -2)
        and picked is not None
        and picked.numpy().size == 1
        and picked.numpy().ndim == 0
    )


def _insert_pair(
    graph: ir.Graph,
    transpose: ir.Node,
    heads_and_size: tuple[int, int],
    fresh_name: Callable[[str], str],
    mark: str,
) -> None:
    heads_value = transpose.inputs[0]
    heads, size = heads_and_size
    dims = list(heads_value.shape)  # type: ignore[arg-type]
    pair = []
    for role, shape in ((MERGE, [dims[0], dims[1], heads * size]), (SPLIT, dims)):
        target = [0, 0, heads * size] if role == MERGE else [0, 0, heads, size]
        constant = ir.tensor(np.array(target, np.int64))
        shape_value = ir.Value(
            name=fresh_name(f"{RULE}_shape"), shape=ir.Shape([len(target)]), const_value=constant
        )
        shape_value.dtype = ir.DataType.INT64
        graph.register_initializer(shape_value)
        source = pair[-1].outputs[0] if pair else heads_value
        node = ir.Node("", "Reshape", [source, shape_value], name=fresh_name(f"{RULE}_Reshape"))
        node.outputs[0].name = fresh_name(f"{RULE}_{role.split(':')[1]}d")
        node.outputs[0].shape, node.outputs[0].dtype = ir.Shape(shape), heads_value.dtype
        node.metadata_props[mark] = role
        pair.append(node)
    graph.insert_before(transpose, pair)
    transpose.replace_input_with(0, pair[-1].outputs[0])
