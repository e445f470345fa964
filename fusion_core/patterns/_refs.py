"""References from a pattern to the values of a match: ``bn.in1``, ``conv.out0``, ``$x``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["ValueRef", "parse_edge", "parse_ref"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_REF_RE = re.compile(rf"^(?P<node>{_IDENT})\.(?P<kind>in|out)(?P<index>\d+)$")
_FREE_RE = re.compile(rf"^\$(?P<name>{_IDENT})$")
_EDGE_RE = re.compile(rf"^(?P<node>{_IDENT})(?:\.out(?P<index>\d+))?$")


@dataclass(frozen=True)
class ValueRef:
    """A parsed reference: an input or output of a pattern node, or a free input."""

    node: str | None  # None for a free input
    kind: str  # "in", "out" or "free"
    index: int = 0
    name: str = ""  # the free input's name

    def __str__(self) -> str:
        return f"${self.name}" if self.kind == "free" else f"{self.node}.{self.kind}{self.index}"


@lru_cache(maxsize=4096)
def parse_ref(text: str) -> ValueRef:
    """Parse ``node.inK``, ``node.outK`` or ``$name``; raise ValueError on anything else."""
    if m := _REF_RE.match(text):
        return ValueRef(node=m["node"], kind=m["kind"], index=int(m["index"]))
    if m := _FREE_RE.match(text):
        return ValueRef(node=None, kind="free", name=m["name"])
    raise ValueError(f"{text!r} is not a value reference: write node.in<k>, node.out<k> or $name")


@lru_cache(maxsize=4096)
def parse_edge(text: str) -> ValueRef:
    """Parse the source of a node input: ``node`` (its output 0), ``node.outK`` or ``$name``."""
    if m := _EDGE_RE.match(text):
        return ValueRef(node=m["node"], kind="out", index=int(m["index"] or 0))
    if m := _FREE_RE.match(text):
        return ValueRef(node=None, kind="free", name=m["name"])
    raise ValueError(f"{text!r} is not an input source: write node, node.out<k> or $name")
