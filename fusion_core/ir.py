"""Loading, saving and inspecting models in onnx-ir, safely.

onnx-ir is the in-memory graph (use-def chains, cheap mutation, lazy external data).
This module adds what a service that accepts untrusted models needs on top of it:

* loading never follows an external-data location outside the model's folder
  (no absolute paths, no ``..``, no symlinks), so a hostile model cannot make us read
  ``/etc/passwd``, nor one onnxruntime reads as a memory address (``*/_ORT_MEM_ADDR_/*``);
  every tensor of the file is held to this, sparse ones and those onnx-ir does not read
  included, so a file ``load_model`` accepted can be handed to onnxruntime by its path
  (the check does: its external data is read where it lies, never copied);
* loading refuses a model with a string field that is not UTF-8 (protobuf's parser keeps
  it as bytes; onnx-ir would fail writing it back, far from the cause);
* a model in one file is read with its big weights left in the file, each read from it
  when asked, like those of a data file (``onefile``: the file is not held twice while
  protobuf parses it);
* saving switches to an external-data file when the weights would not fit in one
  protobuf (2 GB) or when asked (the input had one), streamed to it one tensor at a
  time; one file is streamed too, one initializer at a time (``onefile.write_model``).
  A saved model never keeps a reference to the source's data files: every tensor of it
  is in it or in the data file it names beside it, function bodies and ``Constant``
  nodes at any depth included;
* a model as a proto with its weights (``proto_with_weights``) or without their bytes
  (``weightless_proto``: the graph, the inputs and every tensor's type and shape, for
  what reads only those);
* small helpers the matcher and rewriters share: "is this value a constant", the
  consumers of a value, the position of each node.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from autofusion.fusion_core.errors import FusionError, ModelLoadError, UnsafeModelError
from autofusion.fusion_core.onefile import ScannedModel, scan, write_model
from autofusion.fusion_core.provenance import KEYS as PROVENANCE_KEYS

__all__ = [
    "PROTOBUF_LIMIT_BYTES",
    "check_external_data",
    "constant_array",
    "constant_picks",
    "constant_tensor",
    "consumers",
    "load_model",
    "model_from_proto",
    "node_positions",
    "proto_with_weights",
    "save_model",
    "weightless_proto",
]

logger = logging.getLogger(__name__)

# A serialized ModelProto cannot exceed 2 GiB; keep a margin for the graph itself.
PROTOBUF_LIMIT_BYTES = 1_800_000_000


def load_model(path: str | os.PathLike) -> ir.Model:
    """Load an ONNX file into onnx-ir, refusing unsafe external-data references.

    External tensors stay lazy: their bytes are read only when a pass needs them. So do
    the big weights of a model in one file (``onefile.scan``): left in the file, each
    read from it when asked, where ``onnx.load`` would hold them twice while parsing.
    """
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(
            f"model file {str(path)!r} does not exist", hint="check the path and try again"
        )
    if not path.is_file():
        raise ModelLoadError(f"{str(path)!r} is not a file", hint="pass the path of a .onnx file")
    try:
        # What ir.load does, with the text check between the parse and the conversion.
        proto, scanned = _parse(path)
        _check_text(proto, str(path))
        _check_every_external_location(proto, path.parent)
        model = ir.serde.deserialize_model(proto)
    except (DecodeError, ValueError, TypeError, RuntimeError) as exc:
        raise ModelLoadError(
            f"{str(path)!r} is not a valid ONNX model: {exc}",
            hint="export the model again or check that the upload is complete",
        ) from exc
    _check_is_a_model(model, str(path))
    # ir.load resolves the graphs' external data against the model's folder, not that
    # of function bodies: all are read from the folder check_external_data checks.
    for tensor in _external_tensors(model):
        tensor.base_dir = str(path.parent)
    check_external_data(model, path.parent)
    _map_only_their_bytes(model)
    _drop_working_marks(model)
    if scanned is not None:  # the weights left in the file: read from it when asked
        scanned.attach(proto, model)
    return model


def _parse(path: Path) -> tuple[onnx.ModelProto, ScannedModel | None]:
    """The file's proto: whole (``onnx.load``), or with its big weights left in the file
    where ``onefile.scan`` can walk it and its initializers' names are distinct (the
    weights left out are found again by name)."""
    scanned = scan(path)
    if scanned is not None:
        proto = onnx.load_model_from_string(scanned.skeleton)
        names = [tensor.name for tensor in proto.graph.initializer]
        if len(set(names)) == len(names):
            return proto, scanned
        scanned.source.close()
    return onnx.load(str(path), load_external_data=False), None


def model_from_proto(proto: onnx.ModelProto, base_dir: str | os.PathLike = "") -> ir.Model:
    """Convert an in-memory ModelProto, checking external data against ``base_dir``."""
    _check_text(proto, "the model")
    try:
        model = ir.serde.deserialize_model(proto)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ModelLoadError(f"the model is malformed: {exc}") from exc
    _check_is_a_model(model, "<in-memory model>")
    if base_dir:
        for tensor in _external_tensors(model):
            tensor.base_dir = str(base_dir)
    check_external_data(model, Path(base_dir or "."))
    _map_only_their_bytes(model)
    _drop_working_marks(model)
    return model


_WORKING_MARK = "autofusion."


def _drop_working_marks(model: ir.Model) -> None:
    """Take off the metadata a pass leaves on nodes and values for itself (``autofusion.*``
    but the provenance, which describes the output): a canonical rule's "I inserted this,
    undo it if unused", a shared value's key, the sizes proven for a fused op. A model a
    user brings is read as it is: a forged or stale mark (this tool's own output, optimized
    again) would otherwise be believed, an undo taking out a pair it never inserted."""
    graphs = [model.graph, *(f for f in model.functions.values())]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            _drop_marks(node.metadata_props)
            for value in node.outputs:
                _drop_marks(value.metadata_props)
        for value in graph.inputs:
            _drop_marks(value.metadata_props)


def _drop_marks(props) -> None:
    for key in [k for k in props if k.startswith(_WORKING_MARK) and k not in PROVENANCE_KEYS]:
        del props[key]


class RangeMappedTensor(ir.ExternalTensor):
    """An initializer in a data file that maps only its own bytes when read.

    onnx-ir's ``ExternalTensor`` maps the whole data file for each tensor it reads: the
    pages it touches are its own, but each mapping takes the file's size of address
    space, and a pass that holds a few dozen weights of a 2 GiB file (the merges read
    every layer's projections) passed 16 GiB of it: the service's sandboxes limit the
    address space (RLIMIT_AS), so a job that needed 4 GiB of memory failed as out of
    memory. Here each tensor's mapping is its byte range (from the page boundary below
    it); everything else is onnx-ir's (validity, containment, ``tofile``, ``release``).
    Sub-byte types unpack through onnx-ir's own reader."""

    def _load(self) -> None:
        if self.size == 0 or self.dtype.bitwidth < 8:
            super()._load()
            return
        self._check_validity()
        self._check_path_containment()
        start = self._offset or 0
        aligned = start - start % mmap.ALLOCATIONGRANULARITY
        self._skip = start - aligned
        with open(self.path, "rb") as f:
            self.raw = mmap.mmap(
                f.fileno(), self._skip + self.nbytes, access=mmap.ACCESS_READ, offset=aligned
            )
        dtype = np.dtype(self.dtype.numpy()).newbyteorder("<")
        array = np.frombuffer(self.raw, dtype=dtype, offset=self._skip, count=self.size)
        self._array = array.reshape(self.shape.numpy())

    def tobytes(self) -> bytes:
        if self.size == 0 or self.dtype.bitwidth < 8:
            return super().tobytes()
        self._check_validity()
        if self.raw is None:
            self._load()
        return self.raw[self._skip : self._skip + (self._length or self.nbytes)]


