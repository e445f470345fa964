"""Values a rewrite builds once and later rewrites reuse (every layer's rotary cache,
a decoder's mask bias and sequence lengths), found again by a mark on the node that
computes them.

The mark is metadata on the node (``autofusion.shared``), so what is shared is always
what the graph holds: a rewrite that was discarded left no node behind, and nothing
outside the graph remembers anything between rewrites.
"""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["mark_shared", "shared_value"]

_KEY = "autofusion.shared"


def shared_value(graph: ir.Graph, key: str) -> ir.Value | None:
    """The output of the node marked ``key`` in ``graph``, or None."""
    for node in graph:
        if node.metadata_props.get(_KEY) == key:
            return node.outputs[0]
    return None


def mark_shared(node: ir.Node, key: str) -> None:
    """Mark ``node`` (its first output) as the value for ``key``."""
    node.metadata_props[_KEY] = key
