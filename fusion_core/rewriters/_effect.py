"""What a rewrite does to the cost of the nodes it replaces: the cost model's input.

Each rewriter states it (``Rewriter.cost_effect``) beside the rewrite it describes, with
its own validated params, so the two cannot drift apart. The default is one fused kernel
for every matched node, computing the same FLOPs.

``modes`` are words the rewriter states about how the kernel it emits runs, so that a
target profile can price one mode apart (``kernel_factors: {attention+softcap+cache: ..}``,
docs/cost.md): ``cache`` where the kernel reads a KV cache (a past key and value), the
graph of a decoder's generation loop, which runs one prefill and then a decode step per
token.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofusion.fusion_core.patterns import Match

__all__ = ["KERNEL_MODES", "RewriteEffect", "matched", "present", "producers"]

# The modes a rewriter may state, and what each says about the emitted kernel:
# "cache": it reads a past key/value (a KV cache): mostly decode steps of one token.
KERNEL_MODES = ("cache",)


@dataclass(frozen=True)
class RewriteEffect:
    """``fused``: the pattern node ids that the rewrite turns into ``kernels_after``
    kernels; ``removed``: those whose FLOPs the rewrite folds away;
    ``intermediates_kept``: the fused kernel still writes the values between them;
    ``modes``: how the emitted kernel runs (``KERNEL_MODES``), for its kernel factor."""

    fused: tuple[str, ...]
    removed: tuple[str, ...] = ()
    kernels_after: int = 1
    intermediates_kept: bool = False
    modes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.modes) - set(KERNEL_MODES)
        if unknown:  # a typo would silently price the kernel by its plain factor
            raise ValueError(f"unknown kernel modes {sorted(unknown)}; known: {KERNEL_MODES}")


def matched(match: Match) -> tuple[str, ...]:
    """Every pattern node id the match bound, in pattern order."""
    return tuple(n.id for n in match.pattern.nodes if n.id in match.nodes)


def present(match: Match, *node_ids: str | None) -> tuple[str, ...]:
    """Those of ``node_ids`` that the match bound (optional nodes may be absent)."""
    return tuple(i for i in node_ids if isinstance(i, str) and i in match.nodes)


def producers(match: Match, node_id: str) -> list[str]:
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
