"""Rule ``norm_spelling``: a normalization block in the one spelling the norm patterns
read (``rms_norm.yaml``, ``layer_norm.yaml``)::

    v = ReduceMean(Pow(d, 2));  y = Mul(d, Reciprocal(Sqrt(Add(v, eps))))
    d = Sub(x, ReduceMean(x))                                   (a LayerNorm's)

from any of the spellings ``_norm_reads`` reads (the square as ``Mul(d, d)``, a mean as
``ReduceSum / N``, no epsilon, the inverse root as ``Div(d, s)``, ``Div(1, s)`` or
``Pow(u, -0.5)``, the centering as ``Add(x, Neg(m))``). An L2 norm, ``d * rsqrt(sum(d^2)
+ eps)`` over N features (nGPT), is the RMS norm ``N^-1/2 * d * rsqrt(mean(d^2) + eps /
N)``: its sum becomes a mean, its epsilon ``eps / N``, and a constant per-feature scale
``N^-1/2`` follows the product, which the pattern reads as its gamma. Each step is the same value:
``d * d`` is ``d^2`` (onnxruntime computes ``Pow(d, 2)`` as ``d * d``), no epsilon is
``+ 0`` (exact: a mean of squares is never -0), ``x + (-m)`` is ``x - m`` bit for bit,
``1 / s`` is ``Reciprocal(s)``; ``sum / N`` and the mean, ``d / s`` and ``d * (1 / s)``,
``u^-0.5`` and ``1 / sqrt(u)`` differ in the last bit at most, as any fused kernel
differs from the graph it replaces. One form leaves one pattern per norm, whatever the
exporter or the family wrote.

A new node that stands for an old one takes its output's name and, in its provenance,
the old node's name (a helper it adds, such as the Reciprocal of ``d / s``, stands for
none), so a fusion's provenance names the input graph's nodes. Each part also records
the spelling it had (``_PART``): ``undo_norm_spellings`` writes back the parts no fusion
took, so a norm nothing fused comes out as it went in (below opset 23 the generic
target has no RMS norm op).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import new_initializer, take_place
from autofusion.fusion_core.canonical._norm_reads import (
    NormBlock,
    SumMean,
    SumSquares,
    centering,
    read_block,
    reduced_axes,
    scalar_constant,
    subtracted_mean,
)
from autofusion.fusion_core.provenance import REPLACED_NODES

__all__ = ["norm_spellings", "undo_norm_spellings"]

RULE = "norm_spelling"
_PART = "autofusion.norm_spelling"  # metadata key: the spelling a part had, for the undo
_CONSTANT = "autofusion.norm_spelling.constant"  # the name of the constant it read
_VALUES = "autofusion.norm_spelling.values"  # the names of the old spelling's inner values
_L2 = "autofusion.norm_spelling.l2"  # an L2 norm's scale node and epsilon, for the undo
_MEAN_AXES_INPUT = 18  # ReduceMean takes its axes as an input from opset 18
_SUM_AXES_INPUT = 13  # ReduceSum from opset 13
_REDUCE_ATTRIBUTES = ("keepdims", "noop_with_empty_axes")


def norm_spellings(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every normalization block in the patterns' spelling; how many parts."""
    done = 0
    for node in list(graph):
        if node.graph is not graph:
            continue  # replaced by an earlier block of this sweep
        block = read_block(node)
        if block is not None:
            done += _one_spelling(block, _Writer(graph, fresh_name, mark))
    return done


