"""The genes of the genetic strategy: competing candidates as local indices, their
conflict graph in CSR form, crossover blocks, and the vectorised repair and fill that
keep every individual of a population (a boolean matrix, one row each) feasible."""

from __future__ import annotations

import numpy as np

from autofusion.fusion_core.strategies._conflicts import Problem

__all__ = ["Genes"]


class Genes:
    def __init__(self, problem: Problem, block_size: int) -> None:
        self.members = [g for comp in problem.competing for g in comp]
        self.weights = np.array([problem.gains[g] for g in self.members], dtype=np.float64)
        n = len(self.members)
        rank = np.array([problem.rank_position[g] for g in self.members], dtype=np.float64)
        self.priority = 1.0 - rank / max(len(problem), 1)  # in (0, 1], higher gain higher
        edges = problem.edges(self.members)
        self.u, self.v = edges[:, 0], edges[:, 1]
        src = np.concatenate([self.u, self.v])
        dst = np.concatenate([self.v, self.u])
        order = np.argsort(src, kind="stable")
        self.nbr = dst[order]
        self.indptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
        self.block = np.empty(n, dtype=np.int64)
        start = count = 0
        for comp in problem.competing:
            for offset in range(0, len(comp), block_size):
                size = min(block_size, len(comp) - offset)
                self.block[start : start + size] = count
                start += size
                count += 1
        self.blocks = count

    def __len__(self) -> int:
        return len(self.members)

    def repair(self, pop: np.ndarray, priority: np.ndarray) -> None:
        """Drop every chosen gene that has a chosen neighbour of higher priority."""
        rows, e = np.nonzero(pop[:, self.u] & pop[:, self.v])
        if rows.size:
            u, v = self.u[e], self.v[e]
            u_wins = priority[rows, u] > priority[rows, v]
            pop[rows, np.where(u_wins, v, u)] = False

    def fill(self, pop: np.ndarray, priority: np.ndarray | None = None) -> None:
        """Add unblocked genes, highest priority first (ties: lower index), until every
        row is maximal. ``priority``: per gene or per (row, gene); default by gain."""
        priority = self.priority if priority is None else priority
        # Every gene has a neighbour, so no reduceat segment is empty.
        blocked = np.logical_or.reduceat(pop[:, self.nbr], self.indptr[:-1], axis=1)
        rows, genes = np.nonzero(~pop & ~blocked)
        free = np.zeros_like(pop)
        while rows.size:
            seg, nb = self._neighbours(genes)
            r = rows[seg]
            taken = np.bincount(seg, weights=pop[r, nb], minlength=rows.size) > 0
            free[rows, genes] = ~taken
            mine, theirs = self._priorities(priority, r, genes[seg], nb)
            rival = free[r, nb] & ((theirs > mine) | ((theirs == mine) & (nb < genes[seg])))
            beaten = np.bincount(seg, weights=rival, minlength=rows.size) > 0
            win = ~taken & ~beaten
            pop[rows[win], genes[win]] = True
            free[rows, genes] = False
            rows, genes = rows[beaten & ~taken], genes[beaten & ~taken]

    def _neighbours(self, genes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each gene's neighbours: the gene's position in ``genes``, the neighbour."""
        starts = self.indptr[genes]
        degree = self.indptr[genes + 1] - starts
        seg = np.repeat(np.arange(genes.size), degree)
        offsets = np.arange(seg.size) - np.repeat(np.cumsum(degree) - degree, degree)
        return seg, self.nbr[np.repeat(starts, degree) + offsets]

    @staticmethod
    def _priorities(priority: np.ndarray, rows, genes, neighbours):
        if priority.ndim == 2:
            return priority[rows, genes], priority[rows, neighbours]
        return priority[genes], priority[neighbours]
