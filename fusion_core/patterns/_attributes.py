"""Attribute values of a matched node, with the defaults of the ONNX operator schemas.

A node that omits an attribute means the schema's default at the model's opset, so a
pattern can say ``Conv.group == 1`` and a Conv that omits ``group`` still matches.
Constraints, rewriters and the shape-read pre-pass all read attributes this one way.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import onnx_ir as ir

__all__ = ["attribute_value"]


@lru_cache(maxsize=1024)
def _schema_default(op_type: str, domain: str, opset: int | None, name: str) -> Any:
    # onnx is imported here, not at the top: the API syncs the built-in patterns through
    # this package and must not load onnx (docs/architecture.md, "Imports run one way").
    import onnx

    try:
        if opset is None:
            schema = onnx.defs.get_schema(op_type, domain=domain)
        else:
            schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return None
    return onnx.helper.get_attribute_value(attr.default_value)


def attribute_value(node: ir.Node, name: str, default: Any = None) -> Any:
    """The attribute's value, else the schema default, else ``default``."""
    attr = node.attributes.get(name)
    if attr is not None:
        value = attr.value
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, (list, tuple)):
            return [v.decode() if isinstance(v, bytes) else v for v in value]
        return value
    domain = node.domain or ""
    graph = node.graph
    opset = None
    if graph is not None:  # defaults can change between opsets: use the model's
        opset = graph.opset_imports.get(domain, graph.opset_imports.get("ai.onnx"))
    schema_default = _schema_default(node.op_type, domain, opset, name)
    if schema_default is None:
        return default
    if isinstance(schema_default, bytes):
        return schema_default.decode()
    return schema_default
