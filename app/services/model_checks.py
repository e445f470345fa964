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
* a name, domain or external-data entry that is not valid UTF-8 (``invalid-model``).

Whatever the bytes, only ``ProblemError`` comes out (tests/app/test_fuzz_validators.py
fuzzes it; bench/fuzz_validators.py runs longer).

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
# What onnx writes (onnx.external_data_helper); any other key is refused.
_EXTERNAL_KEYS = ("location", "offset", "length", "checksum")
# Elements per entry of the typed field, where it is not one.
_PACKED_PER_ENTRY = {
    TensorProto.UINT4: 2,
    TensorProto.INT4: 2,
    TensorProto.FLOAT4E2M1: 2,
    TensorProto.UINT2: 4,
    TensorProto.INT2: 4,
}
_ENTRIES_PER_ELEMENT = {TensorProto.COMPLEX64: 2, TensorProto.COMPLEX128: 2}


def inspect_model(model_path: Path, data_names: Collection[str], settings: Settings) -> None:
    """Raise a 422 ProblemError unless the uploaded model is safe to hand to a worker."""
    model = _parse(model_path)
    inventory = _Inventory.of(model, settings.max_model_nodes, settings.max_graph_depth)
    limit = settings.max_tensor_elements
    for where, tensor in inventory.tensors:
        _check_count(_elements(tensor.dims, where), limit, where, tensor.dims)
    for where, dims in inventory.sparse_shapes:
        _check_count(_elements(dims, where), limit, where, dims)
    for where, type_proto in inventory.types:
        for dims in _declared_shapes(type_proto):
            _check_count(_elements(dims, where), limit, where, dims)
    _check_domains(model, inventory.nodes, settings.allowed_op_domains)
    _check_recursion(inventory.calls)
    folder = model_path.parent
    for where, tensor in inventory.tensors:
        if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
            _check_external(tensor, where, folder, set(data_names))
        else:
            _check_stored_size(tensor, where)


def _text(value: str | bytes, what: str) -> str:
    """``value`` as text: protobuf hands out a string field that is not UTF-8 as bytes."""
    if isinstance(value, bytes):
        raise _invalid_model(
            f"{what} is not valid UTF-8 text ({value[:40]!r}); export the model again"
        )
    return value


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
            (_text(f.domain, "a function's domain"), _text(f.name, "a function's name"))
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
                _text(tensor.name, f"the name of an initializer in {label}")
                inventory.tensors.append((f"initializer {tensor.name!r} in {label}", tensor))
            for sparse in graph.sparse_initializer:
                inventory._add_sparse(f"sparse initializer in {label}", sparse)
            for info in (*graph.input, *graph.output, *graph.value_info):
                _text(info.name, f"the name of a value in {label}")
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
    domain = _text(node.domain, f"the domain of a node in {label}")
    op_type = _text(node.op_type, f"the op type of a node in {label}")
    _text(node.name, f"the name of a node in {label}")
    for name in (*node.input, *node.output):
        _text(name, f"a value name of node {node.name or op_type!r} in {label}")
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
    info = _external_entries(tensor, where)
    location = info.get("location", "")
    try:
        path = _check_location(location, where, folder, data_names)
        size = path.stat().st_size
    except (OSError, ValueError):  # a NUL byte, a name too long for the file system
        raise _unsafe(
            f"{where} refers to external data {location[:80]!r}, which is not a usable file name",
            where,
        ) from None
    offset = _int_entry(info, "offset", where) or 0
    length = _int_entry(info, "length", where)
    needed = _nbytes(tensor, where)
    if length is not None and length != needed:
        raise _size_mismatch(tensor, where, needed, f"an external-data length of {length} bytes")
    length = needed if length is None else length
    if offset + length > size:
        raise _unsafe(
            f"external data of {where} ({location!r}, offset {offset}, length {length}) runs "
            f"past the end of the file ({size} bytes)",
            where,
        )


def _external_entries(tensor: TensorProto, where: str) -> dict[str, str]:
    """The external-data entries as a mapping: known keys only, each at most once (onnx's
    own loader sets any key as an attribute, ``basepath`` and ``__class__`` included)."""
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        key = _text(entry.key, f"an external-data key of {where}")
        if key not in _EXTERNAL_KEYS:
            raise _unsafe(
                f"{where} has an external-data entry {key[:80]!r}; only "
                f"{', '.join(_EXTERNAL_KEYS)} are allowed",
                where,
            )
        if key in info:
            raise _unsafe(f"{where} gives the external-data entry {key!r} twice", where)
        info[key] = _text(entry.value, f"the external-data {key} of {where}")
    return info


def _size_mismatch(tensor: TensorProto, where: str, needed: int, stored: str) -> ProblemError:
    dims = list(tensor.dims)
    shown = str(dims) if len(dims) <= 16 else f"{dims[:16]}... ({len(dims)} dims)"
    dtype = TensorProto.DataType.Name(tensor.data_type)
    return ProblemError(
        422,
        "tensor-size-mismatch",
        "Tensor size mismatch",
        f"{where} declares shape {shown} of {dtype}, which is {needed} bytes, but stores "
        f"{stored}; the file is corrupt or truncated: export the model again",
        at=where,
    )


def _check_stored_size(tensor: TensorProto, where: str) -> None:
    """The data stored inside the model (``raw_data`` or the typed field) has exactly the
    size the dims and data type say: a runtime reads past a short buffer otherwise."""
    if tensor.HasField("raw_data"):
        if tensor.data_type == TensorProto.STRING:
            raise _invalid_model(f"{where} is a string tensor with raw_data, which ONNX forbids")
        needed, stored = _nbytes(tensor, where), len(tensor.raw_data)
        if stored != needed:
            raise _size_mismatch(tensor, where, needed, f"{stored} bytes of raw_data")
        return
    count = _elements(tensor.dims, where)
    try:
        typed = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    except (KeyError, ValueError):
        if count == 0:
            return
        raise _invalid_model(f"{where} has an unknown data type {tensor.data_type}") from None
    if tensor.data_type in _PACKED_BITS and tensor.data_type not in _PACKED_PER_ENTRY:
        return  # 6-bit types: only raw_data has a defined packing
    per_entry = _PACKED_PER_ENTRY.get(tensor.data_type, 1)
    entries = math.ceil(count / per_entry) * _ENTRIES_PER_ELEMENT.get(tensor.data_type, 1)
    stored = len(getattr(tensor, typed))
    if stored != entries:
        raise _size_mismatch(
            tensor, where, _nbytes_or_count(tensor, where), f"{stored} values in {typed}"
        )


def _nbytes_or_count(tensor: TensorProto, where: str) -> int:
    if tensor.data_type == TensorProto.STRING:
        return _elements(tensor.dims, where)
    return _nbytes(tensor, where)


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
