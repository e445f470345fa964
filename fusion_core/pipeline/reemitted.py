"""The nodes a rewrite re-created as they were, which its pattern must not take again.

A rewriter for a target with no fused op for the whole match re-creates the rest of it
on top of what it did fuse: on ``generic``, ``conv_bn_add_relu`` folds the
BatchNormalization into the Conv and emits the residual Add and the Relu again, reading
the folded Conv. Those two fused nothing, yet they are typed like any new value, so in a
later round the same pattern matches them again behind the block's other Conv +
BatchNormalization (a ResNet's downsample branch feeds the same Add): the report would
credit one residual tail twice and the second fusion's provenance would list the first
one's originals as its own. ``RewriteRounds`` records what each fusion re-emitted and
drops the same pattern's later candidates that hold one of them; another pattern may
still take them (and ``conv_bn`` takes that branch's Conv + BatchNormalization). The
record lasts one pass: a pattern that a later progressive stage runs again (stage 2's
``*``) could take what it re-emitted in an earlier stage; by default the tail patterns
run in stage 2 only, after stage 1 folded every BatchNormalization.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters import AppliedRewrite

__all__ = ["Reemitted", "reemitted"]

_PLAIN = (int, float, str, bytes, list, tuple)


def reemitted(applied: AppliedRewrite) -> list[ir.Node]:
    """The new nodes of ``applied`` that re-create one of the nodes it removed as it
    was: the same op and attributes, reading what that node read or, where it read a
    removed node's value, a new node's. A node whose inputs the rewrite changed
    otherwise (a Conv reading folded weights) is new work, not re-emitted."""
    made = {id(v) for n in applied.new_nodes for v in n.outputs}
    gone = {id(v) for n, _ in applied.old_nodes for v in n.outputs}

    def reads_as(new: ir.Value | None, old: ir.Value | None) -> bool:
        return new is old or (
            new is not None and old is not None and id(new) in made and id(old) in gone
        )

    def recreates(node: ir.Node, old: ir.Node, inputs: tuple[ir.Value | None, ...]) -> bool:
        return (
            (node.domain, node.op_type) == (old.domain, old.op_type)
            and len(node.inputs) == len(inputs)
            and _same_attributes(node, old)
            and all(reads_as(new, was) for new, was in zip(node.inputs, inputs, strict=True))
        )

    return [
        node
        for node in applied.new_nodes
        if any(recreates(node, old, inputs) for old, inputs in applied.old_nodes)
    ]


class Reemitted:
    """The nodes the fusions of one graph's rounds re-emitted unfused, each with the
    pattern whose fusion did (held, so that no later node gets the id of one)."""

    def __init__(self) -> None:
        self._made_by: dict[int, tuple[str, ir.Node]] = {}

    def record(self, pattern: str, applied: AppliedRewrite) -> None:
        for node in reemitted(applied):
            self._made_by[id(node)] = (pattern, node)

    def taken_again(self, match: Match) -> bool:
        """Whether ``match`` holds a node its own pattern re-emitted: taking it would
        credit that fusion twice. Another pattern's match may hold it."""
        name = match.pattern.name
        return any(self._made_by.get(n, ("",))[0] == name for n in match.node_ids())


def _same_attributes(node: ir.Node, other: ir.Node) -> bool:
    """Equal attributes; a tensor or graph attribute only when it is the same object
    (a re-created Constant is then new work: the cautious side)."""
    mine, theirs = node.attributes, other.attributes
    if mine.keys() != theirs.keys():
        return False
    for name, attr in mine.items():
        value, that = attr.value, theirs[name].value
        same = value is that or (isinstance(value, _PLAIN) and value == that)
        if attr.type != theirs[name].type or not same:
            return False
    return True