class _Writer:
    """The edits of one rule run: new nodes, constants, marks, and the swap of old
    nodes for new ones."""

    def __init__(self, graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> None:
        self.graph, self.fresh_name, self.mark = graph, fresh_name, mark

    def constant(self, like: ir.Value, number: float) -> ir.Value:
        return new_initializer(self.graph, self.fresh_name(f"{RULE}_constant"), number, like.dtype)

    def vector(self, like: ir.Value, number: float, size: int) -> ir.Value:
        """``number`` in each of ``size`` features, ``like``'s type."""
        name = self.fresh_name(f"{RULE}_scale")
        return new_initializer(self.graph, name, number, like.dtype, (size,))

    def node(self, op: str, inputs: list, like: ir.Value, attrs: list | None = None) -> ir.Node:
        """A new node whose output has ``like``'s type and shape, standing for no old
        node until ``swap`` says which."""
        new = ir.Node("", op, inputs, attrs or [], name=self.fresh_name(f"{RULE}_{op}"))
        out = new.outputs[0]
        out.dtype, out.shape = like.dtype, like.shape
        out.name = self.fresh_name(f"{like.name or RULE}_{op.lower()}")
        new.metadata_props[REPLACED_NODES] = "[]"
        return new

    def swap(
        self, old: list[ir.Node], new: list[ir.Node], part: str, constant: ir.Value | None = None
    ) -> ir.Node:
        """Put ``new`` in the place of ``old`` (the last of each is the one whose output
        is read); the last new node stands for ``old``, and names the ``constant`` the
        old spelling read, for the undo."""
        for node in new:
            node.metadata_props[self.mark], node.metadata_props[_PART] = RULE, part
        new[-1].metadata_props[REPLACED_NODES] = json.dumps([_name(n) for n in old])
        new[-1].metadata_props[_VALUES] = json.dumps([n.outputs[0].name for n in old[:-1]])
        if constant is not None and constant.name:
            new[-1].metadata_props[_CONSTANT] = constant.name
        self.graph.insert_before(old[0], new)
        take_place(old[-1].outputs[0], new[-1].outputs[0])
        self.graph.remove(old[::-1], safe=True)
        return new[-1]


def _name(node: ir.Node) -> str:
    return node.name or f"<{node.op_type}>"


def _one_spelling(block: NormBlock, w: _Writer) -> int:
    """Rewrite the parts of ``block`` not in the patterns' spelling; how many."""
    l2 = isinstance(block.mean, SumSquares)
    if l2 and not _l2_as_rms(block, w):
        return 0
    done = int(l2) + _centered(block.d, w)  # first: the parts after it read the new ``d``
    d = block.square.inputs[0]
    assert d is not None
    if block.square.op_type == "Mul":
        w.swap([block.square], [w.node("Pow", [d, w.constant(d, 2)], d)], "square")
        done += 1
    if isinstance(block.mean, SumMean):
        _as_mean(block.mean, w)
        done += 1
    if block.epsilon is None:  # the root reads the variance (its producer may be new)
        variance = block.root.inputs[0]
        assert variance is not None
        added = w.node("Add", [variance, w.constant(variance, 0)], variance)
        added.metadata_props[w.mark], added.metadata_props[_PART] = RULE, "epsilon"
        w.graph.insert_before(block.root, [added])
        block.root.replace_input_with(0, added.outputs[0])
        done += 1
    return done + _inverse(block, d, w)


def _inverse(block: NormBlock, d: ir.Value, w: _Writer) -> int:
    """Write the inverse root as ``Mul(d, Reciprocal(Sqrt(u)))``; 1 if it was not."""
    root = block.root
    if root.op_type == "Pow":  # Pow(u, -0.5)
        sqrt = w.node("Sqrt", [root.inputs[0]], root.outputs[0])
        rec = w.node("Reciprocal", [sqrt.outputs[0]], root.outputs[0])
        w.swap([root], [sqrt, rec], "pow", root.inputs[1])
        return 1
    s = root.outputs[0]
    if block.inverse is not None and block.inverse.op_type == "Div":  # Div(1, s)
        w.swap([block.inverse], [w.node("Reciprocal", [s], s)], "div_one", block.inverse.inputs[0])
        return 1
    if block.inverse is None:  # Div(d, s)
        inverse = w.node("Reciprocal", [s], s)
        product = w.node("Mul", [d, inverse.outputs[0]], block.product.outputs[0])
        w.swap([block.product], [inverse, product], "div")
        return 1
    return 0


def _centered(d: ir.Value, w: _Writer) -> int:
    """A LayerNorm's ``d`` as ``Sub(x, ReduceMean(x))``; how many parts were not."""
    done = 0
    found = centering(d)
    if found is not None:
        add, neg, _ = found
        x_second = add.inputs[0] is neg.outputs[0]  # where x was, for the undo
        x = add.inputs[1] if x_second else add.inputs[0]
        old = [neg, add] if len(neg.outputs[0].uses()) == 1 else [add]  # a shared Neg stays
        sub = w.swap(old, [w.node("Sub", [x, neg.inputs[0]], d)], f"centering:{x_second:d}")
        d = sub.outputs[0]
        done += 1
    mean = subtracted_mean(d)
    if mean is not None:
        _as_mean(mean, w)
        done += 1
    return done


def _l2_as_rms(block: NormBlock, w: _Writer) -> bool:
    """An L2 norm ``d * rsqrt(sum(d^2) + eps)`` over ``N`` features as the RMS norm
    ``N^-1/2 * d * rsqrt(mean(d^2) + eps / N)``: the same value (``sum = N * mean``),
    the ``N^-1/2`` a per-feature scale after the product, which the pattern reads as its
    gamma. False (nothing written) where the epsilon is no scalar constant."""
    mean = block.mean
    assert isinstance(mean, SumSquares)
    eps = scalar_constant(_other_input(block.epsilon, mean.reduce.outputs[0]))
    if block.epsilon is not None and eps is None:
        return False
    reduce, product = mean.reduce, block.product.outputs[0]
    scale = w.node("Mul", [product, w.vector(product, mean.count**-0.5, mean.count)], product)
    scale.metadata_props[w.mark], scale.metadata_props[_PART] = RULE, "l2_scale"
    w.graph.insert_after(block.product, [scale])
    take_place(product, scale.outputs[0])  # the readers, the name, the graph output
    scale.replace_input_with(0, product)  # which take_place gave the scale itself
    product.name = w.fresh_name(f"{RULE}_l2_product")
    attrs = [a for a in reduce.attributes.values() if a.name in _REDUCE_ATTRIBUTES]
    inputs, attrs = _axes_for(w.graph, reduce, attrs, _MEAN_AXES_INPUT, w.fresh_name)
    new = w.node("ReduceMean", inputs, reduce.outputs[0], attrs)
    eps_first = block.epsilon is not None and block.epsilon.inputs[1] is reduce.outputs[0]
    new.metadata_props[_L2] = json.dumps([scale.name, eps, eps_first])
    w.swap([reduce], [new], f"l2_mean:{mean.count}")
    if block.epsilon is not None:
        old_eps = _other_input(block.epsilon, new.outputs[0])
        added = w.node("Add", [new.outputs[0], w.constant(product, eps / mean.count)], product)
        w.swap([block.epsilon], [added], "l2_epsilon", old_eps)
    return True


def _other_input(node: ir.Node | None, value: ir.Value) -> ir.Value | None:
    if node is None or len(node.inputs) != 2:
        return None
    return node.inputs[1] if node.inputs[0] is value else node.inputs[0]


def _axes_for(
    graph: ir.Graph,
    reduce: ir.Node,
    attrs: list,
    opset_input: int,
    fresh_name: Callable[[str], str],
) -> tuple[list, list]:
    """The inputs and attributes of a Reduce* node with ``reduce``'s axes at this opset
    (an input from ``opset_input`` on, else the attribute)."""
    axes = reduced_axes(reduce)
    assert axes is not None
    inputs = [reduce.inputs[0]]
    if _opset(graph) >= opset_input and len(reduce.inputs) > 1:
        inputs.append(reduce.inputs[1])  # the same axes input
    elif _opset(graph) >= opset_input:
        inputs.append(new_initializer(graph, fresh_name(f"{RULE}_axes"), axes, ir.DataType.INT64))
    else:
        attrs = [*attrs, ir.AttrInt64s("axes", axes)]
    return inputs, attrs


def _as_mean(mean: SumMean, w: _Writer) -> None:
    """``ReduceSum(t) / N`` as one ``ReduceMean(t)`` with the same axes."""
    reduce, scale = mean.reduce, mean.scale
    axes = reduced_axes(reduce)
    assert axes is not None  # _norm_reads proved them
    attrs = [a for a in reduce.attributes.values() if a.name in _REDUCE_ATTRIBUTES]
    inputs = [reduce.inputs[0]]
    if _opset(w.graph) >= _MEAN_AXES_INPUT and len(reduce.inputs) > 1:
        inputs.append(reduce.inputs[1])  # the same axes input
    elif _opset(w.graph) >= _MEAN_AXES_INPUT:
        inputs.append(
            new_initializer(w.graph, w.fresh_name(f"{RULE}_axes"), axes, ir.DataType.INT64)
        )
    else:
        attrs.append(ir.AttrInt64s("axes", axes))
    constant = next(v for v in scale.inputs if v is not reduce.outputs[0])
    new = w.node("ReduceMean", inputs, scale.outputs[0], attrs)
    part = f"mean:{scale.op_type}:{scalar_constant(constant)!r}"
    w.swap([reduce, scale], [new], part, constant)


def _opset(graph: ir.Graph) -> int:
    return graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))


