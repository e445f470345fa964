"""What a rewriter does to the cost of the nodes it replaces, by rewriter name.

The default is one fused kernel for all matched nodes that computes the same FLOPs.
Where a rewriter is known to do otherwise, the table below says so:

- ``fold_batchnorm``, ``fold_affine``, ``fold_layer_norm_affine``: the BatchNormalization
  (or the Mul/Add) folds into the producer's constant weights, so its FLOPs disappear.
  ``fuse_activation`` with a ``batchnorm_node`` folds it the same way.
- ``pool_bn``: the BatchNormalization moves before the MaxPool and folds into the Conv:
  its FLOPs go and the pool writes the final output (the Conv stays as it was, so only
  the pool and the BatchNormalization count as the fused group).
- ``fold_scale``: the attention scale folds into the projection weights: the scale node
  and the node feeding it become one kernel; the rest of the match stays as it was.
- ``skip_layer_norm`` with a ``next_node`` (the pre-LN forms): the next residual Add
  (or SkipLayerNormalization) is part of the match only so that the sum may escape;
  the rewriter re-creates it as it was, so it is not fused, and the sum is still
  written (as ``input_skip_bias_sum``) for it to read.
- ``merge_siblings``: one MatMul over concatenated weights (plus one Add with the
  biases) and a Split: the shared input is read once instead of once per sibling, the
  outputs are still written (so no intermediate counts as saved), FLOPs are kept. The
  Split is counted as a launch; its copy is not counted (runtimes may alias its outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusion_core.patterns import Match

__all__ = ["RewriteEffect", "rewrite_effect"]


@dataclass(frozen=True)
class RewriteEffect:
    """``fused``: the pattern node ids that the rewrite turns into ``kernels_after``
    kernels; ``removed``: those whose FLOPs the rewrite folds away."""

    fused: tuple[str, ...]
    removed: tuple[str, ...] = ()
    kernels_after: int = 1
    intermediates_kept: bool = False


def rewrite_effect(match: Match) -> RewriteEffect:
    """The effect of ``match``'s rewriter (by name); the default for unknown names."""
    params = match.pattern.rewriter.params
    everything = tuple(n.id for n in match.pattern.nodes if n.id in match.nodes)
    name = match.pattern.rewriter.name
    if name == "fold_batchnorm":
        return RewriteEffect(everything, _present(match, params.get("batchnorm_node", "bn")))
    if name in ("fold_affine", "fold_layer_norm_affine"):
        return RewriteEffect(everything, _present(match, params.get("affine_node", "op")))
    if name == "fuse_activation":
        return RewriteEffect(everything, _present(match, params.get("batchnorm_node")))
    if name == "pool_bn":
        pool, bn = params.get("pool_node", "pool"), params.get("batchnorm_node", "bn")
        return RewriteEffect(_present(match, pool, bn), _present(match, bn))
    if name == "fold_scale":
        scale = params.get("scale_node", "scale")
        return RewriteEffect(_present(match, *_producers(match, scale), scale), (scale,))
    if name == "skip_layer_norm" and params.get("next_node") in match.nodes:
        kept = params["next_node"]
        return RewriteEffect(tuple(n for n in everything if n != kept))
    if name == "merge_siblings":
        kernels = 3 if params.get("add_nodes") else 2
        return RewriteEffect(everything, kernels_after=kernels, intermediates_kept=True)
    return RewriteEffect(everything)


def _present(match: Match, *node_ids: Any) -> tuple[str, ...]:
    return tuple(i for i in node_ids if isinstance(i, str) and i in match.nodes)


def _producers(match: Match, node_id: str) -> list[str]:
    """Pattern node ids whose graph node produces an input of ``node_id``."""
    if node_id not in match.nodes:
        return []
    by_node = {id(node): pid for pid, node in match.nodes.items()}
    found = []
    for value in match.nodes[node_id].inputs:
        producer = value.producer() if value is not None else None
        if producer is not None and id(producer) in by_node:
            found.append(by_node[id(producer)])
    return found
