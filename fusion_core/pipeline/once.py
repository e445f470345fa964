"""One pass of the pipeline: ``optimize_once(model, config) -> Result``.

load -> pre-passes -> (match -> select -> rewrite)* -> clean up -> check

Rewriting runs in rounds: each round enumerates every candidate of every pattern on
the current graph, the strategy picks a non-overlapping subset, and the rewriters
replace it. A fusion can expose another (a Conv+BN folded into a Conv can then take
its activation), so rounds repeat until one changes nothing. The near misses are those
of that last round (the places that did not fuse, with the constraint that failed) and
every rewriter refusal of any round, even where another rewrite later changed the
nodes (generic attention refused below opset 23, then its scale folded).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common

from autofusion.fusion_core.catalog import CompiledPattern, builtin_patterns, compile_all
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.cost import CostModel
from autofusion.fusion_core.errors import ConfigError, PatternError
from autofusion.fusion_core.ir import (
    PROTOBUF_LIMIT_BYTES,
    load_model,
    model_from_proto,
    node_positions,
)
from autofusion.fusion_core.patterns import Match, Matcher, NearMiss, check_match
from autofusion.fusion_core.pipeline.left_alone import left_alone, quantized_unit
from autofusion.fusion_core.pipeline.switches import resolve_switches
from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses
from autofusion.fusion_core.prepasses.opset import upgrade_opset
from autofusion.fusion_core.rewriters import (
    Rewrite,
    RewriteContext,
    RewriterRegistry,
    apply_rewrite,
    builtin_rewriters,
    discard,
    missing_output,
)
from autofusion.fusion_core.strategies.pricing import selection_for
from autofusion.fusion_core.targets import get_target
from autofusion.fusion_core.validate import (
    CANNOT_LOAD,
    ORIGINAL_CANNOT_RUN,
    CheckResult,
    FloatDistribution,
    OutputSignature,
    PrecisionReport,
    RegionReport,
    check_fp16,
    checker_problems,
    compare_models,
    compare_regions,
    output_signature,
    random_inputs,
    structure_problems,
)

__all__ = [
    "AppliedFusion",
    "Result",
    "check_against_original",
    "optimize_once",
    "select_patterns",
    "subgraphs",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppliedFusion:
    pattern: str
    replaced_nodes: tuple[str, ...]
    new_nodes: tuple[str, ...]
    new_ops: tuple[str, ...]
    round: int
    rewriter: str | None = None  # its name in the rewriter registry
    # The cost model's prediction for this fusion on config.target_profile
    # (fusion_core.cost.Gain.prediction), priced on the graph it was applied to.
    predicted_gain: dict | None = None

    def to_dict(self) -> dict:
        return {
            "pattern": self.pattern,
            "replaced_nodes": list(self.replaced_nodes),
            "new_nodes": list(self.new_nodes),
            "new_ops": list(self.new_ops),
            "round": self.round,
            "rewriter": self.rewriter,
            "predicted_gain": self.predicted_gain,
        }


@dataclass
class Result:
    """What one optimization did. ``model`` is the fused model (onnx-ir)."""

    model: ir.Model
    target: str
    patterns_used: list[str]
    applied: list[AppliedFusion] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    ops_before: Counter = field(default_factory=Counter)
    ops_after: Counter = field(default_factory=Counter)
    timings: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    prepasses: list[str] = field(default_factory=list)
    check: CheckResult | None = None
    regions: RegionReport | None = None  # set when the check fails: which fusion drifts
    rollbacks: list[dict] = field(default_factory=list)  # progressive validation took back
    structure: list[str] = field(default_factory=list)  # what a rewrite broke (empty: nothing)
    precision: PrecisionReport | None = None  # fp16 range analysis, when asked for
    selections: list[dict] = field(default_factory=list)  # cost-based selection, per round
    switches: list[dict] = field(default_factory=list)  # dynamic switches and whether they fired
    left_alone: list[dict] = field(default_factory=list)  # parts no rule rewrites, and why
    measurement: dict | None = None  # measured selection: groups, decisions, final ratio

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(f.pattern for f in self.applied))

    def to_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)


def optimize_once(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    *,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    skip: Mapping[tuple[str, frozenset[str]], str] | None = None,
    skip_kind: str = "rollback",
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> Result:
    """One pass of ``optimize`` (pre-passes, rounds of fusion, the check), neither
    measured nor in progressive stages: what measured selection builds each variant
    with. Selection ``measured`` here is its proposal: priority that keeps what the
    cost model prices as a loss. ``on_phase`` hears each phase as it starts: ``load``,
    ``prepasses``, ``fuse``, ``check``."""
    registry, phase = registry or builtin_rewriters(), on_phase or _no_phase
    timings: dict[str, float] = {}
    start = time.perf_counter()
    phase("load")
    original, work = _load(model, keep_original=config.check.enabled)
    timings["load"] = time.perf_counter() - start

    config, switched = resolve_switches(config, work)
    chosen = select_patterns(config, registry, patterns)
    result = Result(model=work, target=config.target, patterns_used=[p.name for p in chosen])
    result.switches = [s.to_dict() for s in switched]
    result.ops_before = _op_counts(work)

    start = time.perf_counter()
    phase("prepasses")
    work, result.prepasses = _prepasses(work, config)
    result.model = work
    timings["prepasses"] = time.perf_counter() - start

    signature = output_signature(work)
    phase("fuse")
    ctx = RewriteContext(work, get_target(config.target))
    timings["match"] = timings["rewrite"] = 0.0
    # The main graph first, then every If/Loop/Scan body: each is matched on its own.
    bodies = subgraphs(work.graph)
    result.left_alone = left_alone(work, len(bodies))  # before our own contrib ops appear
    for graph in [work.graph, *bodies]:
        ctx.current_graph = graph
        skipped = _Skipped(dict(skip or {}), skip_kind)
        _rewrite_rounds(result, graph, ctx, chosen, config, timings, skipped, signature)
    result.near_misses = list(dict.fromkeys(result.near_misses))  # skips repeat per graph

    _cleanup(work, timings)
    result.ops_after = _op_counts(work)

    if config.check.enabled and original is not None:
        start = time.perf_counter()
        phase("check")
        keep_fp32 = {p.name for p in chosen if p.spec.keep_fp32}
        check_against_original(result, original, config, keep_fp32, feeds)
        timings["check"] = time.perf_counter() - start
    result.timings = timings
    return result


def _cleanup(work: ir.Model, timings: dict[str, float]) -> None:
    """What the rewrites left unused goes; the nodes are sorted again."""
    start = time.perf_counter()
    common.RemoveUnusedNodesPass()(work)
    common.TopologicalSortPass()(work)
    timings["cleanup"] = time.perf_counter() - start


def _no_phase(_name: str) -> None:
    pass


def _prepasses(work: ir.Model, config: OptimizeConfig) -> tuple[ir.Model, list[str]]:
    """The opt-in opset upgrade (fusion_core/prepasses/opset.py), then the other
    pre-passes; what they did, in the report's words."""
    work, upgrade = upgrade_opset(work, config.upgrade_opset)
    prepasses = run_prepasses(work, _prepass_options(config))
    if upgrade is not None:  # the report says what the upgrade did
        prepasses.insert(0, upgrade.describe())
    return work, prepasses


