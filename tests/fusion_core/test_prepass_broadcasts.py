"""The broadcasting-Expand pre-pass: an Expand that MatMul's own broadcast makes
redundant goes (the rotary angles' ``inv_freq.expand(batch, -1, 1) @ positions``), any
other stays; the model computes the same either way (rtol = atol = 0: MatMul with an
inner dimension of 1 multiplies once per element, in both graphs)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses
from autofusion.fusion_core.testing import build_model, run_both

HEADER = '<ir_version: 8, opset_import: ["" : 18]>'
INV_FREQ = (1.0 / 10000 ** (np.arange(4) / 4)).reshape(1, 4, 1)


def angles(positions: str, batch_from: str) -> onnx.ModelProto:
    """``Expand(x, [B, 4, 1]) @ positions``, B read at run time from ``batch_from``."""
    text = f"""{HEADER}
    g (float{positions} positions, float[batch, 2] other) => (float[batch, 4, seq] out) {{
        lead = Shape <start = 0, end = 1> ({batch_from})
        target = Concat <axis = 0> (lead, rest)
        wide = Expand (x, target)
        out = MatMul (wide, positions)
    }}"""
    inits = {"x": INV_FREQ, "rest": np.array([4, 1], np.int64)}
    return build_model(text, inits)


def prepassed(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    work = ir.from_proto(model)
    changed = run_prepasses(work, PrepassOptions())
    return ir.to_proto(work), changed


def feeds(batch: int, positions_batch: int) -> dict[str, np.ndarray]:
    positions = np.arange(positions_batch * 5, dtype=np.float32)
    return {
        "positions": positions.reshape(positions_batch, 1, 5),
        "other": np.zeros((batch, 2), np.float32),
    }


def test_an_expand_matmul_broadcasts_anyway_is_dropped():
    model = angles("[batch, 1, seq]", "positions")
    fused, changed = prepassed(model)
    assert "broadcasting_expand" in changed
    assert [n.op_type for n in fused.graph.node] == ["MatMul"]
    for batch in (1, 3):
        run_both(model, fused, feeds=feeds(batch, batch), rtol=0, atol=0)


def test_an_expand_that_makes_a_batch_matmul_would_not_is_kept():
    """Positions of batch 1, x expanded to the batch of another input: without the
    Expand the product would have batch 1."""
    model = angles("[1, 1, seq]", "other")
    fused, changed = prepassed(model)
    assert "broadcasting_expand" not in changed
    assert "Expand" in [n.op_type for n in fused.graph.node]
    run_both(model, fused, feeds=feeds(3, 1), rtol=0, atol=0)


def test_an_expand_of_a_vector_is_kept():
    """x of rank 1 ([1], its one entry broadcast into the matrix dimensions): the
    Expand changes more than the batch."""
    text = f"""{HEADER}
    g (float[batch, 1, seq] positions) => (float[batch, 4, seq] out) {{
        lead = Shape <start = 0, end = 1> (positions)
        target = Concat <axis = 0> (lead, rest)
        wide = Expand (x, target)
        out = MatMul (wide, positions)
    }}"""
    model = build_model(text, {"x": np.array([0.5]), "rest": np.array([4, 1], np.int64)})
    fused, changed = prepassed(model)
    assert "broadcasting_expand" not in changed
    feeds = {"positions": np.arange(10, dtype=np.float32).reshape(2, 1, 5)}
    run_both(model, fused, feeds=feeds, rtol=0, atol=0)
