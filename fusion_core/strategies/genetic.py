"""Genetic selection: evolve a population of feasible candidate subsets.

Only candidates in competing components (more than one candidate) are genes; the others
are always chosen. An individual is one bit per gene, evaluated for the whole
population at once with numpy. Each generation:

- *elitism*: the ``elite`` best individuals pass unchanged;
- *selection*: binary tournaments pick the parents;
- *crossover*: uniform over gene blocks, a block being a conflict component (components
  are independent, so good components combine), with components over ``block_size``
  genes cut into runs of consecutive candidates;
- *mutation*: each bit flips with probability ``mutation_rate`` (default
  ``min(0.1, 4 / genes)``, about four flips per child);
- *repair*: where two chosen genes conflict, the lower-priority one is dropped; a gene
  just switched on by mutation outranks the rest, otherwise the higher gain wins (so a
  mutation can swap a 10 for the two 6s it blocks);
- *fill*: genes that no chosen gene blocks are added, highest gain first, so every
  individual is a maximal feasible set.

The population starts from greedy's solution and perturbations of it (half of its
genes dropped, the rest refilled in a random order), so with elitism the result is never
worse than greedy. With ``polish`` (default)
the best individual is then improved by the 1-swap local search of dp's fallback, one
competing component at a time. Deterministic for a given ``seed``.
"""

from __future__ import annotations

import numpy as np

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.strategies._candidates import Solution
from autofusion.fusion_core.strategies._conflicts import Problem
from autofusion.fusion_core.strategies._genes import Genes
from autofusion.fusion_core.strategies._local_search import improve_by_swaps
from autofusion.fusion_core.strategies._strategy import SelectionStrategy
from autofusion.fusion_core.strategies.greedy import greedy_indices

__all__ = ["GeneticStrategy"]


class GeneticStrategy(SelectionStrategy):
    """Seeded, deterministic evolutionary search; never worse than greedy."""

    name = "genetic"

    def __init__(
        self,
        *,
        generations: int = 100,
        population: int = 32,
        mutation_rate: float | None = None,
        elite: int = 2,
        block_size: int = 64,
        polish: bool = True,
        seed: int = 0,
        cost_threshold: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        super().__init__(cost_threshold=cost_threshold, memory_limit=memory_limit)
        if generations < 0 or population < 2 or not 1 <= elite < population:
            raise ConfigError(
                "genetic needs generations >= 0, population >= 2 and 1 <= elite < population"
            )
        if not (mutation_rate is None or 0.0 <= mutation_rate <= 1.0) or block_size < 1:
            raise ConfigError("genetic needs 0 <= mutation_rate <= 1 and block_size >= 1")
        self.generations, self.population = generations, population
        self.mutation_rate, self.elite = mutation_rate, elite
        self.block_size, self.polish, self.seed = block_size, polish, seed

    def solve(self, problem: Problem) -> Solution:
        singles = [comp[0] for comp in problem.components if len(comp) == 1]
        if not problem.competing:
            return Solution(singles, exact=True)
        genes = Genes(problem, self.block_size)
        rng = np.random.default_rng(self.seed)
        pop = self._initial(problem, genes, rng)
        for _ in range(self.generations):
            pop = self._generation(genes, pop, rng)
        best = pop[int(np.argmax(pop @ genes.weights))]
        evolved = [genes.members[k] for k in np.flatnonzero(best)]
        notes = [
            f"{len(genes)} competing candidates in {len(problem.competing)} components;"
            f" {self.generations} generations of {self.population}, seed {self.seed}"
        ]
        if self.polish:
            polished = _polish(problem, evolved)
            gained = sum(problem.gains[i] for i in polished) - sum(
                problem.gains[i] for i in evolved
            )
            notes.append(f"1-swap polish of the best individual gained {gained:.6g}")
            evolved = polished
        return Solution(singles + evolved, notes=tuple(notes))

    def _initial(self, problem: Problem, genes: Genes, rng: np.random.Generator) -> np.ndarray:
        """Greedy's solution, then greedy's with each chosen gene kept with probability
        1/2 and refilled by randomised greedy (gains times log-normal noise; every
        fourth individual by uniformly random priorities, for diversity)."""
        shape = (self.population, len(genes))
        local = {g: k for k, g in enumerate(genes.members)}
        greedy = np.zeros(len(genes), dtype=bool)
        greedy[[local[g] for g in greedy_indices(problem) if g in local]] = True
        pop = greedy & (rng.random(shape) < 0.5)
        noisy = genes.weights * rng.lognormal(0.0, 0.5, size=shape)
        noisy[::4] = rng.random(shape)[::4]
        genes.fill(pop, noisy)
        pop[0] = greedy
        return pop

    def _rate(self, genes: int) -> float:
        # By default about four flips per child: local moves that elitism can keep and
        # crossover can combine; many more flips per child mostly destroy.
        return min(0.1, 4 / genes) if self.mutation_rate is None else self.mutation_rate

    def _generation(self, genes: Genes, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        fitness = pop @ genes.weights
        order = np.argsort(-fitness, kind="stable")
        count = self.population - self.elite
        fighters = rng.integers(0, self.population, size=(2, count, 2))
        first = fitness[fighters[..., 0]] >= fitness[fighters[..., 1]]
        parents = np.where(first, fighters[..., 0], fighters[..., 1])
        take_a = (rng.random((count, genes.blocks)) < 0.5)[:, genes.block]
        children = np.where(take_a, pop[parents[0]], pop[parents[1]])
        flips = rng.random(children.shape) < self._rate(len(genes.members))
        fresh = flips & ~children
        children ^= flips
        genes.repair(children, genes.priority + fresh)
        genes.fill(children)
        return np.concatenate([pop[order[: self.elite]], children])


def _polish(problem: Problem, chosen: list[int]) -> list[int]:
    picked = set(chosen)
    out: list[int] = []
    for members in problem.competing:
        start = [i for i in members if i in picked]
        out += improve_by_swaps(problem, members, start)
    return out