def _map_only_their_bytes(model: ir.Model) -> None:
    """Every initializer in a data file, in every graph, read as a ``RangeMappedTensor``."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if type(tensor) is ir.ExternalTensor:
                value.const_value = RangeMappedTensor(
                    tensor.location,
                    tensor.offset,
                    tensor.length,
                    tensor.dtype,
                    shape=tensor.shape,
                    name=tensor.name,
                    doc_string=tensor.doc_string,
                    metadata_props=dict(tensor.metadata_props),
                    base_dir=tensor.base_dir,
                )


def _check_text(proto: onnx.ModelProto, origin: str) -> None:
    """ModelLoadError naming the first string field, at any depth, that is not UTF-8.

    ONNX's schema is proto2: protobuf's parser keeps such a field as bytes instead of
    refusing the file. The service's upload check refuses these too
    (``app.services.model_data_checks.check_text_fields``); this is the line that holds
    for every other way in (the CLI, a job stored before that check).
    """
    pending: list[tuple[Message, str]] = [(proto, "")]
    while pending:  # iterative: subgraphs nest as deep as protobuf allows
        message, place = pending.pop()
        for field, value in message.ListFields():
            repeated = _is_repeated(field)
            if field.type == FieldDescriptor.TYPE_STRING:
                for index, text in enumerate(value if repeated else [value]):
                    if isinstance(text, bytes):
                        where = f"{place}{field.name}" + (f"[{index}]" if repeated else "")
                        raise ModelLoadError(
                            f"{origin} is not a valid ONNX model: its field {where} is not "
                            f"valid UTF-8 text (it starts {text[:40]!r})",
                            hint="fix that string where the model is made and export it again",
                        )
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                items = enumerate(value) if repeated else [(None, value)]
                for index, item in items:
                    suffix = "" if index is None else f"[{index}]"
                    pending.append((item, f"{place}{field.name}{suffix}."))


def _check_every_external_location(proto: onnx.ModelProto, model_dir: Path) -> None:
    """UnsafeModelError for any tensor of the file, at any depth, whose external data is
    not a safe place in ``model_dir``: those onnx-ir reads (``check_external_data`` checks
    them again, with their sizes) and those it does not (sparse initializers, sparse
    attributes), which onnxruntime reads all the same when it is handed the file."""
    root = model_dir.resolve()
    pending: list[Message] = [proto]
    while pending:  # iterative: subgraphs nest as deep as protobuf allows
        message = pending.pop()
        if isinstance(message, onnx.TensorProto):
            if message.data_location == onnx.TensorProto.EXTERNAL:
                entries = {e.key: e.value for e in message.external_data}
                _check_location(message.name, entries.get("location", ""), root)
            continue  # a tensor holds no tensor
        for field, value in message.ListFields():
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                pending.extend(value if _is_repeated(field) else [value])


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf 6 added ``is_repeated`` and later releases dropped ``label``.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == FieldDescriptor.LABEL_REPEATED


def _check_is_a_model(model: ir.Model, origin: str) -> None:
    # Protobuf happily decodes many non-ONNX byte strings into an empty message.
    if model.ir_version <= 0 or (not model.opset_imports and len(model.graph) == 0):
        raise ModelLoadError(
            f"{origin} does not contain an ONNX model (no IR version, opsets or nodes)",
            hint="pass a file written by onnx.save or an exporter",
        )


def _external_tensors(model: ir.Model) -> Iterable[ir.ExternalTensor]:
    """Every tensor stored outside the file: initializers of the main graph and its
    subgraphs, and tensor attributes anywhere (main graph, subgraphs at any depth,
    model-local function bodies)."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                yield value.const_value
    for node, name in _external_attributes(model):
        value = node.attributes[name].value
        yield from (value if isinstance(value, list | tuple) else [value])


