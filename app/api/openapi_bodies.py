"""OpenAPI descriptions of the multipart bodies that routes stream themselves.

Routes that read ``request.stream()`` (to enforce size limits while the body arrives)
declare no ``Form()``/``File()`` parameters, so FastAPI cannot describe their body; these
helpers write that description once for all such routes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["binary_part", "inline_refs", "multipart_body"]


def binary_part(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "binary", "description": description}


def multipart_body(
    properties: dict[str, Any], *, encoding: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``openapi_extra`` for a required multipart body with a ``model`` part."""
    content: dict[str, Any] = {
        "schema": {"type": "object", "required": ["model"], "properties": properties}
    }
    if encoding:
        content["encoding"] = encoding
    return {"requestBody": {"required": True, "content": {"multipart/form-data": content}}}


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace ``#/$defs/X`` references by their definitions (OpenAPI has no ``$defs`` here)."""
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)
