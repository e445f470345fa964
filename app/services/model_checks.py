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
  model itself defines (``op-domain-not-allowed``).

The walk covers the main graph, every subgraph (``If``/``Loop``/``Scan`` bodies, at any
depth) and every model-local function. ``fusion_core.ir.load_model`` checks external
data again when the worker loads the model; this is the first line, not the only one.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, TypeProto

from app.core.config import Settings
from app.core.problems import ProblemError

__all__ = ["inspect_model"]

# Element types narrower than a byte, packed: bits per element.
_PACKED_BITS = {
    TensorProto.UINT4: 4,
    TensorProto.INT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.UINT2: 2,
    TensorProto.INT2: 2,
    TensorProto.FLOAT6E2M3: 6,
    TensorProto.FLOAT6E3M2: 6,
}
_LOCATION_HINT = "reference external data by the plain file name of a `data` part of the upload"


def inspect_model(model_path: Path, data_names: Collection[str], settings: Settings) -> None:
    """Raise a 422 ProblemError unless the uploaded model is safe to hand to a worker."""
    model = _parse(model_path)
    inventory = _Inventory.of(model)
    limit = settings.max_tensor_elements
    for where, tensor in inventory.tensors:
        _check_count(_elements(tensor.dims, where), limit, where, tensor.dims)
    for where, dims in inventory.sparse_shapes:
        _check_count(_elements(dims, where), limit, where, dims)
    for where, type_proto in inventory.types:
        for dims in _declared_shapes(type_proto):
            _check_count(_elements(dims, where), limit, where, dims)
    _check_domains(model, inventory.nodes, settings.allowed_op_domains)
    folder = model_path.parent
    for where, tensor in inventory.tensors:
        if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
            _check_external(tensor, where, folder, set(data_names))


def _invalid_model(detail: str) -> ProblemError:
    return ProblemError(422, "invalid-model", "Invalid model", detail)


def _unsafe(detail: str, where: str) -> ProblemError:
    return ProblemError(
        422,
        "unsafe-external-data",
        "Unsafe external data",
        f"{detail} ({_LOCATION_HINT})",
        at=where,
    )


def _parse(path: Path) -> onnx.ModelProto:
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, TypeError, RuntimeError, RecursionError) as exc:
        raise _invalid_model(
            f"the uploaded model is not a valid ONNX file ({type(exc).__name__}: {exc}); "
            "export it again or check that the upload is complete"
        ) from exc
    # Protobuf decodes many byte strings that are not ONNX into a near-empty message.
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise _invalid_model(
            "the uploaded file does not contain an ONNX model (no IR version, opset or graph); "
            "send a file written by onnx.save or an exporter"
        )
    return model


