"""Pictures of a fused region: the nodes plus their direct neighbours, as inline SVG.

A small layered layout (no Graphviz): each node goes one layer below the deepest of
its drawn producers; within a layer nodes are ordered by the mean position of their
producers, which keeps most edges short and uncrossed for the few nodes drawn here.

Each box shows the op type, the node's name and its key attributes (``k=3×3 s=1 p=1``);
each edge between two drawn nodes is labelled with its tensor's shape where the model
knows it (graph inputs and outputs, ``value_info``, initializers). The tooltips carry
the full attribute values and the shapes of every input and output, weights included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # onnx loads where a model is drawn, not where data is (the dashboard)
    import onnx

__all__ = ["GraphIndex", "key_attributes", "region_svg", "value_shapes"]

_W, _DX, _DY, _PAD = 150, 20, 34, 10
_H_PLAIN, _H_ATTRS = 38, 50  # a box without and with its attribute line
_MAX_NEIGHBOURS = 16
_MAX_ATTRS = 6
_MAX_VALUE = 40  # characters of one attribute's value
# Attributes at their spec default say nothing about the node: left out of the picture.
_DEFAULTS = {
    "group": "1",
    "dilations": "1",
    "auto_pad": "NOTSET",
    "training_mode": "0",
    "transA": "0",
    "transB": "0",
    "ceil_mode": "0",
    "count_include_pad": "0",
    "storage_order": "0",
}
# Attributes that say nothing about inference: never drawn.
_IGNORED = {"momentum"}
# Short names for the box; the tooltip keeps the spec's names.
_SHORT = {
    "kernel_shape": "k",
    "strides": "s",
    "pads": "p",
    "dilations": "d",
    "group": "g",
    "epsilon": "eps",
    "activation": "act",
}


@dataclass(frozen=True)
class _Node:
    key: int
    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[str, ...] = ()  # "name=value", at most _MAX_ATTRS


NodeRow = tuple  # (name, op, inputs, outputs) or (name, op, inputs, outputs, attrs)


class GraphIndex:
    """The main graph's nodes by name, with producers and consumers by value name, and
    the shapes of the values the model knows them for."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._index(
            (
                (
                    n.name,
                    f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type,
                    n.input,
                    n.output,
                    key_attributes(n),
                )
                for n in model.graph.node
            ),
            value_shapes(model.graph),
        )

    @classmethod
    def from_nodes(cls, nodes: Iterable[NodeRow], shapes: Mapping[str, str] | None = None):
        """An index of (name, op, inputs, outputs[, attrs]) nodes, no model needed."""
        index = cls.__new__(cls)
        index._index(nodes, shapes or {})
        return index

    def _index(self, nodes: Iterable[NodeRow], shapes: Mapping[str, str]) -> None:
        self.nodes = [
            _Node(
                i,
                row[0],
                row[1],
                tuple(x for x in row[2] if x),
                tuple(x for x in row[3] if x),
                tuple(row[4]) if len(row) > 4 else (),
            )
            for i, row in enumerate(nodes)
        ]
        self.shapes = dict(shapes)
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


def value_shapes(graph: onnx.GraphProto) -> dict[str, str]:
    """``value name -> "1×64×56×56"`` for every value whose shape the graph records
    (a symbolic dim by its name, an unknown one as ``?``)."""
    shapes: dict[str, str] = {}
    for init in graph.initializer:
        shapes[init.name] = "×".join(str(d) for d in init.dims) or "scalar"
    for info in (*graph.input, *graph.value_info, *graph.output):
        tensor = info.type.tensor_type
        if info.name and tensor.HasField("shape"):
            dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
                    for d in tensor.shape.dim]  # fmt: skip
            shapes[info.name] = "×".join(dims) or "scalar"
    return shapes


def key_attributes(node: onnx.NodeProto) -> tuple[str, ...]:
    """The node's attributes as ``name=value`` texts, those at their default left out;
    tensors and subgraphs are named only (``then_branch=graph``)."""
    texts = []
    for attr in node.attribute:
        value = _attribute_value(attr)
        if value is None or _DEFAULTS.get(attr.name) == value or attr.name in _IGNORED:
            continue
        texts.append(f"{attr.name}={_short(value, _MAX_VALUE)}")
    return tuple(texts[:_MAX_ATTRS])


def _attribute_value(attr: onnx.AttributeProto) -> str | None:
    from onnx import AttributeProto as kind  # see TYPE_CHECKING above

    if attr.type == kind.INT:
        return str(attr.i)
    if attr.type == kind.FLOAT:
        return f"{attr.f:g}"
    if attr.type == kind.STRING:
        return attr.s.decode("utf-8", "replace")
    if attr.type in (kind.INTS, kind.FLOATS):
        values = [str(v) for v in attr.ints] or [f"{v:g}" for v in attr.floats]
        if values and all(v == values[0] for v in values) and attr.name != "kernel_shape":
            return values[0]  # pads=1 for [1, 1, 1, 1]
        return ("×" if attr.name == "kernel_shape" else ",").join(values)
    if attr.type in (kind.TENSOR, kind.SPARSE_TENSOR):
        return "tensor"
    if attr.type in (kind.GRAPH, kind.GRAPHS):
        return "graph"
    return None


