"""The cost model: what a candidate fusion is predicted to save on a target.

Per node (``fusion_core.cost._ops`` documents the counting conventions): FLOPs, bytes
read and written. Per candidate (a ``Match``):

- ``bytes_saved``: intermediates no longer written and read back. An internal value
  (output of a fused node, consumed only inside the fusion, not a graph output) saves
  its size once for the write (unless a view produced it) plus once per fused node that
  reads it (views excepted); an external input read by several fused nodes (a
  horizontal fusion) saves its size once per extra reader.
- ``launches_saved``: fused nodes minus kernels after the rewrite (one, unless the
  rewriter says it emits more: ``Rewriter.cost_effect``, ``fusion_core/rewriters``).
- ``flops_delta``: FLOPs the rewrite adds (> 0) or removes (< 0): a folded
  BatchNormalization's go, a Q/K/V merge keeps them.
- ``working_set_bytes``: external inputs + outputs of the fused kernel + its largest
  internal value, compared with the profile's ``fusion_buffer_bytes``.

Priced by a ``TargetProfile`` as a roofline per kernel: ``time = max(bytes / bandwidth,
FLOPs / peak) + launch overhead``. ``time_before_s`` sums that over the fused nodes;
``time_after_s`` prices the fused kernel(s): the same bytes less ``bytes_saved``, the
FLOPs plus ``flops_delta``, times the profile's measured ``kernel_factors`` entry for the
kernel (how much slower or faster than the roofline it runs, relative to the unfused
nodes; 1 when the profile has none): the most specific of ``pattern+group+mode``,
``pattern+group``, ``pattern+mode``, ``pattern``, ``rewriter+mode``, ``rewriter``, where the
groups are the optional groups the match holds and the modes what the rewriter says
its kernel runs in (``RewriteEffect.modes``: ``cache``); ``Gain.kernel_factor_key`` names
it. ``gain_s = time_before_s - time_after_s``
(for memory-bound nodes and a factor of 1: launches saved * launch overhead + bytes saved
/ bandwidth + FLOPs removed / peak) and ``speedup = time_before_s / time_after_s``.

When a shape is unknown (symbolic, not resolved by ``dims``) the estimate falls back to
the pattern's ``cost_hints``: ``speedup = 1 / (1 - max(memory_saving, compute_saving))``
(at most 20) and ``gain_s`` counts only the launches saved; ``estimated_from`` says
``"hints"`` (or ``"none"`` without hints, with no speedup). A kernel factor divides the
hinted speedup (taken as 1 without hints); below 1, the launches saved count as a loss.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import onnx_ir as ir

from autofusion.fusion_core.cost._ops import NodeCost, Shapes, node_cost
from autofusion.fusion_core.cost._profiles import (
    PROFILE_NAME_PATTERN,
    Calibration,
    TargetProfile,
    dump_target_profile,
    load_target_profile,
    shipped_profiles,
)
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters import (
    RewriteEffect,
    RewriterRegistry,
    builtin_rewriters,
    matched,
)

__all__ = [
    "PROFILE_NAME_PATTERN",
    "Calibration",
    "CostModel",
    "Gain",
    "NodeCost",
    "RewriteEffect",
    "TargetProfile",
    "dump_target_profile",
    "load_target_profile",
    "rewrite_effect",
    "shipped_profiles",
]

MAX_HINT_SPEEDUP = 20.0
Estimate = Literal["shapes", "hints", "none"]


@dataclass(frozen=True)
class Gain:
    """The predicted effect of one candidate. Sizes in bytes, times in seconds."""

    pattern: str
    nodes: tuple[str, ...]
    estimated_from: Estimate
    gain_s: float
    speedup: float | None
    launches_saved: int
    bytes_saved: int | None = None
    flops_delta: int | None = None
    working_set_bytes: int | None = None
    fits_fusion_buffer: bool | None = None
    time_before_s: float | None = None
    time_after_s: float | None = None
    rewriter: str | None = None
    # The profile's kernel factor that priced the fused kernel (1: none), and its key
    # (TargetProfile.priced_by: "attention+softcap+cache"; None when the profile has none).
    kernel_factor: float = 1.0
    kernel_factor_key: str | None = None

    @property
    def loses(self) -> bool:
        """Predicted to make its nodes slower than they run unfused (with hints and no
        launch saved the gain is 0, and the speedup says it)."""
        return self.gain_s < 0 or (self.speedup is not None and self.speedup < 1)

    def to_dict(self) -> dict:
        return {
            "pattern": self.pattern,
            "nodes": list(self.nodes),
            "estimated_from": self.estimated_from,
            "gain_s": self.gain_s,
            "speedup": self.speedup,
            "launches_saved": self.launches_saved,
            "bytes_saved": self.bytes_saved,
            "flops_delta": self.flops_delta,
            "working_set_bytes": self.working_set_bytes,
            "fits_fusion_buffer": self.fits_fusion_buffer,
            "time_before_s": self.time_before_s,
            "time_after_s": self.time_after_s,
            "rewriter": self.rewriter,
            "kernel_factor": self.kernel_factor,
            "kernel_factor_key": self.kernel_factor_key,
        }

    def prediction(self) -> dict:
        """The report's ``predicted_gain``: µs per run, keyed like its ``measured_gain``."""
        before = _us(self.time_before_s)
        after = _us(self.time_after_s)
        return {
            "before_us": before,
            "after_us": after,
            "saved_us": _us(self.gain_s),
            "ratio": round(after / before, 4) if before and after is not None else None,
            "speedup": self.speedup,
            "estimated_from": self.estimated_from,
            "launches_saved": self.launches_saved,
            "bytes_saved": self.bytes_saved,
            "flops_delta": self.flops_delta,
            "kernel_factor": self.kernel_factor,
            "kernel_factor_key": self.kernel_factor_key,
        }


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e6, 3)


