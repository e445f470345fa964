"""``attention``: the scaled-dot-product core of multi-head attention as one
com.microsoft ``MultiHeadAttention`` on onnxruntime, or ONNX ``Attention`` (opset 23,
same q/k/v/mask/scale, ``q_num_heads = kv_num_heads = N``) on the generic target when
the model's opset allows; below it the block is refused with that reason and the
generic target folds the scale instead (``fold_scale``)::

    Q = Transpose(Reshape(q, [B, S, N, H]), perm=[0, 2, 1, 3])        q: [B, S, N * H]
    K = Transpose(Reshape(k, [B, L, N, H]), perm=[0, 2, 3, 1])        K^T directly
    V = Transpose(Reshape(v, [B, L, N, H]), perm=[0, 2, 1, 3])
    P = Softmax(MatMul(Q, K) * c + M, axis=-1)       (or MatMul(Q, K) / c, c -> 1 / c)
    y = Reshape(Transpose(MatMul(P, V), perm=[0, 2, 1, 3]), [B, S, N * H])
      = MultiHeadAttention(q, k, v, attention_bias=M, num_heads=N, scale=c)

(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MultiHeadAttention).
Its default scale is ``1 / sqrt(H)``; the rewriter always passes the graph's constant,
so a model whose scale differs from the default fuses too.

``N`` and ``H`` come from the graph, never from the user: the last two entries of the
head-split Reshape's target (a constant, or a ``Concat`` whose last two parts are
constants, as both exporters write it), a ``-1`` among them resolved with the hidden
size (the last dimension of ``q``, which must be known). The pattern language cannot
say this (it compares whole constants, not entries of a Concat, and cannot relate them
to another value's dimension), so this module checks it, and that each Reshape keeps
the batch and sequence dimensions (``B`` and ``S`` or ``L``): its target entry is 0
(without ``allowzero``) or the input's known dimension, or the known output dimension
equals the input's. Without that proof (TorchScript exports leave the shapes unknown)
the match is refused with the reason, since a Reshape to ``[B * S, 1, N, H]`` would
compute another attention.

The additive mask ``M`` becomes ``attention_bias`` (input 5). onnxruntime 1.32's CPU
kernel takes it only as rank 4 ``[B or 1, N or 1, S, L]`` and rejects a
``[B, 1, 1, L]`` padding mask ("Input 'attention_bias' dimension 2 should be same as
sequence_length"), so the mask's last two dimensions must be known equal to those of
the scores.

The SDPA form (``attention_mha_sdpa.yaml``, PyTorch's ``scaled_dot_product_attention``
exported by dynamo) differs in three places, each named by a parameter:

* the scale is split into ``Mul(Q, s_q)`` and ``Mul(K^T, s_k)`` before the MatMul
  (``q_scale_node``, ``k_scale_node`` in place of ``scale_node``): ``scale = s_q * s_k``;
* ``K^T`` is ``Reshape(Transpose(Reshape(K, [B * N, L, H]), [0, 2, 1]), [B, N, H, L])``
  with ``K`` transposed by ``[0, 2, 1, 3]`` (``k_flat_node``, ``k_unflat_node``); the
  rewriter proves it swaps the last two axes from the known (possibly symbolic) shapes:
  the flat Reshape gives rank 3 ending in ``[L, H]`` of ``K`` and the other gives
  ``[B, N, H, L]``, so the first merges and the second splits the leading axes;
* ``Softmax`` is followed by ``Where(IsNaN(P), 0, P)`` (``nan_guard_node``, the Where),
  which maps a fully masked row (all ``-inf``, softmax NaN) to zeros. MultiHeadAttention
  has no such guard: with ``-inf`` in ``attention_bias`` such a row is not zeros. So the
  guard is dropped only when the mask is ``Where(cond, a, b)`` of finite constants (dynamo
  writes ``Where(mask, 0, -3.4e38)``): then no score is ``-inf``, a fully masked row gets
  a uniform softmax in both graphs, and the guard never fires. A mask that may hold
  ``-inf`` (TorchScript's ``Where(mask, 0, -inf)``, or a graph input) is refused.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fusion_core.ir import constant_array
from fusion_core.patterns import Match, attribute_value
from fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter, scale_factor
from fusion_core.targets import MS_DOMAIN

__all__ = ["FuseAttention"]

_Dim = int | str | None  # a known size, a symbolic one, or unknown
ATTENTION_OPSET = 23  # https://onnx.ai/onnx/operators/onnx__Attention.html


class AttentionParams(Params):
    q_reshape_node: str = "q_reshape"
    k_reshape_node: str = "k_reshape"
    v_reshape_node: str = "v_reshape"
    qk_node: str = "qk"  # MatMul(Q, K^T)
    scale_node: str | None = "scale"  # Mul by c or Div by c
    q_scale_node: str | None = None  # SDPA: Mul(Q, s_q) (with k_scale_node)
    k_scale_node: str | None = None  # SDPA: Mul(K^T, s_k)
    k_flat_node: str | None = None  # SDPA: Reshape of K to [B * N, L, H]
    k_unflat_node: str | None = None  # SDPA: Reshape of its transpose to [B, N, H, L]
    nan_guard_node: str | None = None  # SDPA: Where(IsNaN(P), 0, P) after the Softmax
    mask_node: str | None = None  # Add of the additive mask
    context_reshape_node: str | None = None  # TorchScript SDPA: Reshape of P @ V to its shape
    output_node: str = "out_reshape"  # the Reshape back to [B, S, N * H]


class FuseAttention(Rewriter):
    name = "attention"
    targets = frozenset({"onnxruntime", "generic"})
    Params = AttentionParams

    def rewrite(self, match: Match, params: AttentionParams, ctx: RewriteContext) -> Rewrite | str:
        contrib = ctx.target.can_emit(MS_DOMAIN)
        if not contrib and ctx.opset < ATTENTION_OPSET:
            return (
                f"ONNX Attention needs opset {ATTENTION_OPSET} (the model has {ctx.opset}); "
                "the generic target folds the attention scale into the projection instead"
            )
        splits = [
            match.node(params.q_reshape_node),
            match.node(params.k_reshape_node),
            match.node(params.v_reshape_node),
        ]
        heads = _heads(splits)
        if isinstance(heads, str):
            return heads
        output = match.node(params.output_node)
        # MultiHeadAttention's [B, S, N * H] is out_t's [B, S, N, H] with the heads merged,
        # so any Reshape of out_t is the same Reshape of it, unless it copies a dimension
        # from past the second (a 0 entry without allowzero)
        reshape_after = _merges_heads(output, splits[0].inputs[0], heads) is not None
        if reshape_after:
            failure = _reshapes_same_data(output)
            if failure is not None:
                return failure
        if params.context_reshape_node is not None:
            failure = _identity_reshape(match.node(params.context_reshape_node))
            if failure is not None:
                return failure
        scale = 1.0
        scale_nodes = [params.scale_node, params.q_scale_node, params.k_scale_node]
        for name in scale_nodes:
            if name is None:
                continue
            # input 1 after the commutative swap: Mul(c, scores) is written either way
            factor = scale_factor(match.node(name), match.input(name, 1))
            if isinstance(factor, str):
                return factor
            scale *= factor
        if params.k_flat_node is not None and params.k_unflat_node is not None:
            failure = _swaps_last_axes(
                match.node(params.k_flat_node), match.node(params.k_unflat_node)
            )
            if failure is not None:
                return failure
        inputs: list[ir.Value | None] = [s.inputs[0] for s in splits]
        nodes: list[ir.Node] = []
        keep_rows = None
        if params.mask_node is not None:
            scores = match.node(params.scale_node or params.qk_node)
            mask = _attention_bias(match.node(params.mask_node), scores)
            if isinstance(mask, str):
                return mask
            if params.nan_guard_node is not None:
                guarded = _guarded_mask(mask, match.node(params.nan_guard_node), ctx)
                if isinstance(guarded, str):
                    return guarded
                mask, keep_rows, mask_nodes = guarded
                nodes += mask_nodes
            inputs += [None, None, mask]
        nodes.append(_attention_node(contrib, inputs, heads[0], scale, ctx))
        q = splits[0].inputs[0]
        nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, q.shape
        if keep_rows is not None:
            nodes.append(ir.Node("", "Mul", [nodes[-1].outputs[0], keep_rows]))
            nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, q.shape
        if reshape_after:
            nodes.append(
                ir.Node(
                    "",
                    "Reshape",
                    [nodes[-1].outputs[0], output.inputs[1]],
                    output.attributes.values(),
                )
            )
        old = output.outputs[0]
        new = nodes[-1].outputs[0]
        new.type, new.shape = old.type, old.shape
        return Rewrite(nodes, [(old, new)])


def _attention_node(
    contrib: bool, inputs: list[ir.Value | None], heads: int, scale: float, ctx: RewriteContext
) -> ir.Node:
    """com.microsoft MultiHeadAttention, or ONNX Attention: the same 3-D q, k, v, the
    additive mask (MultiHeadAttention's input 5, Attention's input 3) and scale."""
    if contrib:
        ctx.use_domain(MS_DOMAIN)
        attrs = [ir.AttrInt64("num_heads", heads), ir.AttrFloat32("scale", scale)]
        return ir.Node(MS_DOMAIN, "MultiHeadAttention", inputs, attrs)
    attrs = [
        ir.AttrInt64("q_num_heads", heads),
        ir.AttrInt64("kv_num_heads", heads),
        ir.AttrFloat32("scale", scale),
    ]
    return ir.Node("", "Attention", [v for v in inputs if v is not None], attrs)


def _dims(value: ir.Value) -> list[_Dim] | None:
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else (d.value if d.value else None) for d in value.shape]


def _target_entries(reshape: ir.Node) -> list[int | None] | str:
    """The Reshape target, entry by entry (None where not a constant): a constant, or a
    Concat of 1-D parts (exporters build ``[B, S]`` from Shape and the rest constant)."""
    target = reshape.inputs[1]
    array = constant_array(target)
    if array is not None:
        return [int(a) for a in array.reshape(-1)]
    producer = target.producer() if target is not None else None
    if producer is None or producer.op_type != "Concat":
        return f"the target of Reshape {reshape.name!r} is neither a constant nor a Concat"
    entries: list[int | None] = []
    for part in producer.inputs:
        array = constant_array(part)
        if array is not None:
            entries += [int(a) for a in array.reshape(-1)]
        elif part is not None and part.shape is not None and part.shape.is_static():
            entries += [None] * int(np.prod(part.shape.numpy(), dtype=np.int64))
        else:
            return f"the length of part {part.name!r} of the target of {reshape.name!r} is unknown"
    return entries


def _keeps_dim(reshape: ir.Node, entries: list[int | None], i: int, want: _Dim) -> bool:
    """Whether output dimension ``i`` of the Reshape is ``want`` (a known dimension)."""
    if want is None:
        return False
    entry = entries[i]
    if entry == 0 and not attribute_value(reshape, "allowzero", 0):
        return True  # copies dimension i of the input, which is B or S (see the callers)
    if entry is not None and entry == want:
        return True
    out = _dims(reshape.outputs[0])
    return out is not None and len(out) > i and out[i] == want


def _heads(splits: list[ir.Node]) -> tuple[int, int] | str:
    """(N, H) read from the head-split Reshapes, which must agree and keep [B, S]."""
    found = None
    for reshape in splits:
        source = reshape.inputs[0]
        dims = _dims(source)
        if dims is None or len(dims) != 3 or not isinstance(dims[2], int):
            return f"{source.name!r} (read by Reshape {reshape.name!r}) is not [B, S, hidden]"
        entries = _target_entries(reshape)
        if isinstance(entries, str):
            return entries
        if len(entries) != 4:
            return f"Reshape {reshape.name!r} does not split into [B, S, heads, head_size]"
        heads, size = entries[2], entries[3]
        if heads == -1 and size is not None and size > 0 and dims[2] % size == 0:
            heads = dims[2] // size
        if size == -1 and heads is not None and heads > 0 and dims[2] % heads == 0:
            size = dims[2] // heads
        if heads is None or size is None or heads <= 0 or size <= 0 or heads * size != dims[2]:
            return (
                f"the heads and head size {entries[2:]} of the target of Reshape "
                f"{reshape.name!r} are not constants that split {dims[2]}"
            )
        if not all(_keeps_dim(reshape, entries, i, dims[i]) for i in (0, 1)):
            return (
                f"cannot show that Reshape {reshape.name!r} keeps the batch and sequence "
                f"dimensions of {source.name!r} ({dims[:2]})"
            )
        if found is not None and found != (heads, size):
            return f"Reshape {reshape.name!r} splits into {(heads, size)} heads, not {found}"
        found = (heads, size)
    assert found is not None
    return found


def _merges_heads(output: ir.Node, query: ir.Value, heads: tuple[int, int]) -> str | None:
    """The final Reshape goes back to [B, S, N * H] with the query's B and S."""
    entries = _target_entries(output)
    if isinstance(entries, str):
        return entries
    dims = _dims(query) or [None, None]
    hidden = heads[0] * heads[1]
    out = _dims(output.outputs[0])
    last_ok = entries[-1] in (hidden, -1) or (out is not None and out[-1] == hidden)
    if len(entries) != 3 or not last_ok:
        return f"Reshape {output.name!r} does not merge the heads into [B, S, {hidden}]"
    if not all(_keeps_dim(output, entries, i, dims[i]) for i in (0, 1)):
        return (
            f"cannot show that Reshape {output.name!r} restores the batch and sequence "
            f"dimensions of {query.name!r} ({dims[:2]})"
        )
    return None


