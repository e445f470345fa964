"""``merge_siblings``: MatMuls that read the same input, each with a constant 2-D weight
and optionally a constant bias Add, become one MatMul over the concatenated weights, one
Add, and a Split. These are the Q/K/V (or K/V) projections of attention::

    y_i = x @ W_i + b_i            W_i: [K, N_i], b_i: [N_i] (or a scalar), i = 1..n
    W   = [W_1 | ... | W_n]        [K, N_1 + ... + N_n], concatenated along the last axis
    b   = [b_1 | ... | b_n]
    y_1, ..., y_n = Split(x @ W + b, split = [N_1, ..., N_n], axis = -1)

This is exact: column block ``i`` of ``x @ W`` is ``x @ W_i``
(https://onnx.ai/onnx/operators/onnx__MatMul.html), so the outputs only change by the
summation order of one GEMM. One larger GEMM reads ``x`` once instead of ``n`` times and
launches one kernel instead of ``n``; the built-in patterns require each ``W_i`` to be
read by its MatMul only, so the weights are moved, not copied. Widths may differ
(grouped-query attention has narrower K and V). Any target: these are standard ONNX ops.

``W`` and ``b`` are ``ir.LazyTensor``s over the tensors of the ``W_i`` and ``b_i``, not
arrays: nothing is read when the rewrite is made (its checks need dtypes and shapes
only), and each read (a save streams one tensor at a time) concatenates the sources
anew and unmaps those read from a data file. Most of a decoder's weights are Q/K/V and
gate/up projections: held as merged arrays they were a second copy of the model.

Split (https://onnx.ai/onnx/operators/onnx__Split.html) takes the sizes as its second
input from opset 13 on and as the ``split`` attribute before; a negative ``axis`` is
allowed from opset 11 on. ``num_outputs`` (opset 18) only describes equal parts, so the
sizes are always given explicitly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
from pydantic import Field

from autofusion.fusion_core.ir import constant_tensor
from autofusion.fusion_core.patterns import Match, PatternSpec
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched

__all__ = ["MergeSiblings"]

# Split's sizes became an input in opset 13; a negative axis is allowed from opset 11.
_SPLIT_SIZES_AS_INPUT = 13
_SPLIT_NEGATIVE_AXIS = 11

_Sibling = tuple[ir.Node, ir.Node | None]  # (MatMul, its bias Add or None)


class MergeSiblingsParams(Params):
    matmul_nodes: list[str] = Field(min_length=2)
    # One bias Add per MatMul, in the same order, or none at all.
    add_nodes: list[str] = Field(default_factory=list)


class MergeSiblings(Rewriter):
    name = "merge_siblings"
    Params = MergeSiblingsParams

    def cost_effect(self, match: Match, params: MergeSiblingsParams) -> RewriteEffect:
        # One MatMul over the concatenated weights (and one Add of the biases) and a
        # Split: the shared input is read once instead of once per sibling; every output
        # is still written and the FLOPs are kept. The Split counts as a launch, its copy
        # does not (runtimes may alias its outputs).
        kernels = 3 if params.add_nodes else 2
        return RewriteEffect(matched(match), kernels_after=kernels, intermediates_kept=True)

    def validate_params(self, raw: dict, pattern: PatternSpec) -> MergeSiblingsParams:
        params = super().validate_params(raw, pattern)
        ids = {n.id for n in pattern.nodes}
        for field_name in ("matmul_nodes", "add_nodes"):
            for node_id in getattr(params, field_name):
                if node_id not in ids:
                    raise ValueError(
                        f"rewriter.params.{field_name}: {node_id!r} names no node of the "
                        f"pattern (nodes are {sorted(ids)})"
                    )
        if params.add_nodes and len(params.add_nodes) != len(params.matmul_nodes):
            raise ValueError(
                "rewriter.params.add_nodes: give one Add per MatMul "
                f"({len(params.matmul_nodes)}), or none"
            )
        return params

    def rewrite(
        self, match: Match, params: MergeSiblingsParams, ctx: RewriteContext
    ) -> Rewrite | str:
        siblings = _siblings(match, params, ctx)
        weights = _weights(siblings)
        if isinstance(weights, str):
            return weights
        biases = _biases(siblings, weights) if params.add_nodes else None
        if isinstance(biases, str):
            return biases
        sizes = [w.shape[1] for w in weights]
        axis = _split_axis(siblings[0][0], ctx.opset)
        if isinstance(axis, str):
            return axis
        prefix = _common_prefix([mm.inputs[1].name or "" for mm, _ in siblings])
        rows = [weights[0].shape[0]]
        merged = ctx.tensor_initializer(f"{prefix}merged_weight", _merged(weights, rows, sizes))
        matmul = ir.Node("", "MatMul", [siblings[0][0].inputs[0], merged])
        new_nodes, result = [matmul], matmul.outputs[0]
        if biases is not None:
            dtype = weights[0].dtype
            bias = ctx.tensor_initializer(
                f"{prefix}merged_bias", _merged(biases, [], sizes, _as_bias_of(dtype), dtype)
            )
            merged_add = ir.Node("", "Add", [result, bias])
            new_nodes.append(merged_add)
            result = merged_add.outputs[0]
        for node in new_nodes:  # so that patterns of the next round see type and shape
            _set_merged_type(node.outputs[0], siblings[0][0].outputs[0], sum(sizes))
        split = _split_node(result, sizes, axis, ctx, f"{prefix}merged_split")
        new_nodes.append(split)
        olds = [(add if add is not None else mm).outputs[0] for mm, add in siblings]
        return Rewrite(new_nodes, list(zip(olds, split.outputs, strict=True)))


def _siblings(match: Match, params: MergeSiblingsParams, ctx: RewriteContext) -> list[_Sibling]:
    """(MatMul, Add or None) per sibling, in graph order (the matcher may bind siblings
    with bias Adds in any order)."""
    adds = params.add_nodes or [None] * len(params.matmul_nodes)
    siblings = [
        (match.node(m), match.node(a) if a is not None else None)
        for m, a in zip(params.matmul_nodes, adds, strict=True)
    ]
    return sorted(siblings, key=lambda s: ctx.positions.get(id(s[0]), 0))


def _weights(siblings: list[_Sibling]) -> list[ir.TensorProtocol] | str:
    """The tensors of the constant 2-D weights, which must share the input, their leading
    dimension and dtype. Not read: dtypes and shapes are known without it."""
    first = siblings[0][0]
    weights = []
    for mm, _ in siblings:
        if mm.inputs[0] is not first.inputs[0]:
            return f"MatMul {mm.name!r} does not read the input of MatMul {first.name!r}"
        value = mm.inputs[1]
        tensor = constant_tensor(value)
        if tensor is None:
            return f"the weight {value.name!r} of MatMul {mm.name!r} is not a constant"
        if len(tensor.shape) != 2:
            return f"the weight {value.name!r} of MatMul {mm.name!r} is not 2-D"
        weights.append(tensor)
    head = weights[0]
    for (mm, _), tensor in zip(siblings[1:], weights[1:], strict=True):
        if tensor.shape[0] != head.shape[0] or tensor.dtype != head.dtype:
            return (
                f"the weight {mm.inputs[1].name!r} ({_show(tensor)}) does not share the "
                f"leading dimension and dtype of {first.inputs[1].name!r} ({_show(head)})"
            )
    return weights


def _show(tensor: ir.TensorProtocol) -> str:
    """``[8, 16], float32``: shape and numpy dtype, as the reasons name them."""
    return f"{list(tensor.shape)}, {tensor.dtype.numpy()}"


def _biases(
    siblings: list[_Sibling], weights: list[ir.TensorProtocol]
) -> list[ir.TensorProtocol] | str:
    """Each bias's tensor, one that varies only along its MatMul's last axis (a vector of
    its width, a scalar, [1, N]...), or why it is not one. Not read: shapes suffice."""
    biases = []
    for (mm, add), weight in zip(siblings, weights, strict=True):
        assert add is not None
        others = [v for v in add.inputs if v is not mm.outputs[0]]
        tensor = constant_tensor(others[0]) if len(others) == 1 else None
        if tensor is None:
            return f"Add {add.name!r} does not add a constant bias to MatMul {mm.name!r}"
        dims, width, out_shape = list(tensor.shape), weight.shape[1], mm.outputs[0].shape
        max_rank = len(out_shape) if out_shape is not None else 1
        per_column = all(d == 1 for d in dims[:-1]) and tensor.size in (1, width)
        if not per_column or len(dims) > max_rank:
            return (
                f"the bias {others[0].name!r} of Add {add.name!r} has shape "
                f"{dims}: it must vary only along the last axis of "
                f"MatMul {mm.name!r} ({out_shape})"
            )
        biases.append(tensor)
    return biases


_Part = Callable[[np.ndarray, int], np.ndarray]  # a source's array -> its block of width


def _as_bias_of(dtype: ir.DataType) -> _Part:
    """A bias's array as a vector of its MatMul's width, in the weights' dtype."""

    def block(array: np.ndarray, width: int) -> np.ndarray:
        return np.broadcast_to(array.reshape(-1), (width,)).astype(dtype.numpy())

    return block