def undo_norm_spellings(graph: ir.Graph, mark: str) -> int:
    """Write back the spelling each part had where no fusion took it; how many."""
    undone = 0
    for node in list(graph):
        part = node.metadata_props.get(_PART) if node.metadata_props.get(mark) == RULE else None
        if part is None or node.graph is not graph:
            continue
        kind, _, detail = part.partition(":")
        step = _UNDO.get(kind)
        if step is not None and step(graph, node, detail):
            undone += 1
    return undone


def _put_back(graph: ir.Graph, old: list[ir.Node], written: list[ir.Node]) -> None:
    """Put ``old`` (the spelling the graph had, named as its nodes were, from the last:
    a Neg other readers kept has no name here) where the ``written`` nodes stand; the
    last of each gives the output."""
    names = json.loads(written[-1].metadata_props.get(REPLACED_NODES, "[]"))
    for node, name in zip(old[::-1], names[::-1], strict=False):
        node.name = name if not name.startswith("<") else None
    inner = json.loads(written[-1].metadata_props.get(_VALUES, "[]"))
    for node, name in zip(old[-2::-1], inner[::-1], strict=False):
        node.outputs[0].name = name
    out, again = written[-1].outputs[0], old[-1].outputs[0]
    again.dtype, again.shape = out.dtype, out.shape
    graph.insert_before(written[0], old)
    take_place(out, again)
    graph.remove(written[::-1], safe=True)