@dataclass
class _Inventory:
    """References to every node, tensor and declared type in the model, with a location."""

    nodes: list[tuple[str, NodeProto]] = field(default_factory=list)
    tensors: list[tuple[str, TensorProto]] = field(default_factory=list)
    sparse_shapes: list[tuple[str, Iterable[int]]] = field(default_factory=list)
    types: list[tuple[str, TypeProto]] = field(default_factory=list)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _Inventory:
        inventory = cls()
        graphs: list[tuple[str, GraphProto]] = [("the main graph", model.graph)]
        for function in model.functions:
            label = f"function {function.domain}::{function.name}"
            inventory._add_nodes(label, function.node, graphs)
            for info in function.value_info:
                inventory.types.append((f"value {info.name!r} in {label}", info.type))
        while graphs:  # iterative: subgraphs nest as deep as protobuf allows
            label, graph = graphs.pop()
            for tensor in graph.initializer:
                inventory.tensors.append((f"initializer {tensor.name!r} in {label}", tensor))
            for sparse in graph.sparse_initializer:
                inventory._add_sparse(f"sparse initializer in {label}", sparse)
            for info in (*graph.input, *graph.output, *graph.value_info):
                inventory.types.append((f"value {info.name!r} in {label}", info.type))
            inventory._add_nodes(label, graph.node, graphs)
        return inventory

    def _add_nodes(
        self, label: str, nodes: Iterable[NodeProto], graphs: list[tuple[str, GraphProto]]
    ) -> None:
        for node in nodes:
            self.nodes.append((label, node))
            for attr in node.attribute:
                where = f"attribute {attr.name!r} of node {node.name or node.op_type!r} in {label}"
                self._add_attribute(where, attr, graphs)

    def _add_attribute(
        self, where: str, attr: AttributeProto, graphs: list[tuple[str, GraphProto]]
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
            graphs.append((f"the subgraph of {where}", attr.g))
        graphs.extend((f"a subgraph of {where}", g) for g in attr.graphs)
        if attr.HasField("tp"):
            self.types.append((where, attr.tp))
        self.types.extend((where, tp) for tp in attr.type_protos)

    def _add_sparse(self, where: str, sparse: onnx.SparseTensorProto) -> None:
        # A runtime densifies sparse initializers: the dense shape is what gets allocated.
        self.sparse_shapes.append((where, sparse.dims))
        self.tensors.append((f"the values of {where}", sparse.values))
        self.tensors.append((f"the indices of {where}", sparse.indices))


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


def _elements(dims: Iterable[int], where: str) -> int:
    """The product of ``dims``; stops multiplying once it is absurd (dims may be huge)."""
    dims = list(dims)
    if any(d < 0 for d in dims):
        raise _invalid_model(f"{where} declares a negative dimension {dims[:16]}")
    if 0 in dims:
        return 0
    count = 1
    for d in dims:
        count *= d
        if count > 1 << 64:
            break
    return count


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


def _check_external(tensor: TensorProto, where: str, folder: Path, data_names: set[str]) -> None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    path = _check_location(location, where, folder, data_names)
    offset = _int_entry(info, "offset", where) or 0
    length = _int_entry(info, "length", where)
    if length is None:
        length = _nbytes(tensor, where)
    size = path.stat().st_size
    if offset + length > size:
        raise _unsafe(
            f"external data of {where} ({location!r}, offset {offset}, length {length}) runs "
            f"past the end of the file ({size} bytes)",
            where,
        )


def _check_location(location: str, where: str, folder: Path, data_names: set[str]) -> Path:
    if location.strip() in ("", "."):
        raise _unsafe(f"{where} has an empty external-data location", where)
    windows = PureWindowsPath(location)
    if location.startswith(("/", "\\")) or windows.is_absolute() or windows.drive:
        raise _unsafe(f"{where} refers to external data at absolute path {location!r}", where)
    parts = PurePosixPath(location).parts
    if ".." in parts or "\\" in location:
        raise _unsafe(f"{where} refers to external data outside the upload: {location!r}", where)
    # Uploaded parts are regular files, but the location may still name a link that
    # something else put in the folder: look at each component without following it.
    current = folder
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise _unsafe(f"{where} refers to external data through a symlink: {location!r}", where)
    if "/".join(parts) not in data_names or not current.is_file():
        raise _unsafe(
            f"{where} refers to external data {location!r}, which is not one of the uploaded "
            f"data files {sorted(data_names)}",
            where,
        )
    if current.stat().st_nlink > 1:
        raise _unsafe(f"external-data file {location!r} of {where} is a hard link", where)
    if not current.resolve().is_relative_to(folder.resolve()):
        raise _unsafe(f"{where} refers to external data outside the upload: {location!r}", where)
    return current


def _int_entry(info: dict[str, str], key: str, where: str) -> int | None:
    if key not in info:
        return None
    try:
        value = int(info[key])
    except ValueError:
        raise _invalid_model(
            f"{where} has a non-integer external-data {key} {info[key]!r}"
        ) from None
    if value < 0:
        raise _invalid_model(f"{where} has a negative external-data {key} {value}")
    return value


def _nbytes(tensor: TensorProto, where: str) -> int:
    count = _elements(tensor.dims, where)
    if tensor.data_type in _PACKED_BITS:
        return math.ceil(count * _PACKED_BITS[tensor.data_type] / 8)
    if tensor.data_type == TensorProto.STRING:
        raise _invalid_model(f"{where} is a string tensor, which cannot use external data")
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, ValueError, TypeError):
        raise _invalid_model(f"{where} has an unknown data type {tensor.data_type}") from None
    return count * itemsize
