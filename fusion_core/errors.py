"""The error vocabulary of autofusion.

Every error a user can cause is one of these classes. Each carries a stable ``code``
(the service maps it to an RFC 9457 problem ``type``) and a message that says what was
wrong and what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "ConfigError",
    "describe_fields",
    "field_errors",
    "FusionError",
    "ModelLoadError",
    "PatternError",
    "UnsafeModelError",
]


class FusionError(Exception):
    """Base class of every error autofusion reports to a user."""

    code = "fusion-error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ModelLoadError(FusionError):
    """The model file is missing, is not ONNX, or is malformed."""

    code = "invalid-model"


class UnsafeModelError(FusionError):
    """The model refers to data outside its folder or declares absurd sizes."""

    code = "unsafe-model"


class PatternError(FusionError):
    """A pattern specification does not validate or does not compile.

    ``errors`` lists one ``(field path, message)`` pair per problem found.
    """

    code = "invalid-pattern"

    def __init__(
        self, message: str, *, errors: list[tuple[str, str]] | None = None, hint: str | None = None
    ) -> None:
        self.errors = errors or []
        if self.errors:
            details = "; ".join(f"{path}: {msg}" for path, msg in self.errors)
            message = f"{message}: {details}"
        super().__init__(message, hint=hint)


class ConfigError(FusionError):
    """The optimization config asks for something that does not exist."""

    code = "invalid-config"


def field_errors(
    exc: Any, *, prefix: Sequence[str] = (), default: str = ""
) -> list[tuple[str, str]]:
    """``(field, message)`` per error of a pydantic ``ValidationError`` (or FastAPI's
    ``RequestValidationError``): the location joined with dots under ``prefix``
    (``default`` when it is empty), pydantic's ``Value error, `` taken off the message.
    The one place the service and the core turn validation errors into words."""
    found = []
    for error in exc.errors():
        path = ".".join([*prefix, *(str(p) for p in error.get("loc", ()))]) or default
        found.append((path, str(error.get("msg", "")).removeprefix("Value error, ")))
    return found


def describe_fields(errors: Sequence[tuple[str, str]]) -> str:
    """``field: message; ...`` in one line."""
    return "; ".join(f"{field}: {message}" if field else message for field, message in errors)
