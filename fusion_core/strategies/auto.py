"""Choose the strategy from the graph size and how much the candidates overlap.

The decision, first rule that applies (``op_count`` is the graph's op count):

=====================================================  ===========  ======================
situation                                              strategy     why
=====================================================  ===========  ======================
no two candidates overlap                              ``greedy``   greedy is optimal
``op_count < small_ops`` and at most ``low_overlap``   ``greedy``   simple model; little
of the candidates in competing components                           to gain, fastest
every competing component solvable exactly             ``dp``       exact (interval DP,
(interval or tree structure, or within                              tree DP or branch and
``exact_limit`` candidates)                                         bound)
``op_count > large_ops``                               ``genetic``  very large graph with
                                                                    components beyond
                                                                    exact reach
otherwise                                              ``dp``       exact where it can be,
                                                                    greedy+1-swap beyond
=====================================================  ===========  ======================

Competing components are conflict components with more than one candidate: there,
several fusion paths compete for the same nodes.
"""

from __future__ import annotations

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.strategies._candidates import AutoChoice, Solution
from autofusion.fusion_core.strategies._conflicts import Problem
from autofusion.fusion_core.strategies._strategy import SelectionStrategy
from autofusion.fusion_core.strategies.dp import DPStrategy
from autofusion.fusion_core.strategies.genetic import GeneticStrategy
from autofusion.fusion_core.strategies.greedy import GreedyStrategy

__all__ = ["STRATEGIES", "AutoStrategy", "strategy_by_name"]


class AutoStrategy(SelectionStrategy):
    """Runs greedy, dp or genetic following the matrix above; the result says which."""

    name = "auto"

    def __init__(
        self,
        *,
        small_ops: int = 1_000,
        large_ops: int = 10_000,
        low_overlap: float = 0.1,
        exact_limit: int = 40,
        seed: int = 0,
        cost_threshold: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        super().__init__(cost_threshold=cost_threshold, memory_limit=memory_limit)
        if not 0 <= small_ops <= large_ops or not 0.0 <= low_overlap <= 1.0:
            raise ConfigError("auto needs 0 <= small_ops <= large_ops and 0 <= low_overlap <= 1")
        self.small_ops, self.large_ops, self.low_overlap = small_ops, large_ops, low_overlap
        self.greedy = GreedyStrategy()
        self.dp = DPStrategy(exact_limit=exact_limit)
        self.genetic = GeneticStrategy(seed=seed)

    def solve(self, problem: Problem) -> Solution:
        op_count, counted = _op_count(problem)
        name, reason = self._decide(problem, op_count)
        competing = problem.competing
        choice = AutoChoice(
            strategy=name,
            reason=reason + counted,
            op_count=op_count,
            candidates=len(problem),
            competing_components=len(competing),
            largest_component=max((len(c) for c in competing), default=min(len(problem), 1)),
        )
        inner = getattr(self, name).solve(problem)
        return Solution(inner.chosen, exact=inner.exact, notes=inner.notes, auto=choice)

    def _decide(self, problem: Problem, op_count: int) -> tuple[str, str]:
        competing = problem.competing
        if not competing:
            return "greedy", "no two candidates overlap, so greedy is optimal"
        in_competition = sum(len(c) for c in competing)
        share = in_competition / len(problem)
        if op_count < self.small_ops and share <= self.low_overlap:
            return "greedy", (
                f"simple model: {op_count} ops < {self.small_ops} and only"
                f" {in_competition} of {len(problem)} candidates ({share:.0%}) overlap"
            )
        largest = max(len(c) for c in competing)
        beyond = [c for c in competing if self.dp.structure(problem, c) is None]
        if not beyond:
            return "dp", (
                f"{len(competing)} components where fusions compete (largest {largest}"
                " candidates), all solvable exactly"
            )
        biggest = max(len(c) for c in beyond)
        if op_count > self.large_ops:
            return "genetic", (
                f"very large graph: {op_count} ops > {self.large_ops}, and {len(beyond)}"
                f" components (largest {biggest} candidates) are beyond exact reach"
            )
        return "dp", (
            f"{op_count} ops <= {self.large_ops}: dp solves exactly where it can;"
            f" {len(beyond)} components (largest {biggest}) get greedy+1-swap"
        )


def _op_count(problem: Problem) -> tuple[int, str]:
    if problem.op_count is not None:
        return problem.op_count, ""
    if problem.positions is not None:
        return len(problem.positions), " (op_count not given: counted the positions)"
    nodes = len(set().union(*(c.node_ids for c in problem.candidates)))
    return nodes, " (op_count not given: counted the nodes the candidates cover)"


STRATEGIES: dict[str, type[SelectionStrategy]] = {
    "greedy": GreedyStrategy,
    "dp": DPStrategy,
    "genetic": GeneticStrategy,
    "auto": AutoStrategy,
}


def strategy_by_name(name: str, **knobs: object) -> SelectionStrategy:
    """Build a strategy from its name and keyword knobs (a config's ``strategy``)."""
    try:
        factory = STRATEGIES[name]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise ConfigError(f"unknown strategy {name!r}", hint=f"one of {known}") from None
    try:
        return factory(**knobs)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"bad knobs for strategy {name!r}: {exc}") from None