@dataclass(frozen=True)
class _Traffic:
    bytes_saved: int
    working_set: int


class CostModel:
    """Scores candidates on a target profile; ``dims`` resolves symbolic dimensions."""

    def __init__(
        self,
        profile: TargetProfile | str | os.PathLike,
        dims: Mapping[str, int] | None = None,
        rewriters: RewriterRegistry | None = None,
    ) -> None:
        self.profile = (
            profile if isinstance(profile, TargetProfile) else load_target_profile(profile)
        )
        self.shapes = Shapes(dims)
        self.rewriters = rewriters or builtin_rewriters()

    def node_cost(self, node: ir.Node) -> NodeCost | None:
        """FLOPs and bytes of one node; None when a shape or dtype it needs is unknown."""
        return node_cost(node, self.shapes)

    def node_time(self, node: ir.Node) -> float | None:
        """Roofline seconds of the node as its own kernel (None when its cost is unknown)."""
        cost = self.node_cost(node)
        if cost is None:
            return None
        return self.profile.seconds(bytes_moved=cost.bytes, flops=cost.flops, launches=1)

    def score(self, candidates: Sequence[Match]) -> list[Gain]:
        """One ``Gain`` per candidate, in order."""
        return [self.candidate_gain(match) for match in candidates]

    def candidate_gain(self, match: Match) -> Gain:
        """The predicted gain of rewriting ``match`` (from shapes, else from hints)."""
        effect = rewrite_effect(match, self.rewriters)
        fused = [match.nodes[i] for i in effect.fused]
        launches_saved = len(fused) - effect.kernels_after
        costs = {id(n): self.node_cost(n) for n in fused}
        known = {k: c for k, c in costs.items() if c is not None}
        traffic = None
        if len(known) == len(costs):
            traffic = self._traffic(fused, known, keep_intermediates=effect.intermediates_kept)
        key = self._priced_by(match, effect)
        if traffic is None:
            return self._hint_gain(match, launches_saved, key)
        removed = sum(known[id(match.nodes[i])].flops for i in effect.removed)
        seconds = self.profile.seconds
        before = sum(
            seconds(bytes_moved=c.bytes, flops=c.flops, launches=1) for c in known.values()
        )
        factor = self._factor(key)
        after = factor * seconds(
            bytes_moved=sum(c.bytes for c in known.values()) - traffic.bytes_saved,
            flops=sum(c.flops for c in known.values()) - removed,
            launches=effect.kernels_after,
        )
        return Gain(
            pattern=match.pattern.name,
            nodes=tuple(match.node_names()),
            estimated_from="shapes",
            gain_s=before - after,
            speedup=before / after,
            launches_saved=launches_saved,
            bytes_saved=traffic.bytes_saved,
            flops_delta=-removed,
            working_set_bytes=traffic.working_set,
            fits_fusion_buffer=traffic.working_set <= self.profile.fusion_buffer_bytes,
            time_before_s=before,
            time_after_s=after,
            rewriter=match.pattern.rewriter.name,
            kernel_factor=factor,
            kernel_factor_key=key,
        )

    def loss_reason(self, gain: Gain) -> str | None:
        """Why ``gain``'s fusion is predicted to make its nodes slower, or None when it
        is not: the text of the near miss when a selection leaves it out."""
        if not gain.loses:
            return None
        where = f"on target profile {self.profile.name!r}"
        if gain.estimated_from == "shapes":
            before, after = _us(gain.time_before_s), _us(gain.time_after_s)
            told = f"{before:g} µs for its nodes against {after:g} µs fused"
        else:  # no shapes: the hinted speedup (1 without hints) over the kernel factor
            source = "cost hints" if gain.estimated_from == "hints" else "no shapes or hints"
            told = f"speedup {gain.speedup or 1.0:.3g} from the pattern's {source}"
        why = ""
        if gain.kernel_factor > 1:
            why = (
                f": the kernel that rewriter {gain.rewriter!r} emits runs "
                f"{gain.kernel_factor:g}x its roofline there, measured against the nodes it "
                f"replaces (kernel_factors: {gain.kernel_factor_key}; docs/cost.md)"
            )
        return f"the cost model predicts a loss {where} ({told}){why}"

    def _priced_by(self, match: Match, effect: RewriteEffect) -> str | None:
        pattern = match.pattern
        return self.profile.priced_by(
            pattern.rewriter.name, pattern.name, pattern.groups, effect.modes
        )

    def _factor(self, key: str | None) -> float:
        return 1.0 if key is None else self.profile.kernel_factors[key]

    def _hint_gain(self, match: Match, launches_saved: int, key: str | None) -> Gain:
        hints = match.pattern.cost_hints
        fractions = [] if hints is None else [hints.memory_saving, hints.compute_saving]
        fractions = [f for f in fractions if f is not None]
        speedup = None
        if fractions:
            speedup = min(1.0 / max(1.0 - max(fractions), 1e-9), MAX_HINT_SPEEDUP)
        gain_s = launches_saved * self.profile.launch_overhead_s
        factor = self._factor(key)
        if factor != 1.0:  # a measured kernel factor divides the hinted speedup (1 if none)
            speedup = (speedup or 1.0) / factor
            if speedup < 1:  # the kernel is measured to lose more than the fusion saves
                gain_s = -gain_s
        return Gain(
            pattern=match.pattern.name,
            nodes=tuple(match.node_names()),
            estimated_from="hints" if fractions else "none",
            gain_s=gain_s,
            speedup=speedup,
            launches_saved=launches_saved,
            rewriter=match.pattern.rewriter.name,
            kernel_factor=factor,
            kernel_factor_key=key,
        )

    def _traffic(
        self,
        fused: list[ir.Node],
        costs: Mapping[int, NodeCost],
        *,
        keep_intermediates: bool,
    ) -> _Traffic | None:
        """Bytes saved and working set of the fused nodes; None if a size is unknown."""
        members = {id(n) for n in fused}
        readers: dict[int, tuple[ir.Value, int]] = {}  # external input -> non-view readers
        saved = outputs = largest_internal = 0
        for node in fused:
            view = costs[id(node)].view
            for value in {id(v): v for v in node.inputs if v is not None}.values():
                producer = value.producer()
                if producer is None or id(producer) not in members:
                    _, count = readers.get(id(value), (value, 0))
                    readers[id(value)] = (value, count + (0 if view else 1))
            for value in (v for v in node.outputs if v.name):
                size = self.shapes.nbytes(value)
                if size is None:
                    return None
                consumers = {id(c): c for c in value.consumers()}
                if value.is_graph_output() or not consumers or not consumers.keys() <= members:
                    outputs += size
                    continue
                largest_internal = max(largest_internal, size)
                if not keep_intermediates:
                    reads = sum(1 for c in consumers if not costs[c].view)
                    saved += size * ((0 if view else 1) + reads)
        inputs = 0
        for value, count in readers.values():
            size = self.shapes.nbytes(value)
            if size is None:
                return None
            inputs += size
            saved += size * max(count - 1, 0)
        return _Traffic(bytes_saved=saved, working_set=inputs + outputs + largest_internal)


def rewrite_effect(match: Match, rewriters: RewriterRegistry | None = None) -> RewriteEffect:
    """What ``match``'s rewriter says its rewrite does to the cost of the matched nodes
    (``Rewriter.cost_effect``, with the rewriter's own params); one fused kernel for a
    rewriter the registry does not know."""
    spec = match.pattern.rewriter
    rewriter = (rewriters or builtin_rewriters()).get(spec.name)
    if rewriter is None:
        return RewriteEffect(matched(match))
    return rewriter.cost_effect(match, rewriter.Params.model_validate(spec.params))