def region_svg(index: GraphIndex, names: Iterable[str], title: str) -> str | None:
    """The region ``names`` of ``index``'s graph as an SVG, or None when none is found."""
    nodes, region = index.neighbourhood(names)
    if not region:
        return None
    edges = _edges(nodes)
    position = _layout(nodes, edges)
    box_h = _H_ATTRS if any(_third_line(n, index.shapes) for n in nodes) else _H_PLAIN
    columns = max(x for x, _ in position.values()) + 1
    rows = max(y for _, y in position.values()) + 1
    width = 2 * _PAD + columns * (_W + _DX) - _DX
    height = 2 * _PAD + rows * (box_h + _DY) - _DY
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="region" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img">',
        f"<title>{escape(title)}</title>",
    ]
    for src, dst, value in edges:
        parts.append(_edge(position[src], position[dst], value, index.shapes.get(value), box_h))
    for node in nodes:
        parts.append(_box(node, position[node.key], node.key in region, box_h, index.shapes))
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


def _centre(cell: tuple[int, int], box_h: int) -> tuple[float, float]:
    x, y = cell
    return _PAD + x * (_W + _DX) + _W / 2, _PAD + y * (box_h + _DY)


def _edge(
    src: tuple[int, int], dst: tuple[int, int], value: str, shape: str | None, box_h: int
) -> str:
    (x1, y1), (x2, y2) = _centre(src, box_h), _centre(dst, box_h)
    y1 += box_h
    mid = (y1 + y2) / 2
    tip = f"{value}: {shape}" if shape else value
    path = (
        f'<path d="M{x1:.0f},{y1:.0f} C{x1:.0f},{mid:.0f} {x2:.0f},{mid:.0f} {x2:.0f},{y2:.0f}" '
        f'class="edge"><title>{escape(tip)}</title></path>'
    )
    if not shape:
        return path
    return (
        f'{path}<text x="{(x1 + x2) / 2 + 4:.0f}" y="{mid + 4:.0f}" class="shape">'
        f"{escape(_short(shape, 24))}<title>{escape(tip)}</title></text>"
    )


def _box(
    node: _Node, cell: tuple[int, int], in_region: bool, box_h: int, shapes: Mapping[str, str]
) -> str:
    cx, top = _centre(cell, box_h)
    name = node.name or "(unnamed)"
    line = _third_line(node, shapes)
    third = ""
    if line:
        third = (
            f'<text x="{cx:.0f}" y="{top + 44:.0f}" text-anchor="middle" class="attrs">'
            f"{escape(_short(line, 24))}<title>{escape(_details(node, shapes))}</title></text>"
        )
    return (
        f'<g class="{"fused" if in_region else "near"}"><title>{escape(name)}</title>'
        f'<rect x="{cx - _W / 2:.0f}" y="{top:.0f}" width="{_W}" height="{box_h}" rx="5"/>'
        f'<text x="{cx:.0f}" y="{top + 15:.0f}" text-anchor="middle" class="op">'
        f"{escape(_short(node.op, 22))}</text>"
        f'<text x="{cx:.0f}" y="{top + 30:.0f}" text-anchor="middle" class="name">'
        f"{escape(_short(name, 24))}</text>{third}</g>"
    )


def _third_line(node: _Node, shapes: Mapping[str, str]) -> str | None:
    """The key attributes, or without any the shape of the first output, if known."""
    if node.attrs:
        return _compact(node.attrs)
    shape = shapes.get(node.outputs[0]) if node.outputs else None
    return f"→ {shape}" if shape else None


def _compact(attrs: Sequence[str]) -> str:
    """``kernel_shape=3×3 strides=1`` as ``k=3×3 s=1``: what fits in a box."""
    parts = []
    for text in attrs:
        name, _, value = text.partition("=")
        parts.append(f"{_SHORT.get(name, name)}={value}")
    return " ".join(parts)


def _details(node: _Node, shapes: Mapping[str, str]) -> str:
    """The tooltip of the attribute line: every attribute, every input and output."""

    def values(names: Sequence[str]) -> str:
        return ", ".join(f"{v} ({shapes[v]})" if v in shapes else v for v in names) or "none"

    attrs = f"{', '.join(node.attrs)}; " if node.attrs else ""
    return f"{attrs}inputs: {values(node.inputs)}; outputs: {values(node.outputs)}"


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
