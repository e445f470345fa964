"""A Split whose sizes are computed at run time: the shapes written into the model.

onnxruntime's symbolic shape inference (a pre-pass, ``prepasses/_inferences.py``) took
such a Split for an even one and wrote ``tokens/2`` (JetMoE's sorted dispatch:
``2*tokens/3``) as each part's length into the optimized model, a shape the parts do not
have whenever the router sizes them unevenly. Each part now gets a length of its own.
Generated: the number of parts, the axis, the sizes at run time. The model must compute
what the original computes exactly (rtol = atol = 0: no fusion applies).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, optimize_quiet, run_both


def _split_model(parts: int, axis: int):
    names = [f"p{i}" for i in range(parts)]
    shape = "tokens, 8" if axis == 0 else "8, tokens"
    lines = [f"{', '.join(names)} = Split <axis = {axis}> (x, sizes)"]
    lines += [f"r{i} = Neg ({n})" if i % 2 else f"r{i} = Relu ({n})" for i, n in enumerate(names)]
    lines.append(
        f"y = Concat <axis = {axis}> ({', '.join(f'r{i}' for i in reversed(range(parts)))})"
    )
    body = "\n  ".join(lines)
    return build_model(
        f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[{shape}] x, int64[{parts}] sizes) => (float[{shape}] y) {{
  {body}
}}
"""
    )


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 4), st.integers(0, 1), st.data())
def test_the_parts_of_a_split_by_computed_sizes_keep_their_own_lengths(parts, axis, data) -> None:
    model = _split_model(parts, axis)
    fused = ir.to_proto(optimize_quiet(model, patterns=[]).model)
    written = {
        vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in fused.graph.value_info
    }
    for i in range(parts):
        length = written.get(f"p{i}", [None, None])[axis]
        assert not (isinstance(length, str) and "tokens" in length), (
            f"part {i} written as {written.get(f'p{i}')}: its length is the router's, not "
            "a share of 'tokens'"
        )
    sizes = data.draw(st.lists(st.integers(0, 5), min_size=parts, max_size=parts))
    tokens = sum(sizes)
    shape = (tokens, 8) if axis == 0 else (8, tokens)
    feeds = {
        "x": np.random.default_rng(tokens).standard_normal(shape).astype(np.float32),
        "sizes": np.array(sizes, np.int64),
    }
    run_both(model, fused, feeds=feeds, rtol=0, atol=0)
