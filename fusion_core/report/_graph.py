"""Pictures of a fused region: the nodes plus their direct neighbours, as inline SVG.

A small layered layout (no Graphviz): each node goes one layer below the deepest of
its drawn producers; within a layer nodes are ordered by the mean position of their
producers, which keeps most edges short and uncrossed for the few nodes drawn here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

import onnx

__all__ = ["GraphIndex", "region_svg"]

_W, _H, _DX, _DY, _PAD = 150, 38, 20, 34, 10
_MAX_NEIGHBOURS = 16


@dataclass(frozen=True)
class _Node:
    key: int
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class GraphIndex:
    """The main graph's nodes by name, with producers and consumers by value name."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._index(
            (
                n.name,
                f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type,
                n.input,
                n.output,
            )
            for n in model.graph.node
        )

    @classmethod
    def from_nodes(cls, nodes: Iterable[tuple[str, str, Iterable[str], Iterable[str]]]):
        """An index of (name, op, inputs, outputs) nodes, no model needed."""
        index = cls.__new__(cls)
        index._index(nodes)
        return index

    def _index(self, nodes: Iterable[tuple[str, str, Iterable[str], Iterable[str]]]) -> None:
        self.nodes = [
            _Node(i, name, op, tuple(x for x in ins if x), tuple(x for x in outs if x))
            for i, (name, op, ins, outs) in enumerate(nodes)
        ]
        self.by_name = {n.name: n for n in self.nodes if n.name}
        self.producer = {v: n for n in self.nodes for v in n.outputs}
        self.consumers: dict[str, list[_Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                self.consumers.setdefault(v, []).append(n)

    def neighbourhood(self, names: Iterable[str]) -> tuple[list[_Node], set[int]]:
        """The named nodes (the region) and their direct neighbours, in graph order."""
        region = {self.by_name[n].key: self.by_name[n] for n in names if n in self.by_name}
        around: dict[int, _Node] = {}
        for node in region.values():
            near = [self.producer[v] for v in node.inputs if v in self.producer]
            near += [c for v in node.outputs for c in self.consumers.get(v, [])]
            for other in near:
                if other.key not in region and len(around) < _MAX_NEIGHBOURS:
                    around[other.key] = other
        drawn = sorted({**region, **around}.values(), key=lambda n: n.key)
        return drawn, set(region)


def region_svg(index: GraphIndex, names: Iterable[str], title: str) -> str | None:
    """The region ``names`` of ``index``'s graph as an SVG, or None when none is found."""
    nodes, region = index.neighbourhood(names)
    if not region:
        return None
    edges = _edges(nodes)
    position = _layout(nodes, edges)
    columns = max(x for x, _ in position.values()) + 1
    rows = max(y for _, y in position.values()) + 1
    width = 2 * _PAD + columns * (_W + _DX) - _DX
    height = 2 * _PAD + rows * (_H + _DY) - _DY
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="region" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img">',
        f"<title>{escape(title)}</title>",
    ]
    for src, dst, value in edges:
        parts.append(_edge(position[src], position[dst], value))
    for node in nodes:
        parts.append(_box(node, position[node.key], node.key in region))
    parts.append("</svg>")
    return "".join(parts)


def _edges(nodes: list[_Node]) -> list[tuple[int, int, str]]:
    made = {v: n.key for n in nodes for v in n.outputs}
    return [(made[v], n.key, v) for n in nodes for v in n.inputs if v in made and made[v] != n.key]


def _layout(nodes: list[_Node], edges: list[tuple[int, int, str]]) -> dict[int, tuple[int, int]]:
    """Layer by longest path from the sources (nodes are in graph = topological order)."""
    preds: dict[int, list[int]] = {n.key: [] for n in nodes}
    for src, dst, _ in edges:
        preds[dst].append(src)
    layer: dict[int, int] = {}
    for node in nodes:
        layer[node.key] = 1 + max((layer[p] for p in preds[node.key] if p in layer), default=-1)
    column: dict[int, float] = {}
    position: dict[int, tuple[int, int]] = {}
    for depth in range(max(layer.values()) + 1):
        members = [n.key for n in nodes if layer[n.key] == depth]
        members.sort(key=lambda k: _mean([column[p] for p in preds[k] if p in column], k))
        for x, key in enumerate(members):
            column[key] = x
            position[key] = (x, depth)
    return position


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _centre(cell: tuple[int, int]) -> tuple[float, float]:
    x, y = cell
    return _PAD + x * (_W + _DX) + _W / 2, _PAD + y * (_H + _DY)


def _edge(src: tuple[int, int], dst: tuple[int, int], value: str) -> str:
    (x1, y1), (x2, y2) = _centre(src), _centre(dst)
    y1 += _H
    mid = (y1 + y2) / 2
    return (
        f'<path d="M{x1:.0f},{y1:.0f} C{x1:.0f},{mid:.0f} {x2:.0f},{mid:.0f} {x2:.0f},{y2:.0f}" '
        f'class="edge"><title>{escape(value)}</title></path>'
    )


def _box(node: _Node, cell: tuple[int, int], in_region: bool) -> str:
    cx, top = _centre(cell)
    name = node.name or "(unnamed)"
    return (
        f'<g class="{"fused" if in_region else "near"}"><title>{escape(name)}</title>'
        f'<rect x="{cx - _W / 2:.0f}" y="{top:.0f}" width="{_W}" height="{_H}" rx="5"/>'
        f'<text x="{cx:.0f}" y="{top + 15:.0f}" text-anchor="middle" class="op">'
        f"{escape(_short(node.op, 22))}</text>"
        f'<text x="{cx:.0f}" y="{top + 30:.0f}" text-anchor="middle" class="name">'
        f"{escape(_short(name, 24))}</text></g>"
    )


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
