"""Hypothesis strategies for a model whose ``value_info`` lies about sizes.

Inferred labels are not proofs: onnxruntime's symbolic inference merges two symbols it
cannot compare ("auto-merge"), and a stale ``value_info`` can say anything. A rule that
decides on labels rather than on sizes the graph proves (``fusion_core.sizes``) then
rewrites a block that only looked right. ``lies(model)`` draws such variants of a model
(onnx's own inference first writes the labels of every inner value):

* ``merge``: every label of one symbol says another (``h`` read as ``l``);
* ``relabel``: one axis of an inner value labelled with a graph input's symbol;
* ``drop``: one inner value's label removed (unknown).

``stale(model)`` draws another kind (``stale_layouts`` lists them all): numbers, not
symbols. A ``value_info`` written before a pass changed a layout gives two fixed axes
each other's sizes (``[B, S, 4, 2]`` of ``[B, S, 2, 4]`` heads), on one value or on every
value of that layout. onnxruntime checks such a label only where its own inference
reaches (not through a Reshape target computed from shapes, nor a contrib op): the
lying model may not run, and a test reads only those that do.

Graph inputs and outputs keep their declarations: they are the model's interface. The
labels are written into ``value_info`` (where the pipeline's loading keeps them) and the
original model stays runnable: onnxruntime does not check symbolic labels against run-time
sizes. It does plan buffer reuse by them, so a rewrite that lets its inference carry a lie
onto a value of another size can stop the fused model (``heads_in_batch``'s unfold did).
"""

from __future__ import annotations

import onnx
from hypothesis import strategies as st

__all__ = [
    "dropped",
    "inferred",
    "input_symbols",
    "lies",
    "merged",
    "relabelled",
    "relabellings",
    "stale",
    "stale_layouts",
    "swapped",
]


def inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with onnx's labels (data propagation on) on its inner values."""
    return onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)


def input_symbols(model: onnx.ModelProto) -> list[str]:
    """The symbols the graph inputs declare, in order, each once."""
    found: list[str] = []
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param and dim.dim_param not in found:
                found.append(dim.dim_param)
    return found


def merged(model: onnx.ModelProto, gone: str, kept: str) -> onnx.ModelProto:
    """Every inner label ``gone`` written ``kept``: an inference's auto-merge."""
    lying = _copy(model)
    for value in lying.graph.value_info:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == gone:
                dim.dim_param = kept
    return lying


def relabelled(model: onnx.ModelProto, name: str, axis: int, symbol: str) -> onnx.ModelProto:
    """The inner value ``name`` labelled ``symbol`` on ``axis``."""
    lying = _copy(model)
    for value in lying.graph.value_info:
        dims = value.type.tensor_type.shape.dim
        if value.name == name and axis < len(dims):
            dims[axis].Clear()
            dims[axis].dim_param = symbol
    return lying


def dropped(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """The inner value ``name`` with no label at all."""
    lying = _copy(model)
    kept = [v for v in lying.graph.value_info if v.name != name]
    del lying.graph.value_info[:]
    lying.graph.value_info.extend(kept)
    return lying


def lies(model: onnx.ModelProto) -> st.SearchStrategy[tuple[str, onnx.ModelProto]]:
    """(what was lied, the lying model) of ``model`` once inferred."""
    base = inferred(model)
    symbols = input_symbols(base)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in base.graph.value_info}
    inner = sorted(n for n, r in ranks.items() if r > 0)
    # one direction per pair: either way the two sizes read as one
    pairs = [(a, b) for i, a in enumerate(symbols) for b in symbols[i + 1 :]]
    options = []
    if pairs:
        options.append(
            st.sampled_from(pairs).map(lambda p: (f"merge {p[0]}->{p[1]}", merged(base, *p)))
        )
    options.append(st.sampled_from(inner).map(lambda n: (f"drop {n}", dropped(base, n))))
    if symbols and inner:
        options.append(
            st.tuples(st.sampled_from(inner), st.integers(0, 7), st.sampled_from(symbols))
            .filter(lambda t: t[1] < ranks[t[0]])
            .map(lambda t: (f"relabel {t[0]}[{t[1]}]={t[2]}", relabelled(base, *t)))
        )
    return st.one_of(options)


def relabellings(model: onnx.ModelProto) -> list[tuple[str, onnx.ModelProto]]:
    """(what was lied, the lying model) for every ``relabel`` of ``model`` once inferred:
    each axis of each inner value given each graph input's symbol it does not carry.
    ``lies`` draws one of them; a block's one bad relabel among a hundred and more can
    take a 200-example run to find."""
    base = inferred(model)
    found = []
    for value in base.graph.value_info:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            for symbol in input_symbols(base):
                if dim.dim_param != symbol:
                    lie = f"relabel {value.name}[{axis}]={symbol}"
                    found.append((lie, relabelled(base, value.name, axis, symbol)))
    return found


def swapped(model: onnx.ModelProto, names: list[str], axes: tuple[int, int]) -> onnx.ModelProto:
    """The inner values ``names`` with the numbers on ``axes`` swapped."""
    lying = _copy(model)
    for value in lying.graph.value_info:
        if value.name in names:
            dims = value.type.tensor_type.shape.dim
            first, second = dims[axes[0]].dim_value, dims[axes[1]].dim_value
            dims[axes[0]].dim_value, dims[axes[1]].dim_value = second, first
    return lying


def stale_layouts(model: onnx.ModelProto) -> list[tuple[str, onnx.ModelProto]]:
    """(what was lied, the lying model) for every pair of fixed axes of different sizes
    of every inner value of ``model`` once inferred: that value alone swapped, and every
    value with the same two sizes on the same axes."""
    base = inferred(model)
    layouts: dict[tuple[int, int, int, int], list[str]] = {}
    for value in base.graph.value_info:
        dims = value.type.tensor_type.shape.dim
        fixed = [(a, d.dim_value) for a, d in enumerate(dims) if d.HasField("dim_value")]
        for i, (a, p) in enumerate(fixed):
            for b, q in fixed[i + 1 :]:
                if p != q:
                    layouts.setdefault((a, b, p, q), []).append(value.name)
    found = []
    for (a, b, p, q), names in sorted(layouts.items()):
        found += [(f"swap {n}[{a}, {b}]", swapped(base, [n], (a, b))) for n in names]
        if len(names) > 1:
            found.append((f"swap every [{a}]={p}, [{b}]={q}", swapped(base, names, (a, b))))
    return found


def stale(model: onnx.ModelProto) -> st.SearchStrategy[tuple[str, onnx.ModelProto]]:
    """One of ``stale_layouts(model)``."""
    return st.sampled_from(stale_layouts(model))


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    lying = onnx.ModelProto()
    lying.CopyFrom(model)
    return lying
