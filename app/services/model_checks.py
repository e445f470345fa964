"""Checks on an uploaded model before anything loads it: the service's trust boundary.

Only the ModelProto is parsed (``onnx.load(..., load_external_data=False)``); external
data is never read here, its files are only ``lstat``-ed inside the upload folder.
Refused, each as a 422 problem:

* a file that is not an ONNX model (``invalid-model``);
* an external-data location that is absolute, climbs out with ``..``, passes through a
  symlink or a hard link, is not one of the uploaded data files, or is shorter than its
  tensor (``unsafe-external-data``);
* a tensor or value declaring more than ``max_tensor_elements`` elements
  (``tensor-too-large``): a worker must never be asked to allocate a 10^12-element weight;
* a node in an op domain that is neither allowed by the settings nor a function the
  model itself defines (``op-domain-not-allowed``);
* an external-data entry other than ``location``, ``offset``, ``length`` and
  ``checksum``, or one key given twice (``unsafe-external-data``);
* a tensor whose stored data (``raw_data``, the typed field, or an external ``length``)
  is not the size its dims and data type say (``tensor-size-mismatch``);
* a model-local function that calls itself, directly or through others
  (``recursive-function``);
* more than ``max_model_nodes`` nodes in all graphs and functions together
  (``too-many-nodes``), or subgraphs nested deeper than ``max_graph_depth``
  (``nesting-too-deep``);
* a string field anywhere in the model (a name, a domain, a doc string, a metadata key
  or value, an external-data entry) that is not valid UTF-8 (``invalid-model``, naming
  the field).

Whatever the bytes, only ``ProblemError`` comes out (tests/fuzz/test_fuzz_validators.py
fuzzes it; bench/fuzz_validators.py runs longer).

The walk covers the main graph, every subgraph (``If``/``Loop``/``Scan`` bodies, at any
depth) and every model-local function. ``fusion_core.ir.load_model`` checks external
data again when the worker loads the model; this is the first line, not the only one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, TypeProto

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.model_data_checks import (
    check_external,
    check_stored_size,
    check_text_fields,
    element_count,
    invalid_model,
    not_text,
    text_of,
)

__all__ = ["inspect_model"]


def inspect_model(model_path: Path, data_names: Collection[str], settings: Settings) -> None:
    """Raise a 422 ProblemError unless the uploaded model is safe to hand to a worker."""
    model = _parse(model_path)
    check_text_fields(model)
    inventory = _Inventory.of(model, settings.max_model_nodes, settings.max_graph_depth)
    limit = settings.max_tensor_elements
    for where, tensor in inventory.tensors:
        _check_count(element_count(tensor.dims, where), limit, where, tensor.dims)
    for where, dims in inventory.sparse_shapes:
        _check_count(element_count(dims, where), limit, where, dims)
    for where, type_proto in inventory.types:
        for dims in _declared_shapes(type_proto):
            _check_count(element_count(dims, where), limit, where, dims)
    _check_domains(model, inventory.nodes, settings.allowed_op_domains)
    _check_recursion(inventory.calls)
    folder = model_path.parent
    for where, tensor in inventory.tensors:
        if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
            check_external(tensor, where, folder, set(data_names))
        else:
            check_stored_size(tensor, where)


def _parse(path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(path), load_external_data=False)
    except UnicodeDecodeError as exc:  # protobuf's pure-Python parser checks UTF-8 itself
        raise not_text(str(exc).rpartition("in field: ")[2] or "(a string field)") from exc
    except (DecodeError, ValueError, TypeError, RuntimeError, RecursionError) as exc:
        raise invalid_model(
            f"the uploaded model is not a valid ONNX file ({type(exc).__name__}: {exc}); "
            "export it again or check that the upload is complete"
        ) from exc
    # Protobuf decodes many byte strings that are not ONNX into a near-empty message.
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise invalid_model(
            "the uploaded file does not contain an ONNX model (no IR version, opset or graph); "
            "send a file written by onnx.save or an exporter"
        )
    return model


# A function, by (domain, name), as nodes call it.
FunctionKey = tuple[str, str]


@dataclass
class _Inventory:
    """References to every node, tensor and declared type in the model, with a location,
    and which model-local function calls which."""

    nodes: list[tuple[str, NodeProto]] = field(default_factory=list)
    tensors: list[tuple[str, TensorProto]] = field(default_factory=list)
    sparse_shapes: list[tuple[str, Iterable[int]]] = field(default_factory=list)
    types: list[tuple[str, TypeProto]] = field(default_factory=list)
    calls: dict[FunctionKey, set[FunctionKey]] = field(default_factory=dict)
    local: set[FunctionKey] = field(default_factory=set)
    max_nodes: int = 0
    max_depth: int = 0

    @classmethod
    def of(cls, model: onnx.ModelProto, max_nodes: int, max_depth: int) -> _Inventory:
        inventory = cls(max_nodes=max_nodes, max_depth=max_depth)
        inventory.local = {
            (text_of(f.domain, "a function's domain"), text_of(f.name, "a function's name"))
            for f in model.functions
        }
        # (label, graph, nesting depth, the function whose body it is in)
        graphs: list[_Pending] = [("the main graph", model.graph, 1, None)]
        for function in model.functions:
            key = (function.domain, function.name)
            label = f"function {function.domain}::{function.name}"
            inventory.calls.setdefault(key, set())
            inventory._add_nodes(label, function.node, graphs, 1, key)
            for info in function.value_info:
                inventory.types.append((f"value {info.name!r} in {label}", info.type))
        while graphs:  # iterative: subgraphs nest as deep as protobuf allows
            label, graph, depth, owner = graphs.pop()
            inventory._check_depth(label, depth)
            for tensor in graph.initializer:
                text_of(tensor.name, f"the name of an initializer in {label}")
                inventory.tensors.append((f"initializer {tensor.name!r} in {label}", tensor))
            for sparse in graph.sparse_initializer:
                inventory._add_sparse(f"sparse initializer in {label}", sparse)
            for info in (*graph.input, *graph.output, *graph.value_info):
                text_of(info.name, f"the name of a value in {label}")
                inventory.types.append((f"value {info.name!r} in {label}", info.type))
            inventory._add_nodes(label, graph.node, graphs, depth, owner)
        return inventory

    def _check_depth(self, label: str, depth: int) -> None:
        if depth > self.max_depth:
            raise ProblemError(
                422,
                "nesting-too-deep",
                "Subgraphs nested too deeply",
                f"{label} is nested {depth} graphs deep; this server accepts at most "
                f"{self.max_depth} (setting max_graph_depth)",
                limit=self.max_depth,
            )

    def _add_nodes(
        self,
        label: str,
        nodes: Iterable[NodeProto],
        graphs: list[_Pending],
        depth: int,
        owner: FunctionKey | None,
    ) -> None:
        for node in nodes:
            self.nodes.append((label, node))
            if len(self.nodes) > self.max_nodes:
                raise ProblemError(
                    422,
                    "too-many-nodes",
                    "Too many nodes",
                    f"the model has more than {self.max_nodes} nodes (all graphs, subgraphs "
                    "and functions together); this server accepts at most that many "
                    "(setting max_model_nodes)",
                    limit=self.max_nodes,
                )
            called = _node_texts(node, label)
            if owner is not None and called in self.local:
                self.calls[owner].add(called)
            for attr in node.attribute:
                where = f"attribute {attr.name!r} of node {node.name or node.op_type!r} in {label}"
                self._add_attribute(where, attr, graphs, depth, owner)

    def _add_attribute(
        self,
        where: str,
        attr: AttributeProto,
        graphs: list[_Pending],
        depth: int,
        owner: FunctionKey | None,
    ) -> None:
        # Look at every field that is set, whatever ``attr.type`` claims.
        if attr.HasField("t"):
            self.tensors.append((where, attr.t))
        self.tensors.extend((where, t) for t in attr.tensors)
        if attr.HasField("sparse_tensor"):
            self._add_sparse(where, attr.sparse_tensor)
        for sparse in attr.sparse_tensors:
            self._add_sparse(where, sparse)
        if attr.HasField("g"):
            graphs.append((f"the subgraph of {where}", attr.g, depth + 1, owner))
        graphs.extend((f"a subgraph of {where}", g, depth + 1, owner) for g in attr.graphs)
        if attr.HasField("tp"):
            self.types.append((where, attr.tp))
        self.types.extend((where, tp) for tp in attr.type_protos)

    def _add_sparse(self, where: str, sparse: onnx.SparseTensorProto) -> None:
        # A runtime densifies sparse initializers: the dense shape is what gets allocated.
        self.sparse_shapes.append((where, sparse.dims))
        self.tensors.append((f"the values of {where}", sparse.values))
        self.tensors.append((f"the indices of {where}", sparse.indices))


_Pending = tuple[str, GraphProto, int, "FunctionKey | None"]


def _node_texts(node: NodeProto, label: str) -> FunctionKey:
    """(domain, op type) of ``node``, after checking that every name it carries is text
    (a worker would otherwise fail on bytes where it expects a name)."""
    domain = text_of(node.domain, f"the domain of a node in {label}")
    op_type = text_of(node.op_type, f"the op type of a node in {label}")
    text_of(node.name, f"the name of a node in {label}")
    for name in (*node.input, *node.output):
        text_of(name, f"a value name of node {node.name or op_type!r} in {label}")
    return domain, op_type


def _check_recursion(calls: dict[FunctionKey, set[FunctionKey]]) -> None:
    """Refuse a function that calls itself, directly or through others: inlining it (the
    runtime does) never ends. Depth-first with an explicit stack."""
    state: dict[FunctionKey, int] = {}  # 1: on the current path, 2: done
    for root in calls:
        if state.get(root):
            continue
        state[root] = 1
        path = [root]
        stack = [iter(sorted(calls[root]))]
        while stack:
            callee = next(stack[-1], None)
            if callee is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(callee) == 1:
                cycle = [*path[path.index(callee) :], callee]
                chain = " -> ".join(f"{d}::{n}" for d, n in cycle)
                raise ProblemError(
                    422,
                    "recursive-function",
                    "Recursive function",
                    f"the model's local functions call themselves ({chain}); a runtime "
                    "inlines functions, so this never ends: define them without recursion",
                    functions=[f"{d}::{n}" for d, n in cycle],
                )
            elif callee not in state:
                state[callee] = 1
                path.append(callee)
                stack.append(iter(sorted(calls.get(callee, ()))))


def _declared_shapes(type_proto: TypeProto) -> Iterable[list[int]]:
    """The fixed dimensions of every tensor inside a (possibly nested) type."""
    pending = [type_proto]
    while pending:
        current = pending.pop()
        kind = current.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            shape = getattr(current, kind).shape
            yield [d.dim_value for d in shape.dim if d.HasField("dim_value")]
        elif kind in ("sequence_type", "optional_type"):
            pending.append(getattr(current, kind).elem_type)
        elif kind == "map_type":
            pending.append(current.map_type.value_type)


def _check_count(count: int, limit: int, where: str, dims: Iterable[int]) -> None:
    if count > limit:
        shown = list(dims)
        text = str(shown) if len(shown) <= 16 else f"{shown[:16]}... ({len(shown)} dims)"
        raise ProblemError(
            422,
            "tensor-too-large",
            "Tensor too large",
            f"{where} declares shape {text}, {count} elements; this server accepts at most "
            f"{limit} elements per tensor (max_tensor_elements)",
            at=where,
            limit=limit,
        )


def _check_domains(
    model: onnx.ModelProto, nodes: Iterable[tuple[str, NodeProto]], allowed: Collection[str]
) -> None:
    local_functions = {(f.domain, f.name) for f in model.functions}
    allowed = set(allowed)
    for label, node in nodes:
        if node.domain in allowed or (node.domain, node.op_type) in local_functions:
            continue
        raise ProblemError(
            422,
            "op-domain-not-allowed",
            "Op domain not allowed",
            f"node {node.name or node.op_type!r} in {label} uses op {node.op_type!r} from domain "
            f"{node.domain!r}, which this server does not run; allowed domains: "
            f"{sorted(allowed)}, plus functions the model defines",
            domain=node.domain,
        )
