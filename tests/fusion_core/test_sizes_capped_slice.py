"""A Slice cut at a capped end is capped, never the whole axis.

``Min(S, 2 * (S Div 2))`` is ``S`` rounded down to even (ONNX's integer Div truncates):
``S`` capped. A Slice of a length-``S`` axis to that end lost the cap in the size proof,
which read it as exactly ``S``: a rule that trusts it (canonical's ``identity_slice``
drops a Slice proven whole) would return ``S`` columns for ``S - 1`` at odd ``S``. A
Range from 0 to a capped end kept an exact length the same way. Generated over the
lengths and the multiple; outputs compared exactly (rtol = atol = 0).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.sizes import SizeProof
from autofusion.fusion_core.testing import build_model, optimize_quiet, run_both


def _capped_slice(multiple: int):
    return build_model(
        f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, seq] x) => (float[1, kept] y, int64[kept] r) {{
  shape = Shape (x)
  one = Constant <value = int64[1] {{1}}> ()
  zero = Constant <value = int64[1] {{0}}> ()
  k = Constant <value = int64[1] {{{multiple}}}> ()
  s = Gather <axis = 0> (shape, one)
  down = Div (s, k)
  even = Mul (down, k)
  end = Min (s, even)
  y = Slice (x, zero, end, one)
  zero_s = Constant <value = int64 {{0}}> ()
  one_s = Constant <value = int64 {{1}}> ()
  end_s = Squeeze (end)
  r = Range (zero_s, end_s, one_s)
}}
"""
    )


@settings(max_examples=12, deadline=None)
@given(st.integers(2, 4), st.lists(st.integers(1, 11), min_size=1, max_size=3))
def test_a_slice_to_a_capped_end_is_not_dropped(multiple: int, lengths: list[int]) -> None:
    model = _capped_slice(multiple)
    graph = ir.from_proto(onnx.shape_inference.infer_shapes(model)).graph
    values = {o.name: o for node in graph for o in node.outputs}
    proof = SizeProof()
    for name, axis in (("y", 1), ("r", 0)):
        size = proof.size(values[name], axis)
        assert size is None or size.capped, f"{name} proven {size}: the cap is lost"
    fused = ir.to_proto(optimize_quiet(model, patterns=[]).model)
    assert "Slice" in [n.op_type for n in fused.graph.node]
    for length in lengths:
        feeds = {"x": np.arange(length, dtype=np.float32).reshape(1, length)}
        run_both(model, fused, feeds=feeds, rtol=0, atol=0)