def _merged(
    sources: Sequence[ir.TensorProtocol],
    lead: list[int],
    widths: list[int],
    part: _Part | None = None,
    dtype: ir.DataType | None = None,
) -> ir.LazyTensor:
    """The sources side by side along the last axis, as a tensor of shape ``[*lead,
    sum(widths)]`` read when asked (``part`` makes each source's block of its width).

    Each read fills a new array block by block (what ``np.concatenate`` of the blocks
    gives, byte for byte) and releases each source's data-file mapping once its block
    is copied: a mapped tensor stays resident until ``release``, so the merged bytes
    and one source are all a read holds. Nothing is cached: a save writes the array
    and drops it."""
    dtype = dtype or sources[0].dtype
    shape = [*lead, sum(widths)]

    def read() -> ir.Tensor:
        array = np.empty(shape, dtype=dtype.numpy())
        start = 0
        for tensor, width in zip(sources, widths, strict=True):
            block = tensor.numpy() if part is None else part(tensor.numpy(), width)
            array[..., start : start + width] = block
            del block  # the mapping's last view: release may close it
            _release(tensor)
            start += width
        return ir.Tensor(array, dtype=dtype)

    return ir.LazyTensor(read, dtype=dtype, shape=ir.Shape(shape))


def _release(tensor: ir.TensorProtocol) -> None:
    """Unmap a data-file tensor just read. A view of it someone else still holds keeps
    the mapping open (closing it raises BufferError); it maps again when next read."""
    if isinstance(tensor, ir.ExternalTensor):
        with contextlib.suppress(BufferError):
            tensor.release()


