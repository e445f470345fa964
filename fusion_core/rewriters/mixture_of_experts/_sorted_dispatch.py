"""Experts dispatched by sorting: each expert's linear on its slab of the sorted tokens.

A third spelling of a block of experts, beside the stacked weights gathered by the
router's indices (``_block.py``) and one SwiGLU MLP per expert (``_units.py``): the
(token, choice) slots are sorted by the expert chosen, the tokens read in that order and
cut into one slab per expert by the number of slots each expert got; each slab goes
through its own expert's linear, the slabs are concatenated back, and the results are
added into their tokens weighted by the gates::

    order = argsort(chosen.flatten());  t = order // k;  w = gates.flatten()[order]
    n_e = #{slots that chose e};  S_0 .. S_{E-1} = split(x[t], n)    (e ascending)
    h = concat_e(S_e @ W1_e^T [+ b1_e]);  a = silu(gate(h)) * up(h)
    y = concat_e(split(a, n)_e @ W2_e^T [+ b2_e]);  out[t] += w * y   (index_add)

so ``out[t] = sum_j w[t, j] expert_e(x[t])`` with ``e = chosen[t, j]``: what
com.microsoft.MoE computes. This module finds the per-expert linears of each projection
(``SlabLinears``): a Split along axis 0 into E parts, part e multiplied by a constant 2-D
weight (a MatMul by [in, out]; a Gemm, B transposed or not, with a constant C or
without; the weight a constant or row e of a constant [E, a, b] taken by a Gather),
a constant bias added or not; and stacks each projection's weights [E, out, in]. Whether
part e holds expert e's tokens, the sort is a permutation and the gates are the chosen
ones is not read from the ops: the proof runs the block (``_proof.py``). The split's sizes
must be computed: constant sizes are one trace's counts, right only for the routing
that was traced.

Experts around another computation (a mixture of attention heads: the experts' query
projections, an attention, their output projections) are no MoE op: ``experts_around``
says what lies between the two projections and why the kernel cannot compute it (an
attention mixes the tokens' rows; the kernel's expert is an elementwise activation
between two linears on one row), nor either projection alone short of an identity
second weight that at least doubles the work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.mixture_of_experts._walk import computing, walk_back

__all__ = ["SlabLinears", "experts_around", "slab_linears"]

# Why no com.microsoft.MoE computes experts around another computation. The kernel's
# expert is fc2(act(fc1(x))) on one row per token, act elementwise (onnxruntime 1.32's
# CPU kernel: relu, gelu, silu, swiglu, identity), fc2 back to the row's width, and it
# sums a token's k experts weighted. Each projection alone is one linear per slot (the
# query's k results per token kept apart, the output's k inputs per token different
# rows): the kernel takes that only slot by slot, k = 1 over the T * k slots under a
# one-hot router with identity activation, and its fc2 back to the input's width must
# then be an identity (zero-padded where the widths differ), at least doubling the
# multiply-adds of the per-expert Gemms the graph already runs on the sorted slabs,
# which measured faster than the kernel even for true MLP experts (docs/patterns.md).
_MIXES_TOKENS = (
    "what lies between mixes the rows of different tokens, where com.microsoft.MoE "
    "applies an elementwise activation to each row between its two weights and sums a "
    "token's k experts, so no MoE computes the block"
)
_READS_MORE = (
    "what lies between reads values other than the tokens' rows, where com.microsoft.MoE "
    "applies an elementwise activation to each row between its two weights, so no MoE "
    "computes the block"
)
_ONE_MLP = (
    "com.microsoft.MoE takes experts that are one MLP each (an elementwise activation "
    "between two linears on each row)"
)
_NOR_ALONE = (
    "nor either projection alone (one linear per slot, a token's k slots not summed or "
    "not one row): the kernel would take it only slot by slot (k = 1, a one-hot router, "
    "identity activation, an identity second weight), at least twice the multiply-adds "
    "of the per-expert Gemms the graph already runs on the sorted slabs"
)
_WALK_LIMIT = 3000  # nodes walked back from a block's output to say what is around
_MOST_OPS = 8  # op types named between the projections
_MOST_READS = 3  # outside values named
# Ops that move or index data: not named among what lies between the projections
# (the unsort and re-sort of the slots, the head reshapes), what computes is.
_MOVES = frozenset(
    {
        *("Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Cast"),
        *("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tile"),
        *("Concat", "Split", "Slice", "Gather", "GatherND", "GatherElements"),
        *("ScatterND", "ScatterElements"),
    }
)


@dataclass
class SlabLinears:
    """One projection of the experts: ``linears[e]`` multiplies part e of ``split``."""

    split: ir.Node
    linears: list[ir.Node]
    weight: np.ndarray  # [experts, out, in]
    bias: np.ndarray | None  # [experts, out]


def _attrs(node: ir.Node) -> dict:
    return {a.name: a.value for a in node.attributes.values()}


class _Weights:
    """Each expert's constants: read from a constant, or from row e of a stacked constant
    taken by a Gather (each stacked constant read once)."""

    def __init__(self) -> None:
        self._stacked: dict[int, np.ndarray | None] = {}

    def take(self, value: ir.Value | None, ndim: int) -> np.ndarray | None:
        """``value`` as a constant of rank ``ndim``: a constant, or a Gather along axis 0
        of row i (a constant scalar) of a constant of rank ``ndim + 1``."""
        array = constant_array(value)
        if array is not None:
            return array if array.ndim == ndim else None
        node = value.producer() if value is not None else None
        if node is None or node.op_type != "Gather" or _attrs(node).get("axis", 0) != 0:
            return None
        index = constant_array(node.inputs[1])
        if index is None or index.ndim != 0:
            return None
        key = id(node.inputs[0])
        if key not in self._stacked:
            self._stacked[key] = constant_array(node.inputs[0])
        stacked = self._stacked[key]
        if stacked is None or stacked.ndim != ndim + 1 or not -len(stacked) <= index < len(stacked):
            return None
        return stacked[int(index)]

    def bias(self, value: ir.Value | None, width: int) -> np.ndarray | None:
        """``value`` as a constant [width] (or [1, width]) bias."""
        for ndim in (1, 2):
            array = self.take(value, ndim)
            if array is not None and array.size == width and array.shape[-1] == width:
                return array.reshape(width)
        return None


def _bias_after(node: ir.Node, width: int, weights: _Weights) -> np.ndarray | None:
    """The constant [out] added to ``node``'s product by the one Add that reads it."""
    uses = list(node.outputs[0].uses())
    if len(uses) != 1 or uses[0].node.op_type != "Add":
        return None
    return weights.bias(uses[0].node.inputs[1 - uses[0].idx], width)