def _attention_bias(add: ir.Node, scale: ir.Node) -> ir.Value | str:
    """The mask added to the scores, if onnxruntime's kernel takes it as it is."""
    mask = next(v for v in add.inputs if v is not scale.outputs[0])
    scores, dims = _dims(scale.outputs[0]), _dims(mask)
    if scores is None or dims is None or len(dims) != 4 or len(scores) != 4:
        return f"the mask {mask.name!r} is not known to be rank 4 like the scores"
    fits = all(
        d == 1 or (d is not None and d == s) for d, s in zip(dims[:2], scores[:2], strict=True)
    )
    matches = all(d is not None and d == s for d, s in zip(dims[2:], scores[2:], strict=True))
    if not (fits and matches):
        return (
            f"the mask {mask.name!r} has shape {dims}; MultiHeadAttention takes "
            f"[B or 1, heads or 1, S, L] for scores of shape {scores}"
        )
    return mask


def _swaps_last_axes(flat: ir.Node, unflat: ir.Node) -> str | None:
    """Reshape(Transpose(Reshape(K, [B * N, L, H]), [0, 2, 1]), [B, N, H, L]) is K^T."""
    k, flat_dims, out = _dims(flat.inputs[0]), _dims(flat.outputs[0]), _dims(unflat.outputs[0])
    known = k is not None and flat_dims is not None and out is not None
    if not known or len(k) != 4 or len(flat_dims) != 3 or len(out) != 4:
        return f"the shapes around {flat.name!r} and {unflat.name!r} are not known"
    want_flat, want_out = k[2:], [k[0], k[1], k[3], k[2]]
    same = all(
        a is not None and a == b
        for a, b in zip(flat_dims[1:] + out, want_flat + want_out, strict=True)
    )
    if not same:
        return (
            f"cannot show that {flat.name!r} .. {unflat.name!r} swaps the last two axes of "
            f"K {k}: shapes {flat_dims} and {out}"
        )
    return None


