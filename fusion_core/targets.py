"""Targets: what a rewriter may emit.

``generic`` emits standard ONNX ops only, valid at the model's own opset. ``onnxruntime``
may also emit the ``com.microsoft`` contrib ops that onnxruntime's CPU provider
implements (https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from autofusion.fusion_core.errors import ConfigError

__all__ = ["MS_DOMAIN", "TARGETS", "TARGET_NAMES", "Target", "TargetName", "get_target"]

MS_DOMAIN = "com.microsoft"
# The one spelling of the target names (patterns, configs and the CLI read it here; a
# light module, so that the CLI's client commands need no onnx to offer the choices).
TargetName = Literal["generic", "onnxruntime"]
TARGET_NAMES: tuple[str, ...] = get_args(TargetName)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    extra_domains: frozenset[str] = frozenset()

    def can_emit(self, domain: str) -> bool:
        return domain in ("", "ai.onnx") or domain in self.extra_domains


TARGETS = {
    "generic": Target("generic", "standard ONNX ops at the model's opset"),
    "onnxruntime": Target(
        "onnxruntime",
        "standard ONNX ops plus onnxruntime's com.microsoft contrib ops (CPU provider)",
        frozenset({MS_DOMAIN}),
    ),
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown target {name!r}", hint=f"choose one of {sorted(TARGETS)}"
        ) from None