def _linear(slab: ir.Value, weights: _Weights) -> tuple[ir.Node, np.ndarray, object] | None:
    """(node, [out, in], bias [out] or None) of the one linear that reads ``slab``."""
    uses = list(slab.uses())
    if len(uses) != 1 or uses[0].idx != 0:
        return None
    node = uses[0].node
    if node.op_type not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    matrix = weights.take(node.inputs[1], 2)
    if matrix is None:
        return None
    if node.op_type == "MatMul":
        return node, matrix.T, _bias_after(node, matrix.shape[1], weights)
    attrs = _attrs(node)
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
        return None
    matrix = matrix if attrs.get("transB", 0) else matrix.T
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is None:
        return node, matrix, _bias_after(node, len(matrix), weights)
    bias = weights.bias(c, len(matrix))
    if bias is None or attrs.get("beta", 1.0) != 1.0:
        return None
    return node, matrix, bias


def _group(split: ir.Node, weights: _Weights) -> SlabLinears | None:
    """The split's parts each through its own constant linear, all of one shape."""
    found = [_linear(part, weights) for part in split.outputs]
    if any(f is None for f in found):
        return None
    shapes = {f[1].shape for f in found}
    biased = {f[2] is None for f in found}
    if len(shapes) != 1 or len(biased) != 1:
        return None
    stacked = np.stack([f[1] for f in found])
    bias = None if found[0][2] is None else np.stack([f[2] for f in found])
    return SlabLinears(split, [f[0] for f in found], stacked, bias)


