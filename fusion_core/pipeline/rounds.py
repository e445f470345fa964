"""The rounds of match, select and rewrite, as a pass: ``RewriteRounds(...)(model)``.

Each round enumerates every candidate of every pattern on the current graph, the
selection (``fusion_core.strategies.pricing``) picks a non-overlapping subset, and the
rewriters replace it. A fusion can expose another (a Conv+BN folded into a Conv can then
take its activation), so rounds repeat until one changes nothing; what a fusion
re-emitted unfused its pattern does not take again (``reemitted.py``). The main graph goes
first, then every If/Loop/Scan body, each matched on its own.

The pass follows onnx-ir's contract (``onnx_ir.passes.InPlacePass``: ``call(model) ->
PassResult``): it rewrites the model in place and returns a ``RoundsResult`` that holds
everything it did (the fusions, the near misses, the rounds, the per-round selections,
what a rewrite broke); it touches no list of its caller's. The near misses are those of
each graph's last round (the places that did not fuse, with the constraint that failed)
and every rewriter refusal of any round, even where another rewrite later changed the
nodes (generic attention refused below opset 23, then its scale folded).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from autofusion.fusion_core.canonical import canonical_form, undo_unused
from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.cost import CostModel
from autofusion.fusion_core.ir import node_positions
from autofusion.fusion_core.patterns import Match, Matcher, NearMiss, check_match
from autofusion.fusion_core.pipeline.left_alone import quantized_unit
from autofusion.fusion_core.pipeline.reemitted import Reemitted
from autofusion.fusion_core.pipeline.reproducer import cut_region
from autofusion.fusion_core.pipeline.result import AppliedFusion, Rejection
from autofusion.fusion_core.pipeline.transaction import (
    StepFailed,
    StepGuard,
    cycle_problem,
    describe_exception,
    step_problems,
)
from autofusion.fusion_core.rewriters import (
    AppliedRewrite,
    NotACandidate,
    RewriteContext,
    RewriterRegistry,
    apply_rewrite,
    discard,
    missing_output,
)
from autofusion.fusion_core.strategies.pricing import selection_for
from autofusion.fusion_core.targets import get_target
from autofusion.fusion_core.validate import (
    OutputSignature,
    cycle_members,
    output_signature,
    structure_problems,
)

__all__ = ["RewriteRounds", "RoundsResult", "subgraphs"]

_Key = tuple[str, frozenset[str]]  # (pattern, matched node names)


@dataclass
class RoundsResult(ir.passes.PassResult):
    """What the rounds did to ``model`` (``modified``: any fusion applied)."""

    applied: list[AppliedFusion] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    rounds: int = 0  # the most rounds any graph took
    structure: list[str] = field(default_factory=list)  # what a rewrite broke (a bug)
    rejected: list[Rejection] = field(default_factory=list)  # rewrites taken back (bugs)
    selections: list[dict] = field(default_factory=list)  # cost-based selection, per round
    # The canonical form's rewrites that fusions used (fusion_core.canonical), per rule.
    canonical: Counter = field(default_factory=Counter)
    match_s: float = 0.0
    rewrite_s: float = 0.0


class RewriteRounds(ir.passes.InPlacePass):
    """Rounds of fusion with ``patterns`` under ``config`` (its selection, limits,
    ``max_rounds``). ``skip`` names fusions not to apply, (pattern, node names) ->
    reason, reported as near misses of ``skip_kind`` (progressive's rollbacks,
    measured selection's left-out groups).

    Every rewrite is a transaction (``transaction.py``): one that emits what the model
    cannot load, makes a cycle or raises is undone and listed in
    ``RoundsResult.rejected``; a canonical rule that does raises ``StepFailed`` (the
    caller runs again without ``disabled_rules``).

    Postcondition: every graph is sorted; when a round leaves the model structurally
    broken (``fusion_core.validate.structure_problems``), the rounds stop there and
    ``RoundsResult.structure`` says what broke."""

    def __init__(
        self,
        patterns: Sequence[CompiledPattern],
        config: OptimizeConfig,
        *,
        skip: Mapping[_Key, str] | None = None,
        skip_kind: str = "rollback",
        disabled_rules: frozenset[str] = frozenset(),
    ) -> None:
        self.patterns = list(patterns)
        self.config = config
        self.skip = dict(skip or {})
        self.skip_kind = skip_kind
        self.disabled_rules = disabled_rules

    def call(self, model: ir.Model) -> RoundsResult:
        result = RoundsResult(model, modified=False)
        ctx = RewriteContext(model, get_target(self.config.target))
        signature = output_signature(model)
        for graph in [model.graph, *subgraphs(model.graph)]:
            ctx.current_graph = graph
            _GraphRounds(self, graph, ctx, result).run(signature)
        result.near_misses = list(dict.fromkeys(result.near_misses))  # skips repeat per graph
        result.modified = bool(result.applied)
        return result


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


class _GraphRounds:
    """The rounds on one graph, written into the pass's own result."""

    def __init__(
        self, rounds: RewriteRounds, graph: ir.Graph, ctx: RewriteContext, result: RoundsResult
    ) -> None:
        patterns, config = rounds.patterns, rounds.config
        self.graph, self.ctx, self.result = graph, ctx, result
        self.max_rounds = config.max_rounds
        self.by_name = {p.name: p for p in patterns}
        specs = [p.spec for p in patterns]
        self.matcher = Matcher(specs, max_matches=config.max_matches_per_pattern)
        # Priority selection uses the cost model only for the config's limits; the report
        # shows its prediction for every fusion either way.
        rewriters = RewriterRegistry(p.rewriter for p in patterns)  # each prices its own effect
        op_count = sum(1 for _ in graph)
        self.strategy = selection_for(config, op_count=op_count, rewriters=rewriters)
        self.skip_kind = rounds.skip_kind
        self.disabled_rules = rounds.disabled_rules
        self.skipped = set(rounds.skip)
        self.refused = dict(rounds.skip)  # and what a rewriter said no to: do not retry
        self.bugs: set[_Key] = set()  # refused because the rewrite broke the graph
        self.reemitted = Reemitted()  # what a fusion re-emitted unfused: not taken again

    def run(self, signature: OutputSignature) -> None:
        result = self.result
        canonical: Counter[str] = Counter()
        for round_number in range(1, self.max_rounds + 1):
            start = time.perf_counter()
            guard = StepGuard(result.model, self.ctx.target.name, "canonical", self.graph)
            changed = canonical_form(
                self.graph, self.ctx.fresh_name, disabled=self.disabled_rules, guard=guard
            )
            canonical += changed
            if changed:  # what a rewriter refused may hold in the new spelling (a norm
                # moved before the Transpose makes the heads a rotary reads transposed)
                self.refused = {k: v for k, v in self.refused.items() if k in self.skipped}
            found = self.matcher.find(self.graph)
            self._leave_out_failed(found.failed)
            candidates = [
                m
                for m in found.candidates
                if _key(m) not in self.refused and not self.reemitted.taken_again(m)
            ]
            result.match_s += time.perf_counter() - start
            start = time.perf_counter()
            rejected = len(result.rejected)
            applied, refusals = self._round(candidates, round_number)
            if applied:
                applied -= self._undo_cycles()
            if applied or len(result.rejected) > rejected:  # an undo puts nodes back unsorted
                self.graph.sort()
                broken = structure_problems(result.model, signature)
                if broken:  # a rewriter bug: stop here rather than build on it
                    result.structure += [f"round {round_number}: {p}" for p in broken]
                    break
            result.rewrite_s += time.perf_counter() - start
            result.rounds = max(result.rounds, round_number)
            # A refused candidate may have hidden an overlapping one that would succeed:
            # another round retries without it.
            if not applied and not refusals:
                result.near_misses += self._last_near_misses(found.near_misses)
                break
        else:  # max_rounds ran out (a rewriter refusing each round): say what the last found
            result.near_misses += self._last_near_misses(found.near_misses)
        result.near_misses += self.strategy.dropped  # also when max_rounds ran out
        result.selections += self.strategy.records
        try:
            canonical -= undo_unused(self.graph)  # what no fusion took goes again
        except Exception as exc:
            raise StepGuard(result.model, self.ctx.target.name, "canonical").raised(
                "undo_unused", exc
            ) from exc
        result.canonical += canonical

    def _leave_out_failed(self, failed: Mapping[str, Exception]) -> None:
        """A pattern whose search raised is a rejected step, left out of the later rounds;
        every other pattern's matches stand (one broken pattern costs only itself)."""
        for name, exc in failed.items():
            said = describe_exception(f"matching {name!r}", exc)
            rejection = Rejection("match", name, (), said)
            if rejection not in self.result.rejected:
                self.result.rejected.append(rejection)
        kept = [spec for spec in self.matcher.patterns if spec.name not in failed]
        if len(kept) < len(self.matcher.patterns):
            self.matcher = Matcher(kept, max_matches=self.matcher.max_matches)

    def _round(self, candidates: list[Match], round_number: int) -> tuple[int, int]:
        """One round's rewrites: how many applied, how many a rewriter refused."""
        self.ctx.positions = node_positions(self.graph)
        self.strategy.positions = self.ctx.positions
        applied = refusals = 0
        self.journal: list[tuple[AppliedFusion, AppliedRewrite, Match]] = []
        waiting: set[int] = set()  # nodes of candidates a refused one had blocked
        by_node: dict[int, list[Match]] = {}  # built on the first refusal of the round
        for match in self.strategy.select(candidates):
            if not waiting.isdisjoint(match.node_ids()):
                continue  # next round: what the refused candidate blocked goes first
            compiled = self.by_name[match.pattern.name]
            outcome = _try_rewrite(
                match, compiled, self.ctx, self.strategy.cost, round_number, waiting
            )
            if isinstance(outcome, tuple):
                self.result.applied.append(outcome[0])
                self.result.near_misses += outcome[0].near_misses()
                self.journal.append((*outcome, match))
                self.reemitted.record(match.pattern.name, outcome[1])
                applied += 1
                continue
            if isinstance(outcome, NotACandidate):
                continue  # the rewriter's own making (a kept router): no near miss
            if isinstance(outcome, Rejection):
                self.result.rejected.append(outcome)
                self.bugs.add(_key(match))
                outcome = f"rolled back as a bug: {outcome.failed}"
            self.refused[_key(match)] = outcome
            refusals += 1
            if not by_node:
                for other in candidates:
                    for node_id in other.node_ids():
                        by_node.setdefault(node_id, []).append(other)
            waiting |= _blocked_by(match, by_node)
        return applied, refusals

    def _undo_cycles(self) -> int:
        """Undo this round's rewrites whose new nodes lie on a cycle (a fused op that
        reads what its own output feeds); how many. The cycle names the rewrite: the
        graph was acyclic before the round and each rewrite alone replaces its match."""
        cyclic = cycle_members(self.graph)
        if not cyclic:
            return 0
        undone = 0
        for fusion, applied, match in reversed(self.journal):
            moved = [node for _, _, readers, _ in applied.moved for node, _ in readers]
            if not any(id(n) in cyclic for n in [*applied.new_nodes, *moved]):
                continue  # neither what it wrote nor a reader it moved is on the cycle
            failed = cycle_problem(self.graph) or "the graph has a cycle"
            applied.undo()
            self.result.applied.remove(fusion)
            for miss in fusion.near_misses():
                self.result.near_misses.remove(miss)
            rejection = _rejection(match, self.ctx, failed)
            self.result.rejected.append(rejection)
            self.bugs.add(_key(match))
            self.refused[_key(match)] = f"rolled back as a bug: {failed}"
            undone += 1
            cyclic = cycle_members(self.graph)
            if not cyclic:
                break
        if cyclic:  # no rewrite's doing, and each rule was checked: give up on fusing
            failed = cycle_problem(self.graph) or "the graph has a cycle"
            raise StepFailed(Rejection("rounds", "rounds", (), failed), fatal=True)
        return undone

    def _last_near_misses(self, found: list[NearMiss]) -> list[NearMiss]:
        """The matcher's near misses of the last round, and every refusal (or skip) of any
        round. A place a rewriter refused is explained by that refusal: the matcher's own
        account of the same pattern there (of what the refusal's earlier rewrite left
        behind) would say it twice."""
        refused_nodes: dict[str, set[str]] = {}
        for pattern, nodes in self.refused:
            refused_nodes.setdefault(pattern, set()).update(nodes)
        kept = [m for m in found if refused_nodes.get(m.pattern, set()).isdisjoint(m.nodes)]
        return kept + [
            NearMiss(pattern, tuple(sorted(nodes)), reason, self._kind_of((pattern, nodes)))
            for (pattern, nodes), reason in self.refused.items()
        ]

    def _kind_of(self, key: _Key) -> str:
        if key in self.bugs:
            return "bug"
        return self.skip_kind if key in self.skipped else "rewriter"


def _try_rewrite(
    match: Match,
    compiled: CompiledPattern,
    ctx: RewriteContext,
    cost: CostModel,
    round_number: int,
    gone: set[int],
) -> tuple[AppliedFusion, AppliedRewrite] | Rejection | str:
    """Rewrite ``match``: the fusion applied (with what undoes it), why it cannot be
    (nothing changed then; a ``NotACandidate`` as it came, reported nowhere), or a
    ``Rejection`` when the rewriter raised or wrote what the model cannot load (undone:
    nothing changed either). The nodes a rewrite absorbed
    beyond its match go into ``gone``: a candidate of this round that holds one of them
    is stale and waits for the next round's matching."""
    reason = check_match(match) or quantized_unit(match)
    if reason is not None:
        return reason
    name, nodes = match.pattern.name, tuple(match.node_names())
    try:
        rewrite = compiled.rewriter.rewrite(match, compiled.params_for(match.pattern), ctx)
    except Exception as exc:  # a bug of the rewriter: this match stays as it is
        failed = describe_exception(f"rewriter {compiled.rewriter.name!r}", exc)
        return _rejection(match, ctx, failed)
    if isinstance(rewrite, NotACandidate):
        return rewrite
    if isinstance(rewrite, str):
        return f"rewriter {compiled.rewriter.name!r}: {rewrite}"
    if (reason := missing_output(match, rewrite)) is not None:
        discard(rewrite)
        return reason
    predicted = cost.candidate_gain(match).prediction()  # before the rewrite
    try:
        applied = apply_rewrite(ctx, match, rewrite)
    except Exception as exc:  # half applied: only a run without it is sure to be whole
        failed = describe_exception("applying the rewrite", exc)
        raise StepFailed(Rejection("rewrite", name, nodes, failed)) from exc
    failed = step_problems(rewrite.new_nodes, ctx.model, ctx.target.name)
    if failed is not None:
        applied.undo()
        return _rejection(match, ctx, failed)
    gone.update(id(n) for n in rewrite.absorbed)
    new_nodes = rewrite.new_nodes
    fusion = AppliedFusion(
        pattern=name,
        replaced_nodes=nodes,
        new_nodes=tuple(n.name or "" for n in new_nodes),
        new_ops=tuple(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in new_nodes),
        round=round_number,
        rewriter=compiled.rewriter.name,
        predicted_gain=predicted,
        notes=tuple(rewrite.notes),
    )
    return fusion, applied


def _rejection(match: Match, ctx: RewriteContext, failed: str) -> Rejection:
    """A rewrite of ``match`` taken back as a bug, with its region as a reproducer (the
    matched nodes are in the graph again, as they were)."""
    matched = match.node_ids()
    in_order = [n for n in ctx.graph if id(n) in matched]
    reproducer = cut_region(ctx.model, in_order)
    nodes = tuple(match.node_names())
    return Rejection("rewrite", match.pattern.name, nodes, failed, reproducer=reproducer)


def _blocked_by(match: Match, by_node: dict[int, list[Match]]) -> set[int]:
    """Nodes of the other candidates that overlap ``match`` (the ones it kept out)."""
    blocked: set[int] = set()
    for node_id in match.node_ids():
        for other in by_node.get(node_id, ()):
            if other is not match:
                blocked |= other.node_ids()
    return blocked


def _key(match: Match) -> _Key:
    return match.pattern.name, frozenset(match.node_names())
