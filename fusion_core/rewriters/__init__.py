"""Rewriters: code, registered by name, that replaces a match with fused ops per target."""

from __future__ import annotations

from collections.abc import Iterable

from fusion_core.rewriters._base import (
    PROVENANCE_KEYS,
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    apply_rewrite,
    discard,
    missing_output,
    provenance,
)
from fusion_core.rewriters._effect import RewriteEffect, matched, present, producers
from fusion_core.rewriters.activation import FuseActivation
from fusion_core.rewriters.affine import FoldAffine
from fusion_core.rewriters.attention import FuseAttention
from fusion_core.rewriters.batchnorm import FoldBatchNorm, PoolBatchNorm
from fusion_core.rewriters.gelu import FuseGelu
from fusion_core.rewriters.gemm import MatMulAddToGemm
from fusion_core.rewriters.hardswish import FuseHardSigmoid, FuseHardSwish
from fusion_core.rewriters.layernorm import (
    FoldLayerNormAffine,
    LayerNorm,
    RMSNorm,
    SkipLayerNorm,
)
from fusion_core.rewriters.pad import PadIntoConv
from fusion_core.rewriters.qkv import MergeSiblings
from fusion_core.rewriters.region import FusedRegion
from fusion_core.rewriters.scale import FoldScale
from fusion_core.rewriters.silu import FuseSiLU

__all__ = [
    "PROVENANCE_KEYS",
    "Params",
    "Rewrite",
    "RewriteContext",
    "RewriteEffect",
    "Rewriter",
    "RewriterRegistry",
    "apply_rewrite",
    "builtin_rewriters",
    "discard",
    "matched",
    "missing_output",
    "present",
    "producers",
    "provenance",
]

_BUILTIN: tuple[type[Rewriter], ...] = (
    FoldBatchNorm,
    FoldAffine,
    FuseActivation,
    MatMulAddToGemm,
    PadIntoConv,
    PoolBatchNorm,
    LayerNorm,
    FoldLayerNormAffine,
    RMSNorm,
    SkipLayerNorm,
    FuseGelu,
    FuseSiLU,
    FuseHardSigmoid,
    FuseHardSwish,
    MergeSiblings,
    FoldScale,
    FuseAttention,
    FusedRegion,
)


class RewriterRegistry:
    """Rewriters by name. Each optimize call gets its own registry, never a global one."""

    def __init__(self, rewriters: Iterable[Rewriter] = ()) -> None:
        self._by_name: dict[str, Rewriter] = {}
        for rewriter in rewriters:
            self.register(rewriter)

    def register(self, rewriter: Rewriter) -> None:
        self._by_name[rewriter.name] = rewriter

    def get(self, name: str) -> Rewriter | None:
        return self._by_name.get(name)

    def names(self) -> list[str]:
        return sorted(self._by_name)


def builtin_rewriters() -> RewriterRegistry:
    """A fresh registry holding the built-in rewriters."""
    return RewriterRegistry(cls() for cls in _BUILTIN)
