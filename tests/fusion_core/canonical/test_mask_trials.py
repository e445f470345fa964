"""A mask spelling ``mask_as_bias`` tries and does not take leaves no reader behind.

A node made and not used still reads its inputs (onnx-ir registers the use when the node
is made): the Not tried for ``Where(Not(blocked), 0, lowest)`` over a condition that
negates only by a Not was such a reader, and PhiMoE's router then read as "read outside
the block" to the mixture-of-experts rewriter in one round.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.canonical._masks import _without_not


def test_a_negation_tried_and_refused_leaves_no_reader() -> None:
    blocked = ir.Value(name="blocked", type=ir.TensorType(ir.DataType.BOOL))
    allowed = ir.Node("", "Not", [blocked], name="allowed").outputs[0]
    nodes: list[ir.Node] = []
    assert _without_not(allowed, nodes) is allowed  # only a Not negates it: refused
    assert nodes == []
    assert [use.node.name for use in blocked.uses()] == ["allowed"]


def test_a_negation_taken_reads_the_comparison() -> None:
    a = ir.Value(name="a", type=ir.TensorType(ir.DataType.INT64))
    b = ir.Value(name="b", type=ir.TensorType(ir.DataType.INT64))
    less = ir.Node("", "Less", [a, b], name="less").outputs[0]
    allowed = ir.Node("", "Not", [less], name="allowed").outputs[0]
    nodes: list[ir.Node] = []
    taken = _without_not(allowed, nodes)
    assert [n.op_type for n in nodes] == ["GreaterOrEqual"] and taken is nodes[0].outputs[0]