def check_against_original(
    result: Result,
    original: onnx.ModelProto,
    config: OptimizeConfig,
    keep_fp32: set[str],
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> None:
    """Compare with the original; on failure name the drifting region; fp16 ranges."""
    c = config.check
    fused = result.to_proto()
    distribution = FloatDistribution(
        c.input_distribution, mean=c.input_mean, std=c.input_std, low=c.input_low, high=c.input_high
    )
    result.check = compare_models(
        original,
        fused,
        rtol=c.rtol,
        atol=c.atol,
        samples=c.samples,
        seed=c.seed,
        profiles=c.shape_profiles(),
        tolerances=c.tolerances,
        distribution=distribution,
        feeds=feeds,
    )
    # onnxruntime's own registrations (LayerNormalization below opset 17) fail onnx's
    # checker by design; the generic target must pass it in full.
    if config.target == "generic" and fused.ByteSize() <= PROTOBUF_LIMIT_BYTES:
        result.structure += _new_checker_problems(original, fused)
    if result.structure:
        result.check.passed = False
        result.check.error = result.check.error or "; ".join(result.structure)
    if result.check.failure in (ORIGINAL_CANNOT_RUN, CANNOT_LOAD):
        return  # nothing ran: no region or range can be compared either
    if feeds is None and (not result.check.passed or config.precision == "fp16"):
        # the sizes the check settled on: ones the original runs on
        dims = result.check.profiles[0].dims if result.check.profiles else c.shape_profiles()[0]
        feeds = [
            random_inputs(original, seed=c.seed + k, dims=dims, distribution=distribution)
            for k in range(c.samples)
        ]
    if feeds and result.applied and not result.check.passed:
        result.regions = compare_regions(original, fused, feeds, rtol=c.rtol, atol=c.atol)
    if feeds and result.applied and config.precision == "fp16":
        result.precision = check_fp16(original, fused, feeds, keep_fp32=keep_fp32)


def _new_checker_problems(original: onnx.ModelProto, fused: onnx.ModelProto) -> list[str]:
    """onnx's checker on the fused model, at the strictest level the original passes:
    what the model already had (onnx's node test ``test_mvn`` fails the full check as
    shipped) is not the fusion's doing."""
    for full_check in (True, False):
        if not checker_problems(original, full_check=full_check):
            return checker_problems(fused, full_check=full_check)
    return []


def _load(
    model: ir.Model | onnx.ModelProto | str | os.PathLike, *, keep_original: bool
) -> tuple[onnx.ModelProto | None, ir.Model]:
    """The original as a proto (kept for the check) and an independent working copy."""
    if isinstance(model, (str, os.PathLike)):
        loaded = load_model(model)
        if not keep_original:  # no check: copying a large model would cost as much as parsing it
            return None, loaded
        # External data is resolved against the model's folder only while the tensors
        # are lazy; the check hands onnxruntime protos, so read the weights in now.
        ir.external_data.load_to_model(loaded)
        original = ir.to_proto(loaded)
        return original, loaded
    if isinstance(model, onnx.ModelProto):
        return model, model_from_proto(model)
    original = ir.to_proto(model)
    return original, ir.serde.deserialize_model(original)


def select_patterns(
    config: OptimizeConfig,
    registry: RewriterRegistry,
    patterns: Sequence[CompiledPattern] | None = None,
) -> list[CompiledPattern]:
    """The patterns this run uses: for the target, filtered by include/exclude."""
    available = list(patterns) if patterns is not None else builtin_patterns(registry)
    names = {p.name for p in available}
    for extra in compile_all(config.extra_patterns, registry):
        if extra.name in names:
            raise PatternError(
                f"pattern name {extra.name!r} is already taken",
                hint="give your pattern its own name, e.g. in a namespace: mycompany.conv_bn",
            )
        names.add(extra.name)
        available.append(extra)
    asked = set(config.patterns or []) | set(config.exclude)
    unknown = sorted(asked - names)
    if unknown:
        raise ConfigError(
            f"unknown pattern name(s) {unknown}",
            hint="`autofusion patterns list` shows the available patterns",
        )
    get_target(config.target)
    chosen = [
        p
        for p in available
        if config.target in p.spec.targets
        and (config.patterns is None or p.name in config.patterns)
        and p.name not in config.exclude
    ]
    return chosen


def _prepass_options(config: OptimizeConfig) -> PrepassOptions:
    return PrepassOptions(
        fold_constants=config.fold_constants,
        fold_input_size_limit=config.fold_input_size_limit,
        fold_output_size_limit=config.fold_output_size_limit,
        shape_inference=config.shape_inference,
    )


def subgraphs(graph: ir.Graph) -> list[ir.Graph]:
    """Every If/Loop/Scan body below ``graph``, outer ones first."""
    found = []
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                found.append(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                found.extend(attr.as_graphs())
    return found


@dataclass(frozen=True)
class _Skipped:
    """Fusions the caller said not to apply (progressive's rollbacks, measured
    selection's left-out groups), and the near-miss kind they are reported as."""

    reasons: dict[tuple[str, frozenset[str]], str]
    kind: str

    def kind_of(self, key: tuple[str, frozenset[str]]) -> str:
        return self.kind if key in self.reasons else "rewriter"


def _rewrite_rounds(
    result: Result,
    graph: ir.Graph,
    ctx: RewriteContext,
    patterns: list[CompiledPattern],
    config: OptimizeConfig,
    timings: dict,
    skipped: _Skipped,
    signature: OutputSignature,
) -> None:
    refused = dict(skipped.reasons)  # and what a rewriter said no to: do not retry
    by_name = {p.name: p for p in patterns}
    matcher = Matcher([p.spec for p in patterns], max_matches=config.max_matches_per_pattern)
    # Priority selection uses the cost model only for the config's limits; the report
    # shows its prediction for every fusion either way.
    rewriters = RewriterRegistry(p.rewriter for p in patterns)  # each prices its own effect
    strategy = selection_for(config, op_count=sum(1 for _ in graph), rewriters=rewriters)
    cost = strategy.cost
    for round_number in range(1, config.max_rounds + 1):
        start = time.perf_counter()
        found = matcher.find(graph)
        candidates = [m for m in found.candidates if _key(m) not in refused]
        timings["match"] += time.perf_counter() - start
        start = time.perf_counter()
        ctx.positions = node_positions(graph)
        strategy.positions = ctx.positions
        applied = refusals = 0
        waiting: set[int] = set()  # nodes of candidates a refused one had blocked
        by_node: dict[int, list[Match]] = {}  # built on the first refusal of the round
        for match in strategy.select(candidates):
            if not waiting.isdisjoint(match.node_ids()):
                continue  # next round: what the refused candidate blocked goes first
            compiled = by_name[match.pattern.name]
            reason = _try_rewrite(match, compiled, ctx, cost, result, round_number)
            if reason is None:
                applied += 1
                continue
            refused[_key(match)] = reason
            refusals += 1
            if not by_node:
                for other in candidates:
                    for node_id in other.node_ids():
                        by_node.setdefault(node_id, []).append(other)
            waiting |= _blocked_by(match, by_node)
        if applied:
            graph.sort()
            broken = structure_problems(result.model, signature)
            if broken:  # a rewriter bug: stop here rather than build on it
                result.structure += [f"round {round_number}: {p}" for p in broken]
                break
        timings["rewrite"] += time.perf_counter() - start
        result.rounds = max(result.rounds, round_number)
        # A refused candidate may have hidden an overlapping one that would succeed:
        # another round retries without it.
        if not applied and not refusals:
            result.near_misses += _last_near_misses(found.near_misses, refused, skipped)
            break
    result.near_misses += strategy.dropped  # also when max_rounds ran out
    result.selections += strategy.records


def _try_rewrite(
    match: Match,
    compiled: CompiledPattern,
    ctx: RewriteContext,
    cost: CostModel,
    result: Result,
    round_number: int,
) -> str | None:
    """Rewrite ``match`` and record it; or why it cannot be (nothing changed then)."""
    reason = check_match(match) or quantized_unit(match)
    if reason is not None:
        return reason
    rewrite = compiled.rewriter.rewrite(match, compiled.params, ctx)
    if isinstance(rewrite, str):
        return f"rewriter {compiled.rewriter.name!r}: {rewrite}"
    if (reason := missing_output(match, rewrite)) is not None:
        discard(rewrite)
        return reason
    predicted = cost.candidate_gain(match).prediction()  # before the rewrite
    apply_rewrite(ctx, match, rewrite)
    _record(result, match, rewrite, round_number, compiled.rewriter.name, predicted)
    return None


def _last_near_misses(
    found: list[NearMiss], refused: dict[tuple[str, frozenset[str]], str], skipped: _Skipped
) -> list[NearMiss]:
    """The matcher's near misses of the last round, and every refusal (or skip) of any
    round. A place a rewriter refused is explained by that refusal: the matcher's own
    account of the same pattern there (of what the refusal's earlier rewrite left
    behind) would say it twice."""
    refused_nodes: dict[str, set[str]] = {}
    for pattern, nodes in refused:
        refused_nodes.setdefault(pattern, set()).update(nodes)
    kept = [m for m in found if refused_nodes.get(m.pattern, set()).isdisjoint(m.nodes)]
    return kept + [
        NearMiss(pattern, tuple(sorted(nodes)), reason, skipped.kind_of((pattern, nodes)))
        for (pattern, nodes), reason in refused.items()
    ]


def _blocked_by(match: Match, by_node: dict[int, list[Match]]) -> set[int]:
    """Nodes of the other candidates that overlap ``match`` (the ones it kept out)."""
    blocked: set[int] = set()
    for node_id in match.node_ids():
        for other in by_node.get(node_id, ()):
            if other is not match:
                blocked |= other.node_ids()
    return blocked


def _key(match: Match) -> tuple[str, frozenset[str]]:
    return match.pattern.name, frozenset(match.node_names())


def _record(
    result: Result,
    match: Match,
    rewrite: Rewrite,
    round_number: int,
    rewriter: str,
    predicted_gain: dict | None,
) -> None:
    new_nodes = rewrite.new_nodes
    result.applied.append(
        AppliedFusion(
            pattern=match.pattern.name,
            replaced_nodes=tuple(match.node_names()),
            new_nodes=tuple(n.name or "" for n in new_nodes),
            new_ops=tuple(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in new_nodes),
            round=round_number,
            rewriter=rewriter,
            predicted_gain=predicted_gain,
        )
    )


def _op_counts(model: ir.Model) -> Counter:
    """Op types over every graph, If/Loop/Scan bodies included."""
    return Counter(
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in ir.traversal.RecursiveGraphIterator(model.graph)
    )
