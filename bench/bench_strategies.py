"""The cost-based strategies side by side on synthetic conflict sets shaped like graphs.

A chain of N nodes in topological order (1k, 10k, 100k); each node is the head of 1-3
candidates covering 1-4 consecutive nodes, with random gains (seconds saved, about
proportional to the length, with noise). Neighbouring candidates overlap, as the
overlapping Conv/BN/Relu/Add fusions of a ResNet do. ``dp`` gets the positions, so it
solves each component exactly by interval DP.

For each size it times greedy, dp, dp without positions (no interval DP: branch and
bound up to 40 candidates per component, greedy+1-swap beyond), genetic (default knobs)
and auto (median of ``--repeat`` runs, all in one process) and prints a Markdown table
with the objective of each strategy relative to dp's, the exact optimum.

    python bench/bench_strategies.py [--sizes 1000 10000 100000] [--repeat 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from autofusion.fusion_core.strategies import Candidate, Selection, SelectionStrategy
from autofusion.fusion_core.strategies.auto import AutoStrategy
from autofusion.fusion_core.strategies.dp import DPStrategy
from autofusion.fusion_core.strategies.genetic import GeneticStrategy
from autofusion.fusion_core.strategies.greedy import GreedyStrategy


def chain_candidates(nodes: int, seed: int) -> list[Candidate]:
    rng = np.random.default_rng(seed)
    heads = rng.integers(1, 4, size=nodes)
    out: list[Candidate] = []
    for head in range(nodes):
        for _ in range(int(heads[head])):
            length = int(min(rng.integers(1, 5), nodes - head))
            gain = float(length * rng.uniform(0.5, 1.5) * 1e-5)
            out.append(Candidate(len(out), frozenset(range(head, head + length)), gain))
    return out


def timed(
    strategy: SelectionStrategy,
    candidates: list[Candidate],
    nodes: int,
    repeat: int,
    *,
    with_positions: bool = True,
) -> tuple[float, Selection]:
    positions = {n: n for n in range(nodes)} if with_positions else None
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = strategy.select(candidates, positions=positions, op_count=nodes)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    strategies = [
        ("greedy", GreedyStrategy(), True),
        ("dp", DPStrategy(), True),
        ("dp, no positions", DPStrategy(), False),
        ("genetic", GeneticStrategy(seed=args.seed), True),
        ("auto", AutoStrategy(seed=args.seed), True),
    ]
    print("| nodes | candidates | strategy | median time (s) | objective / dp | auto ran |")
    print("|---:|---:|---|---:|---:|---|")
    for nodes in args.sizes:
        candidates = chain_candidates(nodes, args.seed)
        rows = [
            (label, *timed(s, candidates, nodes, args.repeat, with_positions=pos))
            for label, s, pos in strategies
        ]
        exact = next(r.objective for label, _, r in rows if label == "dp")
        for name, seconds, result in rows:
            ran = result.auto.strategy if result.auto else ""
            print(
                f"| {nodes} | {len(candidates)} | {name} | {seconds:.3f}"
                f" | {result.objective / exact:.4f} | {ran} |"
            )


if __name__ == "__main__":
    main()
