"""Cost-based strategies: the same objective (total gain of a non-overlapping set) reached
by greedy, dp (exact), genetic and auto. Gains are integers so objectives are exact."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.strategies._candidates import Candidate, Selection, Solution
from autofusion.fusion_core.strategies._conflicts import Problem
from autofusion.fusion_core.strategies._exact import solve_interval, solve_search, solve_tree
from autofusion.fusion_core.strategies.auto import AutoStrategy, strategy_by_name
from autofusion.fusion_core.strategies.dp import DPStrategy
from autofusion.fusion_core.strategies.genetic import GeneticStrategy
from autofusion.fusion_core.strategies.greedy import GreedyStrategy

ALL = [GreedyStrategy, DPStrategy, GeneticStrategy, AutoStrategy]


def cand(cid, nodes, gain, **kw) -> Candidate:
    return Candidate(cid, frozenset(nodes), gain, **kw)


def triangle() -> list[Candidate]:
    """A 10 overlapping two disjoint 6s: greedy 10, optimum 12."""
    return [cand("big", {1, 2}, 10), cand("left", {1}, 6), cand("right", {2}, 6)]


def stars(count: int) -> list[Candidate]:
    """``count`` stars: a 10 over three disjoint 4s. Greedy 10 each, optimum 12 each."""
    out = []
    for s in range(count):
        b = 10 * s
        out.append(cand(f"hub{s}", {b, b + 1, b + 2}, 10))
        out += [cand(f"leaf{s}.{k}", {b + k}, 4) for k in range(3)]
    return out


def sliding(count: int, width: int = 3) -> list[Candidate]:
    """Candidate i covers nodes i .. i+width-1: a chain with cycles in its conflict graph."""
    return [cand(i, range(i, i + width), 1 + (i * 7) % 5) for i in range(count)]


def random_intervals(rng, n: int, span: int = 12) -> tuple[list[Candidate], dict[int, int]]:
    out = []
    for i in range(n):
        lo = int(rng.integers(0, span))
        length = int(rng.integers(1, 5))
        out.append(cand(i, range(lo, lo + length), int(rng.integers(1, 21))))
    nodes = sorted(set().union(*(c.node_ids for c in out)))
    return out, {node: node + 100 for node in nodes}  # a topological index, not the id


def random_sets(rng, n: int, universe: int = 14) -> list[Candidate]:
    out = []
    for i in range(n):
        size = int(rng.integers(1, 4))
        nodes = rng.choice(universe, size=size, replace=False)
        out.append(cand(f"c{i}", (int(x) for x in nodes), int(rng.integers(1, 21))))
    return out


def brute_force(candidates: list[Candidate]) -> float:
    best = 0
    for r in range(len(candidates) + 1):
        for subset in itertools.combinations(candidates, r):
            nodes = [n for c in subset for n in c.node_ids]
            if len(nodes) == len(set(nodes)):
                best = max(best, sum(c.gain for c in subset))
    return best


def assert_consistent(result: Selection, candidates: list[Candidate]) -> None:
    """Chosen sets are disjoint, every candidate is either chosen or rejected."""
    seen: set[int] = set()
    for c in result.chosen:
        assert seen.isdisjoint(c.node_ids)
        seen |= c.node_ids
    ids = result.chosen_ids + [r.candidate.id for r in result.rejected]
    assert sorted(map(str, ids)) == sorted(str(c.id) for c in candidates)
    assert result.objective == sum(c.gain for c in result.chosen)
    json.dumps(result.to_dict())


# --- the objective ------------------------------------------------------------------


def test_greedy_is_suboptimal_on_the_triangle_and_dp_is_not():
    greedy = GreedyStrategy().select(triangle())
    dp = DPStrategy().select(triangle())
    assert (greedy.objective, greedy.chosen_ids) == (10, ["big"])
    assert (dp.objective, dp.chosen_ids) == (12, ["left", "right"])
    assert dp.proven_optimal and not greedy.proven_optimal
    assert dp.reason_for("big") == "conflict with left"
    assert greedy.reason_for("left") == "conflict with big"


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_every_strategy_is_consistent_and_json_serialisable(strategy):
    candidates = stars(5) + sliding(12)
    result = strategy().select(candidates, op_count=100)
    assert_consistent(result, candidates)
    assert result.strategy == strategy.name
    assert set(result.to_dict()) == {
        "strategy", "objective", "seconds", "proven_optimal",
        "chosen", "rejected", "notes", "auto",
    }  # fmt: skip


def test_dp_interval_dp_is_used_with_positions_and_matches_without():
    candidates = sliding(30)
    positions = {n: n for n in range(40)}
    with_positions = DPStrategy().select(candidates, positions=positions)
    without = DPStrategy().select(candidates)
    assert with_positions.notes == ("components solved: 1 by interval DP",)
    assert without.notes == ("components solved: 1 by branch-and-bound",)
    assert with_positions.objective == without.objective == brute_force_chain(candidates)


def brute_force_chain(candidates: list[Candidate]) -> float:
    """Exact optimum of a sliding chain by a plain DP over candidate index (width 3)."""
    best = [0.0] * (len(candidates) + 3)
    for i in range(len(candidates) - 1, -1, -1):
        best[i] = max(best[i + 1], candidates[i].gain + best[i + 3])
    return best[0]


@pytest.mark.parametrize("seed", range(40))
def test_dp_matches_brute_force_on_random_interval_instances(seed):
    rng = np.random.default_rng(seed)
    candidates, positions = random_intervals(rng, int(rng.integers(2, 16)))
    optimum = brute_force(candidates)
    interval = DPStrategy().select(candidates, positions=positions)
    search = DPStrategy().select(candidates)
    assert interval.objective == search.objective == optimum
    assert "interval DP" in interval.notes[0] or "single" in interval.notes[0]
    assert "interval DP" not in search.notes[0]
    assert interval.proven_optimal and search.proven_optimal
    assert_consistent(interval, candidates)
    assert_consistent(search, candidates)


@pytest.mark.parametrize("seed", range(40))
def test_exact_solvers_agree_with_brute_force_on_random_sets(seed):
    rng = np.random.default_rng(1000 + seed)
    candidates = random_sets(rng, int(rng.integers(2, 16)))
    problem = Problem(candidates)
    optimum = brute_force(candidates)
    for members in problem.components:
        picked = solve_search(problem, members, budget=10**6)
        assert sum(problem.gains[i] for i in picked) == brute_force(
            [candidates[i] for i in members]
        )
        tree = solve_tree(problem, members)
        if tree is not None:
            assert sum(problem.gains[i] for i in tree) == sum(problem.gains[i] for i in picked)
    assert DPStrategy().select(candidates).objective == optimum


def test_interval_dp_refuses_non_contiguous_or_shared_positions():
    candidates = [cand("a", {1, 3}, 5), cand("b", {2}, 4)]
    problem = Problem(candidates)
    assert solve_interval(problem, [0, 1], {1: 0, 2: 1, 3: 2}) is None  # a skips position 1
    assert solve_interval(problem, [0, 1], {1: 0, 2: 0, 3: 1}) is None  # 1 and 2 share 0
    assert solve_interval(problem, [0, 1], {1: 0, 3: 1}) is None  # 2 has no position
    assert solve_interval(problem, [0, 1], {1: 0, 3: 1, 2: 2}) == [0, 1]


def test_dp_fallback_beyond_the_exact_bound_is_reported():
    candidates = sliding(60)
    result = DPStrategy(exact_limit=40).select(candidates)
    assert result.notes[1] == (
        "component of 60 candidates over the exact bound 40 (no interval or tree"
        " structure): greedy+1-swap, not proven optimal"
    )
    assert not result.proven_optimal
    assert result.objective >= GreedyStrategy().select(candidates).objective
    assert_consistent(result, candidates)


def test_dp_fallback_over_the_search_budget_is_reported():
    result = DPStrategy(search_budget=1).select(sliding(20))
    assert "over the search_budget 1: greedy+1-swap" in result.notes[1]


def test_local_search_swaps_a_hub_for_its_leaves():
    # A 4-cycle of hubs closes the component into a non-tree; exact_limit=1 forces fallback.
    candidates = stars(3) + [cand("ring", {0, 10, 20}, 1)]
    result = DPStrategy(exact_limit=1).select(candidates)
    assert "greedy+1-swap" in result.notes[1]
    assert result.objective == 36 == DPStrategy().select(candidates).objective


# --- genetic ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_genetic_reaches_the_optimum_on_small_sets(seed):
    rng = np.random.default_rng(2000 + seed)
    candidates = random_sets(rng, 12)
    result = GeneticStrategy(seed=seed, generations=60, polish=False).select(candidates)
    assert result.objective == brute_force(candidates)
    assert_consistent(result, candidates)


def test_genetic_beats_greedy_on_200_candidates():
    candidates = stars(50)
    greedy = GreedyStrategy().select(candidates)
    genetic = GeneticStrategy(seed=7, polish=False).select(candidates)
    assert greedy.objective == 500
    assert genetic.objective == 600 == DPStrategy().select(candidates).objective


def test_genetic_polish_improves_the_best_individual():
    # No generations and two individuals: the evolved best is greedy's 500; the polish
    # swaps every hub for its three leaves.
    candidates = stars(50)
    raw = GeneticStrategy(generations=0, population=2, elite=1, polish=False)
    polished = GeneticStrategy(generations=0, population=2, elite=1)
    assert raw.select(candidates).objective <= 550
    result = polished.select(candidates)
    assert result.objective == 600
    assert result.notes[1].startswith("1-swap polish of the best individual gained")


def test_genetic_is_deterministic_for_a_seed_and_never_worse_than_greedy():
    rng = np.random.default_rng(5)
    candidates = random_sets(rng, 150, universe=120)
    runs = [GeneticStrategy(seed=11, generations=20).select(candidates) for _ in range(2)]
    assert runs[0].chosen_ids == runs[1].chosen_ids
    assert runs[0].objective == runs[1].objective
    assert runs[0].objective >= GreedyStrategy().select(candidates).objective


def test_genetic_starts_from_greedy():
    # 40 copies of a 10 over two 4.5s: greedy takes every 10 (400, the optimum); the
    # randomised individuals take the two 4.5s somewhere, so only the greedy seed scores
    # 400 when nothing evolves.
    candidates = []
    for k in range(40):
        b = 2 * k
        candidates.append(cand(f"h{k}", {b, b + 1}, 10))
        candidates += [cand(f"a{k}", {b}, 4.5), cand(f"b{k}", {b + 1}, 4.5)]
    strategy = GeneticStrategy(generations=0, population=2, elite=1, polish=False)
    assert strategy.select(candidates).objective == 400


# --- filters, ties and gains --------------------------------------------------------


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_cost_threshold_and_memory_limit_remove_exactly_their_candidates(strategy):
    candidates = [
        cand("slow", {1}, 3, speedup=1.05),
        cand("at_threshold", {2}, 3, speedup=1.1),
        cand("no_ratio", {3}, 3),
        cand("too_big", {4}, 3, working_set=1001, speedup=2.0),
        cand("fits", {5}, 3, working_set=1000),
        cand("both", {6}, 3, working_set=5000, speedup=0.5),
    ]
    result = strategy(cost_threshold=1.1, memory_limit=1000).select(candidates, op_count=10)
    assert result.chosen_ids == ["at_threshold", "no_ratio", "fits"]
    assert {r.candidate.id: r.reason for r in result.rejected} == {
        "slow": "predicted speedup 1.05 below cost_threshold 1.1",
        "too_big": "working set 1001 bytes over memory_limit 1000",
        "both": "working set 5000 bytes over memory_limit 1000",
    }
    assert result.objective == 9


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_zero_and_negative_gains_are_rejected(strategy):
    candidates = [cand("zero", {1}, 0), cand("neg", {2}, -1.5), cand("pos", {1, 2}, 0.25)]
    result = strategy().select(candidates, op_count=10)
    assert result.chosen_ids == ["pos"]
    assert result.reason_for("zero") == result.reason_for("neg") == "gain <= 0"
    assert result.objective == 0.25
    empty = strategy().select([cand("neg", {2}, -1)], op_count=10)
    assert (empty.chosen_ids, empty.objective) == ([], 0)


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.name)
def test_no_candidates(strategy):
    result = strategy().select([], op_count=0)
    assert (result.chosen, result.rejected, result.objective) == ((), (), 0)


def test_ties_are_broken_by_candidate_order():
    a, b = cand("a", {1}, 5), cand("b", {1, 2}, 5)
    assert GreedyStrategy().select([a, b]).chosen_ids == ["a"]
    assert GreedyStrategy().select([b, a]).chosen_ids == ["b"]
    assert GreedyStrategy().select([b, a]).reason_for("a") == "conflict with b"


def test_conflict_reason_names_the_best_chosen_blocker():
    candidates = [cand("x", {1}, 3), cand("y", {2}, 4), cand("spans", {1, 2}, 5)]
    result = DPStrategy().select(candidates)
    assert result.chosen_ids == ["x", "y"]
    assert result.reason_for("spans") == "conflict with y"


def test_invalid_input_and_knobs():
    with pytest.raises(ValueError, match="duplicate candidate id"):
        GreedyStrategy().select([cand("a", {1}, 1), cand("a", {2}, 1)])
    with pytest.raises(ValueError, match="replaces no node"):
        cand("a", set(), 1)
    with pytest.raises(ValueError, match="non-finite"):
        cand("a", {1}, float("nan"))
    with pytest.raises(ConfigError, match="cost_threshold"):
        GreedyStrategy(cost_threshold=0)
    with pytest.raises(ConfigError, match="memory_limit"):
        DPStrategy(memory_limit=-1)
    with pytest.raises(ConfigError, match="population"):
        GeneticStrategy(population=1)
    with pytest.raises(ConfigError, match="unknown strategy"):
        strategy_by_name("simulated_annealing")
    assert isinstance(strategy_by_name("dp", exact_limit=10), DPStrategy)


def test_a_solver_returning_overlapping_candidates_is_caught():
    class Broken(GreedyStrategy):
        def solve(self, problem):
            return Solution(range(len(problem)))

    with pytest.raises(RuntimeError, match="overlapping"):
        Broken().select(triangle())


# --- auto ---------------------------------------------------------------------------


def test_auto_picks_greedy_without_overlap():
    candidates = [cand(i, {i}, 1) for i in range(20)]
    result = AutoStrategy().select(candidates, op_count=50_000)
    assert result.auto.strategy == "greedy"
    assert result.auto.reason == "no two candidates overlap, so greedy is optimal"
    assert result.proven_optimal


def test_auto_picks_greedy_for_a_small_model_with_little_overlap():
    candidates = [cand(i, {i}, 1) for i in range(100)] + [cand("dup", {0}, 2)]
    result = AutoStrategy().select(candidates, op_count=500)
    assert result.auto.strategy == "greedy"
    assert result.auto.reason.startswith("simple model: 500 ops < 1000")
    assert AutoStrategy().select(candidates, op_count=5000).auto.strategy == "dp"


def test_auto_picks_dp_when_fusions_compete_within_the_exact_bound():
    result = AutoStrategy().select(stars(5), op_count=800)
    assert result.auto.strategy == "dp"
    assert result.auto.competing_components == 5 and result.auto.largest_component == 4
    assert result.objective == 60


def test_auto_picks_genetic_for_a_very_large_graph_beyond_exact_reach():
    candidates = sliding(60)
    result = AutoStrategy().select(candidates, op_count=20_000)
    assert result.auto.strategy == "genetic"
    assert "20000 ops > 10000" in result.auto.reason
    # The same candidates with positions form intervals: exact and fast, so dp.
    positions = {n: n for n in range(70)}
    assert AutoStrategy().select(
        candidates, positions=positions, op_count=20_000
    ).auto.strategy == ("dp")
    # A mid-size graph keeps dp, which reports its fallback.
    mid = AutoStrategy().select(candidates, op_count=5_000)
    assert mid.auto.strategy == "dp" and "greedy+1-swap" in mid.notes[1]


def test_auto_counts_nodes_when_op_count_is_missing():
    result = AutoStrategy().select(triangle())
    assert result.auto.op_count == 2
    assert result.auto.reason.endswith(
        "(op_count not given: counted the nodes the candidates cover)"
    )
    assert result.to_dict()["auto"]["strategy"] == "dp"


def test_priority_takes_the_same_candidates_and_says_why_not() -> None:
    """The priority strategy on the strategies' interface: Candidate in, Selection out,
    ranked by priority, then graph order; a smaller form of a blocked fusion waits."""
    from autofusion.fusion_core.strategies import Candidate, PriorityStrategy

    big = Candidate("qkv", {1, 2, 3}, gain=0.1, priority=5)
    scale = Candidate("scale", {1, 9}, gain=0.1, priority=9)  # takes node 1 first
    kv = Candidate("kv", {2, 3}, gain=0.3, priority=4)  # inside the blocked qkv: waits
    other = Candidate("other", {7}, gain=-1.0, priority=0)  # no filter of its own
    selection = PriorityStrategy().select([big, kv, other, scale])
    assert selection.strategy == "priority"
    assert selection.chosen_ids == ["scale", "other"]  # in priority order
    why = {r.candidate.id: (r.kind, r.conflict_with) for r in selection.rejected}
    assert why == {"qkv": ("conflict", "scale"), "kv": ("waits", None)}
    assert selection.objective == pytest.approx(0.1 - 1.0)