def _set_merged_type(value: ir.Value, sibling: ir.Value, width: int) -> None:
    """``value`` is ``sibling`` widened to ``width`` along the last axis."""
    value.type = sibling.type
    if sibling.shape is not None and len(sibling.shape) > 0:
        value.shape = ir.Shape([*sibling.shape.dims[:-1], width])


def _split_axis(matmul: ir.Node, opset: int) -> int | str:
    if opset >= _SPLIT_NEGATIVE_AXIS:
        return -1
    shape = matmul.outputs[0].shape
    if shape is None:
        return f"the rank of {matmul.outputs[0].name!r} is unknown and opset {opset} < 11"
    return len(shape) - 1


def _split_node(
    value: ir.Value, sizes: list[int], axis: int, ctx: RewriteContext, hint: str
) -> ir.Node:
    attrs = [ir.AttrInt64("axis", axis)]
    if ctx.opset >= _SPLIT_SIZES_AS_INPUT:
        split = ctx.initializer(hint, np.array(sizes, dtype=np.int64))
        return ir.Node("", "Split", [value, split], attrs, num_outputs=len(sizes))
    attrs.append(ir.AttrInt64s("split", sizes))
    return ir.Node("", "Split", [value], attrs, num_outputs=len(sizes))


def _common_prefix(names: list[str]) -> str:
    """``l0.q.weight``, ``l0.k.weight`` -> ``l0.``: the shared part, cut at a separator."""
    prefix = os.path.commonprefix(names)
    cut = max(prefix.rfind(sep) for sep in "./_:")
    return prefix[: cut + 1] if cut >= 0 else ""
