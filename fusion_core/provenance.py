"""The provenance autofusion writes on every node a rewrite creates, and how it is read.

Each new node carries three metadata entries (ONNX ``NodeProto.metadata_props``,
onnx-ir's ``Node.metadata_props``), so validation, profiling and reports map a fused
node back to the input graph without a side table:

* ``autofusion.pattern``: the name of the pattern that matched;
* ``autofusion.replaced_nodes``: JSON list of the input graph's nodes the fusion stands
  for (a fusion of an earlier fusion's node lists that node's originals);
* ``autofusion.replaced_values``: JSON list of the input graph's values it removed
  (intermediates that no longer exist in the fused model).

This module is the one place that spells the keys; writers and readers go through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping, Sequence

import onnx
import onnx_ir as ir

__all__ = [
    "KEYS",
    "PATTERN",
    "REPLACED_NODES",
    "REPLACED_VALUES",
    "metadata",
    "pattern",
    "replaced_nodes",
    "replaced_values",
    "write",
]

PATTERN = "autofusion.pattern"
REPLACED_NODES = "autofusion.replaced_nodes"
REPLACED_VALUES = "autofusion.replaced_values"
KEYS = (PATTERN, REPLACED_NODES, REPLACED_VALUES)


def write(
    props: MutableMapping[str, str],
    pattern: str,
    replaced_nodes: Sequence[str],
    replaced_values: Sequence[str],
) -> None:
    """Record a fusion's provenance in a node's ``metadata_props`` (onnx-ir's dict)."""
    props[PATTERN] = pattern
    props[REPLACED_NODES] = json.dumps(replaced_nodes)
    props[REPLACED_VALUES] = json.dumps(replaced_values)


def metadata(node: ir.Node | onnx.NodeProto) -> Mapping[str, str]:
    """A node's metadata as a mapping: onnx-ir keeps a dict, ONNX a list of entries."""
    props = node.metadata_props
    if isinstance(props, Mapping):
        return props
    return {p.key: p.value for p in props}


def pattern(props: Mapping[str, str]) -> str | None:
    """The pattern that made the node; None for a node no fusion made."""
    return props.get(PATTERN)


def replaced_nodes(props: Mapping[str, str]) -> list[str] | None:
    """The input graph's nodes the node stands for; None for a node no fusion made."""
    raw = props.get(REPLACED_NODES)
    return None if raw is None else json.loads(raw)


def replaced_values(props: Mapping[str, str]) -> list[str]:
    """The input graph's values the fusion removed (none recorded: empty)."""
    return json.loads(props.get(REPLACED_VALUES, "[]"))