def _external_attributes(model: ir.Model) -> list[tuple[ir.Node, str]]:
    """``(node, attribute name)`` of each tensor attribute holding external data."""
    found = []
    for owner in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(owner):
            for name, attr in node.attributes.items():
                if attr.is_ref() or attr.value is None:
                    continue
                if attr.type == ir.AttributeType.TENSOR:
                    tensors = [attr.value]
                elif attr.type == ir.AttributeType.TENSORS:
                    tensors = list(attr.value)
                else:
                    continue
                if any(isinstance(t, ir.ExternalTensor) for t in tensors):
                    found.append((node, name))
    return found


def _load_external_attributes(model: ir.Model) -> int:
    """Read every external tensor attribute into memory; returns the bytes read.

    onnx-ir moves initializers in and out of external data, never attributes: a
    ``Constant`` in a function body would otherwise be saved still pointing at the
    original's data file (``location: w.bin``), which does not sit beside the output.
    """
    total = 0
    for node, name in _external_attributes(model):
        attr = node.attributes[name]
        single = attr.type == ir.AttributeType.TENSOR
        tensors = [attr.value] if single else list(attr.value)
        external = [t for t in tensors if isinstance(t, ir.ExternalTensor)]
        loaded = iter(ir.external_data.convert_tensors_from_external(external))
        tensors = [next(loaded) if isinstance(t, ir.ExternalTensor) else t for t in tensors]
        total += sum(t.nbytes for t in external)
        node.attributes[name] = ir.Attr(
            name, attr.type, tensors[0] if single else tensors, doc_string=attr.doc_string
        )
    return total


