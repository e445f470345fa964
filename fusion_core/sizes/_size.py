"""Sizes as sums: ``Size`` (atoms and a number, or capped), a graph input's declared
dimension as one, and the arithmetic on them that entries of shape computations need."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import onnx_ir as ir

__all__ = [
    "ONE",
    "Size",
    "arithmetic",
    "broadcast",
    "declared",
    "is_own",
    "multiple",
    "own",
    "scaled",
]

_MAX_ATOMS = 256  # k * batch is batch written k times: small multiples only
_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9.]*|\d+)\s*$")


@dataclass(frozen=True)
class Size:
    """A size: the sum of ``atoms`` (sorted; symbols) and ``constant``."""

    atoms: tuple[str, ...] = ()
    constant: int = 0
    # min(this, some number): a Slice of a constant cut at this size; only a broadcast
    # with this very size proves it (a run where it is smaller fails to broadcast)
    capped: bool = False

    def __add__(self, other: Size) -> Size:
        return Size(tuple(sorted(self.atoms + other.atoms)), self.constant + other.constant)

    @property
    def value(self) -> int | None:
        """The size as a number, where it is one."""
        return None if self.atoms or self.capped else self.constant


ONE = Size((), 1)
_OWN = "@"  # the first character of an atom that is an inner value's own size


def own(value: ir.Value, axis: int) -> Size:
    """The size of ``value`` on ``axis`` where no rule ties it to other sizes (a Pad by
    computed amounts, a Reshape's -1 over sizes that do not cancel): an atom of its own,
    so the sizes read from that value's shape, and those of the values that keep that
    axis, are proven equal to it, and to nothing else. Named by the value's identity:
    compared within one walk of one graph."""
    return Size((f"{_OWN}{value.name or ''}#{id(value):x}[{axis}]",), 0)


def is_own(size: Size) -> bool:
    """Whether ``size`` holds an inner value's own size (``own``)."""
    return any(atom.startswith(_OWN) for atom in size.atoms)


def declared(dim: int | ir.SymbolicDim, where: str) -> Size:
    """A graph input's declared dimension: a number, a symbol, a sum of symbols and
    numbers (``past_sequence_length + sequence_length``); ``where`` names an unnamed one."""
    if isinstance(dim, int):
        return Size((), dim)
    text = dim.value
    if not text:
        return Size((f"#{where}",), 0)
    size = Size()
    for term in text.split("+"):
        match = _TERM.match(term)
        if match is None:
            return Size((text.strip(),), 0)  # another expression: one atom, compared as text
        word = match.group(1)
        size = size + (Size((), int(word)) if word.isdigit() else Size((word,), 0))
    return size


def broadcast(sizes: list[Size | None]) -> Size | None:
    """The broadcast of sizes: the one size other than 1, where all others are 1 or that
    size capped (equal to it, or 1, wherever the broadcast runs)."""
    if any(s is None for s in sizes):
        return None
    others = {s for s in sizes if s != ONE and not s.capped}  # type: ignore[union-attr]
    caps = {Size(s.atoms, s.constant) for s in sizes if s.capped}  # type: ignore[union-attr]
    if not others:
        capped = [s for s in sizes if s.capped]  # type: ignore[union-attr]
        return ONE if not caps else (capped[0] if len(caps) == 1 else None)
    if len(others) != 1 or not caps <= others:
        return None
    return others.pop()


def scaled(size: Size, times: int, over: int) -> Size | None:
    """``size * times / over`` where every atom's count and the constant divide (``4 *
    batch`` over 4 is ``batch``); None otherwise or when too many atoms."""
    counts = Counter(size.atoms)
    if over <= 0 or times <= 0 or sum(counts.values()) * times > _MAX_ATOMS * over:
        return None
    if size.capped or any(c * times % over for c in counts.values()):
        return None
    if size.constant * times % over:
        return None
    atoms = tuple(sorted(a for a, c in counts.items() for _ in range(c * times // over)))
    return Size(atoms, size.constant * times // over)


def multiple(size: Size, of: Size) -> int | None:
    """The whole ``k >= 1`` with ``size == k * of`` as sums (``8 * batch`` of ``batch``
    is 8), for symbolic ``of``; None where there is none or either is capped."""
    if of.value is not None or size.capped or of.capped or size.value is not None:
        return None
    counts = Counter(of.atoms)
    atom = next(iter(counts))
    times = Counter(size.atoms)[atom] // counts[atom]
    return times if times >= 1 and scaled(of, times, 1) == size else None


def arithmetic(op: str, x: Size | None, y: Size | None) -> Size | None:
    if x is None or y is None:
        return None
    if y.capped or (x.capped and (op != "Sub" or y.value != 0)):
        return None  # a Range's length from 0 keeps a cap; other arithmetic on one proves none
    if op == "Sub":
        rest = Counter(x.atoms)
        rest.subtract(y.atoms)
        if any(c < 0 for c in rest.values()):
            return None
        return Size(tuple(sorted(rest.elements())), x.constant - y.constant, capped=x.capped)
    if op == "Mul" and x.value is not None:
        x, y = y, x
    if y.value is None or y.value < 0:
        return None
    if op == "Mul":
        return Size((), x.constant * y.value) if x.value is not None else scaled(x, y.value, 1)
    if x.value is not None and y.value > 0 and x.value >= 0:
        return Size((), x.value // y.value)
    return scaled(x, 1, y.value)
