"""Rewriters: code, registered by name, that replaces a match with fused ops per target.

Each built-in rewriter lives in the module named as it is registered
(``fusion_core.rewriters.fold_batchnorm`` holds ``fold_batchnorm``; ``attention``,
``group_query_attention`` and ``mixture_of_experts`` are packages); what several share
is in the private modules (``_base``, ``_effect``, ``_affine``, ``_norm``,
``_attention_shapes``, ``_attention_mask``); shape values and the proven-size rule
they read from ``fusion_core.sizes``.
"""

from __future__ import annotations

from collections.abc import Iterable

from autofusion.fusion_core.rewriters._base import (
    AppliedRewrite,
    NotACandidate,
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    apply_rewrite,
    discard,
    missing_output,
    provenance,
)
from autofusion.fusion_core.rewriters._effect import (
    KERNEL_MODES,
    RewriteEffect,
    matched,
    present,
    producers,
)
from autofusion.fusion_core.rewriters.attention import FuseAttention
from autofusion.fusion_core.rewriters.attention_block import AttentionBlock
from autofusion.fusion_core.rewriters.fold_affine import FoldAffine
from autofusion.fusion_core.rewriters.fold_batchnorm import FoldBatchNorm
from autofusion.fusion_core.rewriters.fold_layer_norm_affine import FoldLayerNormAffine
from autofusion.fusion_core.rewriters.fold_scale import FoldScale
from autofusion.fusion_core.rewriters.fuse_activation import FuseActivation
from autofusion.fusion_core.rewriters.fused_region import FusedRegion
from autofusion.fusion_core.rewriters.gelu import FuseGelu
from autofusion.fusion_core.rewriters.group_query_attention import GroupQueryAttention
from autofusion.fusion_core.rewriters.hard_sigmoid import FuseHardSigmoid
from autofusion.fusion_core.rewriters.hard_swish import FuseHardSwish
from autofusion.fusion_core.rewriters.layer_norm import LayerNorm
from autofusion.fusion_core.rewriters.matmul_add_to_gemm import MatMulAddToGemm
from autofusion.fusion_core.rewriters.merge_siblings import MergeSiblings
from autofusion.fusion_core.rewriters.mixture_of_experts import MixtureOfExperts
from autofusion.fusion_core.rewriters.packed_attention import PackedAttention
from autofusion.fusion_core.rewriters.pad_into_conv import PadIntoConv
from autofusion.fusion_core.rewriters.pool_bn import PoolBatchNorm
from autofusion.fusion_core.rewriters.rms_norm import RMSNorm
from autofusion.fusion_core.rewriters.rotary import RotaryEmbedding
from autofusion.fusion_core.rewriters.silu import FuseSiLU
from autofusion.fusion_core.rewriters.skip_layer_norm import SkipLayerNorm
from autofusion.fusion_core.rewriters.skip_rms_norm import SkipRMSNorm

__all__ = [
    "KERNEL_MODES",
    "NotACandidate",
    "Params",
    "Rewrite",
    "RewriteContext",
    "RewriteEffect",
    "Rewriter",
    "RewriterRegistry",
    "AppliedRewrite",
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
    SkipRMSNorm,
    FuseGelu,
    FuseSiLU,
    FuseHardSigmoid,
    FuseHardSwish,
    MergeSiblings,
    FoldScale,
    RotaryEmbedding,
    GroupQueryAttention,
    FuseAttention,
    AttentionBlock,
    PackedAttention,
    MixtureOfExperts,
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