def check_external_data(model: ir.Model, model_dir: str | os.PathLike) -> None:
    """Raise UnsafeModelError unless every external tensor lies inside ``model_dir``.

    A location must be relative, must not contain ``..``, must not be or pass through a
    symlink, must exist, and ``offset + length`` must fit in the file.
    """
    root = Path(model_dir).resolve()
    for tensor in _external_tensors(model):
        location = str(tensor.location)
        _check_location(tensor.name, location, root)
        target = root / location
        size = target.stat().st_size
        offset = tensor.offset or 0
        length = tensor.length if tensor.length is not None else tensor.nbytes
        if offset + length > size:
            raise UnsafeModelError(
                f"external data of tensor {tensor.name!r} ({location!r}, offset {offset}, "
                f"length {length}) runs past the end of the file ({size} bytes)",
                hint="upload the complete external-data file",
            )


def _check_location(tensor_name: str, location: str, root: Path) -> None:
    hint = "external-data files must sit next to the model, referenced by a relative name"
    rel = Path(location)
    if not rel.parts or location.strip() in ("", "."):
        raise UnsafeModelError(
            f"tensor {tensor_name!r} has an empty external-data location {location!r}",
            hint=hint,
        )
    if _is_runtime_marker(location):
        raise UnsafeModelError(
            f"tensor {tensor_name!r} refers to external data at {location!r}, named like the "
            "markers onnxruntime reserves (it reads */_ORT_MEM_ADDR_/* as a memory address, "
            "not a file)",
            hint="rename the data file",
        )
    if rel.is_absolute() or location.startswith(("/", "\\")) or ":" in rel.parts[0]:
        raise UnsafeModelError(
            f"tensor {tensor_name!r} refers to external data at absolute path {location!r}",
            hint=hint,
        )
    if ".." in rel.parts or "\\" in location:
        raise UnsafeModelError(
            f"tensor {tensor_name!r} refers to external data outside the model's folder: "
            f"{location!r}",
            hint=hint,
        )
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise UnsafeModelError(
                f"tensor {tensor_name!r} refers to external data through a symlink: {location!r}",
                hint="copy the data file instead of linking it",
            )
    if not current.is_file():
        raise UnsafeModelError(
            f"external-data file {location!r} of tensor {tensor_name!r} is missing",
            hint="upload the external-data files together with the model",
        )
    if current.stat().st_nlink > 1:
        # A hard link may share its bytes with any file on the same disk.
        raise UnsafeModelError(
            f"external-data file {location!r} of tensor {tensor_name!r} is a hard link",
            hint="copy the data file instead of linking it",
        )
    if not current.resolve().is_relative_to(root):
        raise UnsafeModelError(
            f"tensor {tensor_name!r} refers to external data outside the model's folder: "
            f"{location!r}",
            hint=hint,
        )


