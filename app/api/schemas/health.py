"""Schemas of the health endpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = ["HealthPublic", "ReadinessPublic"]


class HealthPublic(BaseModel):
    status: Literal["ok"] = "ok"


class ReadinessPublic(BaseModel):
    status: Literal["ready"] = "ready"
    # One entry per dependency checked: "ok" when reachable.
    checks: dict[str, str]
