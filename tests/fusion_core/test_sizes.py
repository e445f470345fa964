"""``fusion_core/sizes.py`` proves sizes from the graph's structure: each case reads the
shape of an inner tensor (``Shape(t)[a:b]``, added to zeros so it is no graph output)
and says whether the read is proven (the pre-pass then reads the graph inputs or
constants instead). Either way the model computes the same at every size tried: a
proof that is wrong fails there."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses
from autofusion.fusion_core.testing import build_model, run_both

EXACT = dict(rtol=0, atol=0)
INTS = {"zero": [0], "one": [1], "two": [2], "minus1": [-1], "end": [2**63 - 1]}

# name: (inputs, body ending in ``t``, read start, read end, proven, {input: dims(b, s)})
CASES = {
    "causal_conv": (
        "float[batch, 4, sequence] x",
        "p = Pad (x, conv_pads)\n t = Conv <kernel_shape = [3]> (p, w3)",
        0, 3, True, {"x": lambda b, s: (b, 4, s)},
    ),
    "strided_conv": (
        "float[batch, 3, 8, 8] x",
        "t = Conv <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]> (x, w33)",
        0, 4, True, {"x": lambda b, s: (b, 3, 8, 8)},
    ),
    "equal_split": (
        "float[batch, sequence, 6] x",
        "a, t, c = Split <axis = 2, num_outputs = 3> (x)",
        0, 3, True, {"x": lambda b, s: (b, s, 6)},
    ),
    "last_rows": (
        "float[batch, sequence, 4] x, int64[batch, sequence] mask",
        "ids = Shape <start = 1, end = 2> (x)\n back = Neg (ids)\n"
        " t = Slice (mask, back, end, one)",
        0, 2, True, {"x": lambda b, s: (b, s, 4), "mask": lambda b, s: (b, s)},
    ),
    "capped_positions": (
        "float[batch, sequence, 4] x",
        "s = Shape <start = 1, end = 2> (x)\n pos = Slice (table, zero, s, zero)\n"
        " t = Add (x, pos)",
        0, 3, True, {"x": lambda b, s: (b, s, 4)},
    ),
    "capped_alone": (
        "float[batch, sequence, 4] x",
        "s = Shape <start = 1, end = 2> (x)\n t = Slice (table, zero, s, zero)",
        0, 1, False, {"x": lambda b, s: (b, s, 4)},
    ),
    "heads_in_batch": (
        "float[batch, 4, sequence, 2] x",
        "s = Shape <start = 2, end = 3> (x)\n f = Concat <axis = 0> (minus1, s, two)\n"
        " r = Reshape (x, f)\n u = Concat <axis = 0> (minus1, four, s, two)\n"
        " t = Reshape (r, u)",
        0, 4, True, {"x": lambda b, s: (b, 4, s, 2)},
    ),
    "padded_batch": (
        "float[batch, sequence, 4] x",
        "s = Shape <start = 1, end = 2> (x)\n gap = Mod (s, three)\n"
        " pads = ScatterElements <axis = 0> (zeros6, four, gap)\n t = Pad (x, pads)",
        0, 1, True, {"x": lambda b, s: (b, s, 4)},
    ),
    "expanded_lengths": (  # repeat_kv's Expand of Concat(s, s): entries [s, s]
        "float[batch, sequence, 4] x",
        "s = Shape <start = 1, end = 2> (x)\n ss = Expand (s, two)\n t = ConstantOfShape (ss)",
        0, 2, True, {"x": lambda b, s: (b, s, 4)},
    ),
    "padded_length": (
        "float[batch, sequence, 4] x",
        "s = Shape <start = 1, end = 2> (x)\n gap = Mod (s, three)\n"
        " pads = ScatterElements <axis = 0> (zeros6, four, gap)\n t = Pad (x, pads)",
        1, 2, False, {"x": lambda b, s: (b, s, 4)},
    ),
}  # fmt: skip


def _model(case: str):
    inputs, body, start, end, proven, dims = CASES[case]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({inputs}) => (int64[{end - start}] y) {{
        {body}
        read = Shape <start = {start}, end = {end}> (t)
        y = Add (read, zeros)
    }}"""
    ints = INTS | {"four": [4], "three": [3], "zeros": [0] * (end - start), "zeros6": [0] * 6}
    ints |= {"conv_pads": [0, 0, 2, 0, 0, 0]}
    inits = {k: np.array(v, np.int64) for k, v in ints.items()}
    rng = np.random.default_rng(0)
    inits |= {"w3": rng.standard_normal((5, 4, 3)), "w33": rng.standard_normal((6, 3, 3, 3))}
    inits |= {"table": rng.standard_normal((16, 4))}
    return build_model(text, inits), proven, dims


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_read_is_rewritten_exactly_where_its_size_is_proven(case: str) -> None:
    model, proven, dims = _model(case)
    work = ir.from_proto(model)
    run_prepasses(work, PrepassOptions())
    inner = [n for n in work.graph if n.op_type == "Shape" and n.inputs[0].name == "t"]
    assert (not inner) == proven, [(n.op_type, [v.name for v in n.inputs]) for n in work.graph]
    rng = np.random.default_rng(1)
    for batch, length in ((1, 1), (2, 5), (3, 16)):
        feeds = {name: rng.standard_normal(shape(batch, length)) for name, shape in dims.items()}
        feeds = {k: v.astype(np.int64 if k == "mask" else np.float32) for k, v in feeds.items()}
        run_both(model, ir.to_proto(work), feeds=feeds, **EXACT)