def _constant_sizes(split: ir.Node) -> bool:
    sizes = split.inputs[1] if len(split.inputs) > 1 else None
    return "split" in split.attributes or sizes is None or constant_array(sizes) is not None


def _groups(nodes: list[ir.Node], experts: int) -> list[SlabLinears]:
    """The projections among ``nodes`` (in their order): Splits into ``experts`` parts
    along axis 0, each part through its own constant linear."""
    weights, groups = _Weights(), []
    for node in nodes:
        if node.op_type != "Split" or len(node.outputs) != experts or experts < 2:
            continue
        if _attrs(node).get("axis", 0) != 0:
            continue
        group = _group(node, weights)
        if group is not None:
            groups.append(group)
    return groups


def slab_linears(nodes: list[ir.Node], experts: int) -> list[SlabLinears] | str | None:
    """The experts' projections over slabs of the sorted tokens, in ``nodes``' order (two:
    a fused gate/up and a down; three: gate, up and down); why they cannot be experts
    (a string); None where there are not two."""
    groups = _groups(nodes, experts)
    if len(groups) < 2:
        return None
    fixed = [g.split for g in groups if _constant_sizes(g.split)]
    if fixed:
        return (
            f"the experts' linears on the slabs of the tokens sorted by expert: Split "
            f"{fixed[0].name!r} cuts them by constant sizes (one trace's count per expert), "
            "not by the count the router gives each expert"
        )
    return groups


def _between(first: SlabLinears, second: SlabLinears, nodes: dict[int, ir.Node]) -> list[ir.Node]:
    """The nodes on a path from ``first``'s products to ``second``'s Split."""
    before = computing(nodes, [second.split.inputs[0]])
    after: dict[int, ir.Node] = {}
    frontier = list(first.linears)
    while frontier:
        node = frontier.pop()
        for value in node.outputs:
            for use in value.uses():
                reader = use.node
                if id(reader) in before and id(reader) not in after:
                    after[id(reader)] = reader
                    frontier.append(reader)
    return list(after.values())


def experts_around(graph: ir.Graph, output: ir.Value, stops: set[int], experts: int) -> str | None:
    """Why the block computing ``output`` is experts around another computation (two
    projections over slabs of the sorted tokens, something between them that reads more
    than the hidden states), or None if it is not."""
    walked = walk_back(output, stops, _WALK_LIMIT)
    if walked is None:
        return None
    nodes, reads = walked
    order = {id(n): i for i, n in enumerate(graph)}
    ordered = sorted((n for n in nodes.values() if id(n) in order), key=lambda n: order[id(n)])
    groups = _groups(ordered, experts)
    if len(groups) < 2:
        return None
    first, second = groups[0], groups[1]
    between = sorted(_between(first, second, nodes), key=lambda n: order.get(id(n), 0))
    ops = list(dict.fromkeys(n.op_type for n in between if n.op_type not in _MOVES))
    attention = "Softmax" in ops and "MatMul" in ops or any("Attention" in op for op in ops)
    what = [*ops[:_MOST_OPS], *(["..."] if len(ops) > _MOST_OPS else [])]
    if reads:
        what.append(
            "reading " + ", ".join(repr(v.name) for v in list(reads.values())[:_MOST_READS])
        )
    outside = _READS_MORE if reads else _ONE_MLP
    why = f"{_MIXES_TOKENS}; {_NOR_ALONE}" if attention else outside
    return (
        f"experts around {'an attention' if attention else 'another computation'} "
        f"({', '.join(what) or 'data movement only'}) between their two projections (the "
        f"linears on the slabs of Splits {first.split.name!r} and {second.split.name!r}): "
        f"{why}"
    )
