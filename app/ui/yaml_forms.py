"""Patterns and strategies are edited as YAML: the same document the API takes as JSON."""

from __future__ import annotations

from typing import Any

import yaml

from app.core.errors import ProblemError

__all__ = ["dump_yaml", "parse_yaml", "version_etag", "version_message"]

MAX_YAML_CHARS = 1 << 20


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def _invalid(message: str) -> ProblemError:
    return ProblemError(
        422,
        "invalid-yaml",
        "Invalid YAML",
        message,
        errors=[{"field": "yaml", "message": message}],
    )


def parse_yaml(text: str) -> dict[str, Any]:
    """The form's YAML as a mapping (safe_load: no tags, no objects)."""
    if len(text) > MAX_YAML_CHARS:
        raise _invalid(f"the document is longer than {MAX_YAML_CHARS} characters")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _invalid(f"not valid YAML: {exc}") from None
    except RecursionError:
        raise _invalid("the document nests too deeply") from None
    if not isinstance(data, dict):
        raise _invalid("the document must be a mapping (name: ..., nodes: ...)")
    return data


def version_etag(name: str, version: str | None) -> str | None:
    """The If-Match the edit form carries: the version the user started from."""
    return f'"{name}@{version}"' if version and version.isdigit() else None


def version_message(exc: ProblemError) -> str:
    """What the edit form says when the version it carries is stale (412) or missing (428)."""
    if exc.status == 428:
        return (
            "the form did not say which version you edited (no version field): open the "
            "edit page again, which carries it, and resubmit your text"
        )
    return exc.detail
