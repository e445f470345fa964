"""``shape_reads`` rewrites a Shape read only where the graph's structure proves each
dimension (``fusion_core/sizes.py``), never from a symbol a shape inference put on the
tensor it reads.

onnxruntime's symbolic inference auto-merged Kimi-Linear's padded length (the sequence
rounded up to a chunk) with ``sequence``; a read of the padded length then became
``Shape(input_ids)[1]``, and the graph computed with the unpadded length wherever the
padding was not zero. Here the padded value carries that label as value_info (a model
may bring it; the pre-pass inference never overwrites a known dim), as the auto-merge
left it on Kimi's graph, and its length divides a sum: a mean over the padded rows.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses
from autofusion.fusion_core.testing import build_model, optimize_quiet, run_both

EXACT = dict(rtol=0, atol=0)
WIDTH = 4


def _padded_mean(chunk: int) -> onnx.ModelProto:
    """x [batch, sequence, WIDTH] padded with zeros to a multiple of ``chunk`` rows, then
    the mean over the padded rows: the sum divided by the padded length, read by Shape."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {WIDTH}] x) => (float[batch, {WIDTH}] y) {{
        s1 = Shape <start = 1, end = 2> (x)
        rem = Mod (s1, chunk)
        gap = Sub (chunk, rem)
        pad_n = Mod (gap, chunk)
        pads = ScatterElements <axis = 0> (pads0, pad_at, pad_n)
        padded = Pad (x, pads)
        rows = Shape <start = 1, end = 2> (padded)
        total = ReduceSum <keepdims = 0> (padded, one)
        count = Cast <to = 1> (rows)
        y = Div (total, count)
    }}"""
    ints = {"chunk": [chunk], "pads0": [0] * 6, "pad_at": [4], "one": [1]}
    model = build_model(text, {k: np.array(v, np.int64) for k, v in ints.items()})
    model.graph.value_info.append(
        onnx.helper.make_tensor_value_info(
            "padded", onnx.TensorProto.FLOAT, ["batch", "sequence", WIDTH]
        )
    )
    return model


def _reads_of(model: ir.Model, name: str) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == "Shape" and n.inputs[0].name == name]


def test_the_padded_length_labelled_sequence_is_not_read_from_the_input() -> None:
    model = ir.from_proto(_padded_mean(4))
    run_prepasses(model, PrepassOptions())
    assert len(_reads_of(model, "padded")) == 1, [
        (n.op_type, n.inputs[0].name) for n in model.graph
    ]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.sampled_from([2, 4, 8]), length=st.integers(1, 11))
def test_the_mean_over_padded_rows_is_right_at_every_length(chunk: int, length: int) -> None:
    """Right only at the multiples of the chunk, before: the read of the padded length
    became the ids' length."""
    model = _padded_mean(chunk)
    fused = optimize_quiet(model, target="onnxruntime").to_proto()
    x = np.random.default_rng(length).standard_normal((2, length, WIDTH)).astype(np.float32)
    run_both(model, fused, feeds={"x": x}, **EXACT)


# Spellings of one entry of a Reshape target [batch, sequence, WIDTH] of an inner
# tensor: (lines of ONNX text writing entry ``e{i}``, whether it proves the size).
_SPELLINGS = {
    "gather": (
        "xs{i} = Shape (x)\n g{i} = Gather <axis = 0> (xs{i}, n{i})\n"
        " e{i} = Unsqueeze (g{i}, zero)",
        True,
    ),
    "slice": ("xs{i} = Shape (x)\n e{i} = Slice (xs{i}, at{i}, to{i})", True),
    "shape_range": ("e{i} = Shape <start = {a}, end = {b}> (x)", True),
    "inner": ("xs{i} = Shape (h)\n e{i} = Slice (xs{i}, at{i}, to{i})", True),
    "copy": ("e{i} = Identity (zero)", True),
    "rest": ("e{i} = Identity (minus1)", True),  # proven where every other entry is
    # Max(S, 1) is S only where S is not 0: unread, and proven only as the rest of the
    # elements, where it is the one entry unread and no -1 is beside it (a -1 or a second
    # unread entry leaves the rest unknown)
    "opaque": (
        "xs{i} = Shape (x)\n s{i} = Slice (xs{i}, at{i}, to{i})\n e{i} = Max (s{i}, one)",
        False,
    ),
}


def _reshaped(spellings: list[str], start: int, end: int) -> tuple[onnx.ModelProto, bool]:
    """``Shape(Reshape(Relu(x), target))[start:end]`` added to zeros, each target entry
    in its spelling; whether every entry read is proven."""
    lines, inits = [], {"zero": [0], "one": [1], "minus1": [-1], "zeros": [0] * (end - start)}
    for i, name in enumerate(spellings):
        lines.append(_SPELLINGS[name][0].format(i=i, a=i, b=i + 1))
        inits |= {f"at{i}": [i], f"to{i}": [i + 1], f"n{i}": i}
    # an opaque entry of the last axis reads x's constant WIDTH: Max(WIDTH, 1) is proven
    unread = [i for i, name in enumerate(spellings) if name == "opaque" and i < 2]
    alone = len(unread) == 1 and "rest" not in spellings  # the rest of the elements, then
    proven = all(
        (_SPELLINGS[name][1] or alone or i == 2) and not (name == "rest" and unread)
        for i, name in enumerate(spellings)
        if start <= i < end
    )
    body = "\n        ".join(lines)
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {WIDTH}] x) => (int64[{end - start}] y) {{
        h = Relu (x)
        {body}
        target = Concat <axis = 0> (e0, e1, e2)
        r = Reshape (h, target)
        read = Shape <start = {start}, end = {end}> (r)
        y = Add (read, zeros)
    }}"""
    return build_model(text, {k: np.array(v, np.int64) for k, v in inits.items()}), proven


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spellings=st.lists(st.sampled_from(sorted(_SPELLINGS)), min_size=3, max_size=3),
    bounds=st.sampled_from([(0, 3), (0, 1), (1, 2), (1, 3), (2, 3)]),
    batch=st.integers(1, 3),
    length=st.integers(1, 5),
)
def test_a_read_through_a_reshape_target_is_rewritten_where_each_entry_is_proven(
    spellings: list[str], bounds: tuple[int, int], batch: int, length: int
) -> None:
    """Entries read from the input's shape (Gather, Slice, Shape's start and end, an
    inner tensor's shape) or copied (0) prove their size, and ``-1`` where the others
    do; an entry through an op no reader follows (``Max(S, 1)``) does not, whatever the
    inference says of it, unless it is the one such entry with no ``-1`` beside it (then
    it is the rest of the elements, as a ``-1`` is). A proven read becomes reads of ``x``
    and constants; the model computes the same at every size either way."""
    if spellings.count("rest") > 1:
        spellings = [s if s != "rest" else "copy" for s in spellings]  # one -1 at most
    model, proven = _reshaped(spellings, *bounds)
    work = ir.from_proto(model)
    run_prepasses(work, PrepassOptions())
    assert (not _reads_of(work, "r")) == proven, spellings
    x = np.random.default_rng(length).standard_normal((batch, length, WIDTH))
    run_both(model, ir.to_proto(work), feeds={"x": x.astype(np.float32)}, **EXACT)
