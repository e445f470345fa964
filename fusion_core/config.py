"""The options of one optimization, as data (the service receives them as JSON)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CheckOptions", "OptimizeConfig"]


class CheckOptions(BaseModel):
    """How the fused model is compared with the original (onnxruntime, opts disabled)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    rtol: float = Field(default=1e-3, ge=0)
    atol: float = Field(default=1e-4, ge=0)
    samples: int = Field(default=2, ge=1, le=100)
    seed: int = 0
    # Values for symbolic dimensions, by name (others are 1).
    dims: dict[str, int] = Field(default_factory=dict)


class OptimizeConfig(BaseModel):
    """What to fuse, for which target, and how to check it."""

    model_config = ConfigDict(extra="forbid")

    target: Literal["generic", "onnxruntime"] = "generic"
    # Only these patterns (by name); None means all that support the target.
    patterns: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    # Extra pattern specs (the same data as a pattern file), applied with the built-ins.
    extra_patterns: list[dict[str, Any]] = Field(default_factory=list)
    max_rounds: int = Field(default=8, ge=1, le=100)
    max_matches_per_pattern: int = Field(default=100_000, ge=1)
    fold_constants: bool = True
    fold_input_size_limit: int = Field(default=1 << 22, ge=0)
    fold_output_size_limit: int = Field(default=1 << 23, ge=0)
    shape_inference: bool = True
    check: CheckOptions = Field(default_factory=CheckOptions)
