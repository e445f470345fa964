"""Patterns and strategies are edited as YAML: the same document the API takes as JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml
from fastapi import Request
from fastapi.responses import RedirectResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.ui.common import form_errors, render
from autofusion.fusion_core.errors import FusionError

__all__ = ["YamlEditor", "dump_yaml", "parse_yaml", "version_etag", "version_message"]

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


# What a failed save raises: a service's problem, a pattern that does not compile, or a
# document that is not a valid strategy.
SAVE_ERRORS = (ProblemError, FusionError, ValidationError)


@dataclass(frozen=True)
class YamlEditor:
    """The create and edit forms of one kind of versioned resource (patterns, strategies):
    the form page, a save that redirects to the resource or shows the form again with the
    errors next to the text (which is kept), and the version the form carries."""

    base: str  # "/ui/patterns"
    template: str  # "pattern_form.html"
    name_slugs: tuple[str, ...]  # problems about the name, shown next to the name field

    def form(self, request: Request, *, action: str, text: str, errors=(), status=200, **extra):
        context = {"action": action, "yaml": text, "errors": list(errors), **extra}
        return render(request, self.template, context, status_code=status)

    def new_form(self, request: Request, example: str):
        return self.form(request, action=f"{self.base}/new", text=example, name=None)

    def edit_form(self, request: Request, name: str, data: Any, version: int):
        """The current document as YAML, with the version it was read at."""
        action = f"{self.base}/{name}/edit"
        return self.form(request, action=action, text=dump_yaml(data), name=name, version=version)

    def save(self, request: Request, session: Session, text: str, write: Callable[[], Any], **at):
        """``write()`` the resource; ``at``: the form's ``name`` and ``version``."""
        try:
            row = write()
        except SAVE_ERRORS as exc:
            session.rollback()
            status, errors = form_errors(exc, "yaml")
            if isinstance(exc, ProblemError) and exc.status in (412, 428):
                errors = [{"field": "version", "message": version_message(exc)}]
            elif isinstance(exc, ProblemError) and exc.slug in self.name_slugs:
                errors = [{"field": "name", "message": exc.detail}]
            name = at.get("name")
            action = f"{self.base}/{name}/edit" if name else f"{self.base}/new"
            return self.form(request, action=action, text=text, errors=errors, status=status, **at)
        return RedirectResponse(f"{self.base}/{row.name}", status_code=303)