def _constant_like(graph: ir.Graph, node: ir.Node, what: str, number: float) -> ir.Value:
    """The constant the old spelling read, where it is still there, else a new one."""
    found = graph.initializers.get(node.metadata_props.get(_CONSTANT, ""))
    if found is not None and scalar_constant(found) == number:
        return found
    return new_initializer(graph, f"{node.name}_{what}", number, node.outputs[0].dtype)


def _undo_square(graph: ir.Graph, node: ir.Node, detail: str) -> bool:
    _put_back(graph, [ir.Node("", "Mul", [node.inputs[0], node.inputs[0]])], [node])
    return True


def _undo_epsilon(graph: ir.Graph, node: ir.Node, detail: str) -> bool:
    if node.outputs[0].is_graph_output():
        return False
    node.outputs[0].replace_all_uses_with(node.inputs[0])  # type: ignore[arg-type]
    graph.remove(node, safe=True)
    return True


def _undo_centering(graph: ir.Graph, node: ir.Node, detail: str) -> bool:
    x, mean = node.inputs
    neg = ir.Node("", "Neg", [mean])
    neg.outputs[0].dtype, neg.outputs[0].shape = mean.dtype, mean.shape  # type: ignore[union-attr]
    inputs = [neg.outputs[0], x] if detail == "1" else [x, neg.outputs[0]]  # as it was
    _put_back(graph, [neg, ir.Node("", "Add", inputs)], [node])
    return True