# onnxruntime reads some locations as something other than a file: "*/_ORT_MEM_ADDR_/*"
# and "*/_ORT_NATIVE_ENDIAN_MEM_ADDR_/*" make it read the tensor from the memory address
# in ``offset`` (core/framework/tensorprotoutils.h). Any part named like its markers is
# refused, so a marker a later release adds is too.
_RUNTIME_MARKER_PREFIX = "_ORT_"


def _is_runtime_marker(location: str) -> bool:
    parts = location.replace("\\", "/").split("/")
    return any(part.strip().upper().startswith(_RUNTIME_MARKER_PREFIX) for part in parts)


def save_model(
    model: ir.Model, path: str | os.PathLike, *, external_data: bool = False
) -> list[Path]:
    """Save ``model``; its weights go to ``<name>.data`` beside it when ``external_data``
    or when they exceed 2 GB, else inside the file. Returns the files written.

    With a data file the weights are streamed to it one tensor at a time (onnx-ir's
    ``save``), those still read lazily from the source's data file included, and the
    file itself holds only the graph and the tensors up to 1 KiB: no copy of the weights
    as a proto or as one byte string. The source's data file is then unmapped again
    (``_release_mappings``): what was read to write it is not kept resident. A model with
    no tensor past 1 KiB is one file whatever ``external_data`` says.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Tensor attributes (Constant nodes, function bodies included) always go inside
    # the file: only initializers can move to the data file.
    attribute_bytes = _load_external_attributes(model)
    if attribute_bytes > PROTOBUF_LIMIT_BYTES:
        raise FusionError(
            f"the model's tensor attributes (Constant nodes) hold {attribute_bytes} bytes, "
            "more than one ONNX file can carry",
            hint="store large constants as initializers, which can live in external data",
        )
    sizes = [
        v.const_value.nbytes
        for g in model.graphs()
        for v in g.initializers.values()
        if v.const_value is not None
    ]
    fits = sum(sizes) + attribute_bytes <= PROTOBUF_LIMIT_BYTES
    if fits and (not external_data or max(sizes, default=0) <= _EXTERNAL_THRESHOLD_BYTES):
        # Tensors still lazily read from the source folder would be saved as references
        # to files that do not exist beside the new model: the main graph's are read one
        # at a time as they are written, the subgraphs' (seldom big) read in first.
        _read_in_subgraph_weights(model)
        write_model(model, path)
        return [path]
    data_name = path.name + ".data"
    logger.info("weights are %d bytes: saving them to %s", sum(sizes), data_name)
    # Written beside and moved over the destination, never rewritten in place: the
    # destination may be the file the model's weights are still read from.
    scratch = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        ir.save(
            model, scratch, external_data=data_name, size_threshold_bytes=_EXTERNAL_THRESHOLD_BYTES
        )
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
        _release_mappings(model)
    return [path, path.parent / data_name]


# Tensors up to this size stay inside the file when the weights go to a data file
_EXTERNAL_THRESHOLD_BYTES = 1024


def _lazy_initializers(model: ir.Model) -> list[ir.Value]:
    """The initializers, in every graph, still read lazily from a data file."""
    return [
        value
        for graph in model.graphs()
        for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    ]


def _read_in_subgraph_weights(model: ir.Model) -> None:
    """Read into memory the initializers of subgraphs still in a data file."""
    for graph in model.graphs():
        if graph is model.graph:
            continue
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                [value.const_value] = ir.external_data.convert_tensors_from_external(
                    [value.const_value]
                )


def _release_mappings(model: ir.Model) -> None:
    """Unmap the data files of the lazy initializers: a tensor read through its mapping
    stays resident (it counts in the process's memory) until then. Each maps its file
    again the next time it is read."""
    for value in _lazy_initializers(model):
        value.const_value.release()


def proto_with_weights(model: ir.Model) -> onnx.ModelProto:
    """``ir.to_proto(model)`` with every initializer's bytes in the proto, those still
    read lazily from a data file included (``ir.to_proto`` would write them as references
    to a file beside a model that has no folder). ``model`` is left as it was."""
    lazy = _lazy_initializers(model)
    tensors = [value.const_value for value in lazy]
    try:
        for value, tensor in zip(lazy, tensors, strict=True):
            # the mapped array itself (the proto copies its bytes once); named and typed as
            # ``ir.external_data.load_to_model`` makes them
            value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name, dtype=tensor.dtype)
        return ir.to_proto(model)
    finally:
        for value, tensor in zip(lazy, tensors, strict=True):
            value.const_value = tensor
        _release_mappings(model)


def weightless_proto(model: ir.Model, *, keep_up_to: int = 0) -> onnx.ModelProto:
    """``model`` as a proto without its initializers' bytes: the graph, the inputs and
    outputs, and every initializer with its name, type and shape, written as a reference
    to external data that does not exist (``location`` names no file). What reads only the
    graph (the check's inputs and outputs) gets the model without a copy of its weights;
    what runs it needs the model itself. ``keep_up_to``: initializers of at most that many
    bytes keep theirs (the sizes a shape inference reads). ``model`` is left as it was."""
    values = [
        v
        for g in model.graphs()
        for v in g.initializers.values()
        if v.const_value is not None and v.const_value.nbytes > keep_up_to
    ]
    tensors = [value.const_value for value in values]
    try:
        for value, tensor in zip(values, tensors, strict=True):
            value.const_value = ir.ExternalTensor(
                _NO_DATA, offset=0, length=tensor.nbytes, dtype=tensor.dtype,
                shape=tensor.shape, name=tensor.name, doc_string=tensor.doc_string,
            )  # fmt: skip
        return ir.to_proto(model)
    finally:
        for value, tensor in zip(values, tensors, strict=True):
            value.const_value = tensor


# The location of every initializer in a weightless proto: not a file name this module
# accepts (a colon in the first part reads as a drive), so nothing reads it by mistake.
_NO_DATA = "weightless:no-data"


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's contents if it is a constant the model cannot override, else None.

    Constants are initializers that are not graph inputs (an initializer listed as an
    input is a default the caller may replace) and outputs of ``Constant`` nodes.
    """
    tensor = constant_tensor(value)
    return tensor.numpy() if tensor is not None else None


def constant_picks(items: list, index: ir.Value | None) -> list | None:
    """``items`` picked by the constant indices ``index`` holds (a Gather on axis 0 of a
    shape's entries: negative indices count from the end), or None where ``index`` is no
    constant or an index falls outside."""
    indices = constant_array(index)
    if indices is None:
        return None
    picked = []
    for i in indices.reshape(-1):
        i = int(i) + (len(items) if i < 0 else 0)
        if not 0 <= i < len(items):
            return None
        picked.append(items[i])
    return picked


def constant_tensor(value: ir.Value | None) -> ir.TensorProtocol | None:
    """The tensor of a constant as ``constant_array`` defines one, not read: its dtype and
    shape are known without reading a lazy tensor (a data file's, a merged weight)."""
    if value is None:
        return None
    producer = value.producer()
    if producer is None:
        if value.const_value is None or value.is_graph_input():
            return None
        return value.const_value
    if producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
        attr = producer.attributes.get("value")
        if attr is not None and attr.type == ir.AttributeType.TENSOR:
            return attr.value
    return None


def consumers(value: ir.Value) -> list[ir.Node]:
    """The distinct nodes that read ``value``, in no particular order."""
    return list({id(u.node): u.node for u in value.uses()}.values())


def node_positions(graph: ir.Graph) -> dict[int, int]:
    """Map ``id(node)`` to the node's position in the graph's current order."""
    return {id(node): i for i, node in enumerate(graph)}