def _guarded_mask(
    mask: ir.Value, guard: ir.Node, ctx: RewriteContext
) -> tuple[ir.Value, ir.Value | None, list[ir.Node]] | str:
    """The mask for MultiHeadAttention and, if needed, which rows to keep, so that
    MultiHeadAttention followed by the keep multiply computes what the graph's
    Softmax -> Where(IsNaN(P), 0, P) computes.

    A mask ``Where(cond, a, b)`` of finite constants never gives a row of ``-inf``: a
    fully masked row gets a uniform softmax in both graphs and the guard never fires
    (dynamo's ``Where(mask, 0, -3.4e38)``). With ``-inf`` on one side (TorchScript's
    ``Where(mask, 0, -inf)``) a fully masked row is NaN and the guard makes the context
    0, while MultiHeadAttention would give NaN: so ``-inf`` becomes float32's lowest
    finite value and the output rows whose mask row attends to nothing are multiplied
    by 0. ``cond`` must be the same for every head (``[B or 1, 1, S, L]``), as the keep
    factor is per row of the merged output.
    """
    zero = constant_array(guard.inputs[1])
    if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0.0:
        return f"Where {guard.name!r} after the Softmax does not replace NaN by 0"
    producer = mask.producer()
    arrays = (
        [constant_array(v) for v in producer.inputs[1:]]
        if producer is not None and producer.op_type == "Where"
        else [None]
    )
    if any(a is None for a in arrays):
        return (
            f"the mask {mask.name!r} is not Where of constants: a fully masked row (-inf) "
            "gives NaN, which the graph turns into 0 and MultiHeadAttention does not"
        )
    if all(np.all(np.isfinite(a)) for a in arrays):
        return mask, None, []
    assert producer is not None
    minus_inf = [bool(np.all(np.isneginf(a))) for a in arrays]
    if sum(minus_inf) != 1 or not all(
        np.all(np.isfinite(a)) or m for a, m in zip(arrays, minus_inf, strict=True)
    ):
        return (
            f"the mask {mask.name!r} is not Where(cond, finite, -inf) or Where(cond, -inf, finite)"
        )
    cond = producer.inputs[0]
    dims = _dims(cond) if cond is not None else None
    if dims is None or len(dims) != 4 or dims[1] != 1:
        return (
            f"the condition of mask {mask.name!r} is not known to be [B or 1, 1, S, L]: "
            "rows fully masked for some heads only cannot be kept apart after the merge"
        )
    lowest = np.finfo(np.float32).min
    finite = [np.where(np.isneginf(a), lowest, a).astype(a.dtype) for a in arrays]
    values = [ctx.initializer(f"{mask.name}_finite", a) for a in finite]
    nodes = [ir.Node("", "Where", [cond, *values])]
    attend = cond
    if minus_inf[0]:  # True selects -inf: the positions attended to are the False ones
        nodes.append(ir.Node("", "Not", [cond]))
        attend = nodes[-1].outputs[0]
    nodes.append(ir.Node("", "Cast", [attend], [ir.AttrInt64("to", ir.DataType.FLOAT)]))
    if ctx.opset >= 18:
        axes = ctx.initializer("keep_rows_axes", np.array([3], dtype=np.int64))
        reduce = ir.Node(
            "", "ReduceMax", [nodes[-1].outputs[0], axes], [ir.AttrInt64("keepdims", 0)]
        )
    else:
        reduce = ir.Node(
            "",
            "ReduceMax",
            [nodes[-1].outputs[0]],
            [ir.AttrInt64s("axes", [3]), ir.AttrInt64("keepdims", 0)],
        )
    nodes.append(reduce)  # [B, 1, S]: 1 where the row attends to something
    nodes.append(ir.Node("", "Transpose", [reduce.outputs[0]], [ir.AttrInt64s("perm", [0, 2, 1])]))
    return nodes[0].outputs[0], nodes[-1].outputs[0], nodes


def _identity_reshape(reshape: ir.Node) -> str | None:
    """Whether the Reshape is known to keep its input's shape (every dim known equal)."""
    before, after = _dims(reshape.inputs[0]), _dims(reshape.outputs[0])
    if before is None or after is None or before != after or None in before:
        return (
            f"cannot show that Reshape {reshape.name!r} keeps the shape of the context "
            f"({before} -> {after})"
        )
    return None


def _reshapes_same_data(reshape: ir.Node) -> str | None:
    """Whether the Reshape of out_t can read MultiHeadAttention's output instead."""
    entries = _target_entries(reshape)
    if isinstance(entries, str):
        return entries
    if attribute_value(reshape, "allowzero", 0):
        return None
    if any(e is None or e == 0 for e in entries[2:]):
        return (
            f"Reshape {reshape.name!r} may copy a dimension past the second of its input "
            f"(target {entries}), which merging the heads changes"
        )
    return None
