"""A rewrite taken back leaves no reader behind, inside an If's branches either.

The empty-row fix of the attention rewriters sits in an ``If`` whose else-branch reads
outer values (the kernel's output, the rows to keep) by reference. A rewrite that is
not applied (``discard``) or is undone (``AppliedRewrite.undo``) must stop those reads
too: a value left with a reader from a dead branch looks read outside the next match,
and that match is refused.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.rewriters import Rewrite
from autofusion.fusion_core.rewriters._base import discard, stop_reading


def _if_reading(outer: ir.Value) -> ir.Node:
    """``If(cond)`` whose else-branch reads ``outer`` twice, nested one If deeper too."""
    cond = ir.Value(name="cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    inner_then = ir.Node("", "Identity", [outer])
    inner_else = ir.Node("", "Neg", [outer])
    nested = ir.Node(
        "",
        "If",
        [cond],
        [
            ir.AttrGraph("then_branch", ir.Graph([], inner_then.outputs, nodes=[inner_then])),
            ir.AttrGraph("else_branch", ir.Graph([], inner_else.outputs, nodes=[inner_else])),
        ],
    )
    then = ir.Node("", "Identity", [outer])
    fix = ir.Node("", "Add", [outer, nested.outputs[0]])
    return ir.Node(
        "",
        "If",
        [cond],
        [
            ir.AttrGraph("then_branch", ir.Graph([], then.outputs, nodes=[then])),
            ir.AttrGraph("else_branch", ir.Graph([], fix.outputs, nodes=[nested, fix])),
        ],
    )


def _outer() -> ir.Value:
    return ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))


def test_stop_reading_reaches_into_branches_and_nested_branches() -> None:
    outer = _outer()
    node = _if_reading(outer)
    assert len(list(outer.uses())) == 4  # then, the Add, the nested If's two branches
    stop_reading(node)
    assert list(outer.uses()) == []
    assert list(node.inputs) == [None]


def test_a_discarded_rewrite_reads_nothing() -> None:
    outer = _outer()
    node = _if_reading(outer)
    discard(Rewrite([node], []))
    assert list(outer.uses()) == []
