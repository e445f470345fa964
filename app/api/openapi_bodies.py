"""OpenAPI descriptions of the multipart bodies that routes stream themselves.

Routes that read ``request.stream()`` (to enforce size limits while the body arrives)
declare no ``Form()``/``File()`` parameters, so FastAPI cannot describe their body; these
helpers write that description once for all such routes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["binary_part", "data_upload_part", "inline_refs", "multipart_body", "octet_body"]


def binary_part(description: str) -> dict[str, Any]:
    return {"type": "string", "format": "binary", "description": description}


def data_upload_part() -> dict[str, Any]:
    """``POST /v1/optimize``'s ``data_upload`` field: ids of complete data uploads."""
    return {
        "type": "array",
        "items": {"type": "string", "format": "uuid"},
        "description": "The id of a complete data upload of this tenant (POST /v1/uploads), "
        "repeatable: the file joins the job's data files under the upload's name, as a "
        "'data' part would. For data files too big for one body (over max_upload_bytes).",
    }


def octet_body(media_type: str, description: str) -> dict[str, Any]:
    """``openapi_extra`` for a required raw body of ``media_type``, streamed by the route."""
    schema = {"type": "string", "format": "binary", "description": description}
    return {"requestBody": {"required": True, "content": {media_type: {"schema": schema}}}}


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