def _undo_mean(graph: ir.Graph, node: ir.Node, detail: str) -> bool:
    op, _, factor = detail.partition(":")
    axes = reduced_axes(node)
    if axes is None:
        return False
    attrs = [a for a in node.attributes.values() if a.name in _REDUCE_ATTRIBUTES]
    inputs = [node.inputs[0]]
    if _opset(graph) >= _SUM_AXES_INPUT and len(node.inputs) > 1:
        inputs.append(node.inputs[1])  # the same axes input
    elif _opset(graph) >= _SUM_AXES_INPUT:
        inputs.append(new_initializer(graph, f"{node.name}_axes", axes, ir.DataType.INT64))
    else:
        attrs.append(ir.AttrInt64s("axes", axes))
    summed = ir.Node("", "ReduceSum", inputs, attrs)
    summed.outputs[0].dtype = node.outputs[0].dtype
    constant = _constant_like(graph, node, "count", float(np.float32(factor)))
    _put_back(graph, [summed, ir.Node("", op, [summed.outputs[0], constant])], [node])
    return True


def _undo_inverse(graph: ir.Graph, node: ir.Node, detail: str) -> bool:
    """The inverse root back, from the node that ends what the rule wrote: the Mul of
    ``div``, the Reciprocal of ``pow`` and ``div_one``."""
    part, first = node.metadata_props[_PART], node.inputs[0]
    if part == "div" and node.op_type == "Mul":
        inverse = node.inputs[1].producer() if node.inputs[1] is not None else None
        if inverse is None or inverse.metadata_props.get(_PART) != "div":
            return False
        _put_back(graph, [ir.Node("", "Div", [first, inverse.inputs[0]])], [inverse, node])
        return True
    if node.op_type != "Reciprocal" or part == "div":
        return False  # the Sqrt of ``pow``, the Reciprocal of ``div``: undone with the rest
    if part == "div_one":
        one = _constant_like(graph, node, "one", 1)
        _put_back(graph, [ir.Node("", "Div", [one, first])], [node])
        return True
    sqrt = first.producer() if first is not None else None
    if sqrt is None or sqrt.metadata_props.get(_PART) != "pow" or len(first.uses()) != 1:  # type: ignore[union-attr]
        return False
    half = _constant_like(graph, node, "exponent", -0.5)
    _put_back(graph, [ir.Node("", "Pow", [sqrt.inputs[0], half])], [sqrt, node])
    return True


def _undo_l2(graph: ir.Graph, node: ir.Node, detail: str) -> bool:
    """An L2 norm back from its ReduceMean: the ReduceSum, the epsilon as it was (the
    Add reading the mean, if the rule wrote one) and no scale after the product."""
    scale_name, eps, eps_first = json.loads(node.metadata_props[_L2])
    scale = next((n for n in graph if n.name == scale_name), None)
    if scale is None:
        return False
    readers = [use.node for use in node.outputs[0].uses()]
    epsilon = readers[0] if len(readers) == 1 else None
    if epsilon is not None and epsilon.metadata_props.get(_PART) != "l2_epsilon":
        epsilon = None
    attrs = [a for a in node.attributes.values() if a.name in _REDUCE_ATTRIBUTES]
    name = node.name or RULE
    inputs, attrs = _axes_for(graph, node, attrs, _SUM_AXES_INPUT, lambda h: f"{name}_{h}")
    summed = ir.Node("", "ReduceSum", inputs, attrs)
    _put_back(graph, [summed], [node])
    if epsilon is not None:
        constant = _constant_like(graph, epsilon, "epsilon", eps)
        inputs = [constant, summed.outputs[0]] if eps_first else [summed.outputs[0], constant]
        _put_back(graph, [ir.Node("", "Add", inputs)], [epsilon])
    product = scale.inputs[0]
    take_place(scale.outputs[0], product)
    graph.remove(scale, safe=True)
    return True


_UNDO: dict[str, Callable[[ir.Graph, ir.Node, str], bool]] = {
    "l2_mean": _undo_l2,
    "square": _undo_square,
    "epsilon": _undo_epsilon,
    "centering": _undo_centering,
    "mean": _undo_mean,
    "pow": _undo_inverse,
    "div_one": _undo_inverse,
    "div": _undo_inverse,
}
