"""A model in one file, read with its big weights left in the file.

Protobuf's parser (upb) copies every byte it parses, from a memoryview of a mapped file
too, and ``onnx.load`` first reads the whole file into one byte string: 2 copies of the
weights at the peak, 1 after. Here the file is walked at the wire level
(``_wire.fields``): the model's fields are copied as they are, except the ``raw_data`` of
each main-graph initializer from ``MIN_LAZY_BYTES`` up, which is left out; that skeleton
(the graph, a few hundred KB for a big decoder) is what protobuf parses. Each left-out
tensor then reads its bytes from the file when asked (``attach``: an ``ir.LazyTensor``
over a mapping of its byte range, unmapped when the array is dropped), so a one-file
model is as lazy as one with a data file, and everything else sees the same tensors:
same name, type, shape, doc string and bytes (``ir.to_proto`` writes them inside, as
before, never as references).

The file is read through a descriptor opened here and kept by the lazy tensors: a file
saved over the model's path later (the writer replaces, never rewrites in place) does
not change what they read. Only tensors whose proto is plain (name, type, dims, doc
string and ``raw_data``, once, its length what the dims and type say) are left in the
file; any other is parsed as it is, and a file this walk cannot follow is left to
protobuf's parser whole (``scan`` says None), which reports what is wrong with it.
"""

from __future__ import annotations

import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.onefile._wire import (
    LENGTH_DELIMITED,
    VARINT,
    Malformed,
    fields,
    read_varint,
    tag,
    varint,
)

# A tensor smaller than this stays in the parsed skeleton: mapping it on every read
# would cost more than it saves.
MIN_LAZY_BYTES = 64 << 10

_GRAPH, _INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
_DATA_TYPE, _RAW_DATA, _DATA_LOCATION = 2, 9, 14  # TensorProto fields
# dims, data_type, name, raw_data, doc_string, and data_location when it says DEFAULT
# (``onnx.load`` writes it so where it read the data in; the lazy tensor drops it)
_PLAIN_TENSOR_FIELDS = {1, _DATA_TYPE, 8, _RAW_DATA, 12, _DATA_LOCATION}


@dataclass(frozen=True)
class _Slice:
    """Where a left-out ``raw_data`` lies in the file: the initializer's index in the
    graph and the offset and length of its bytes."""

    index: int
    offset: int
    length: int


class _Source:
    """The model file, open for reading as long as a lazy tensor may read it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


@dataclass
class ScannedModel:
    """A model file walked: ``skeleton`` is the model to parse, ``slices`` the bytes left
    in the file."""

    source: _Source
    skeleton: bytes
    slices: list[_Slice]

    def attach(self, proto: onnx.ModelProto, model: ir.Model) -> None:
        """Give each left-out initializer of ``model`` (deserialized from ``proto``, the
        parsed skeleton) a tensor that reads its bytes from the file."""
        for piece in self.slices:
            value = model.graph.initializers[proto.graph.initializer[piece.index].name]
            stripped = value.const_value
            assert stripped is not None
            value.const_value = _lazy_or_whole(self.source, piece, stripped)


def scan(path: str | os.PathLike, *, min_bytes: int = MIN_LAZY_BYTES) -> ScannedModel | None:
    """The model file at ``path`` walked, or None where reading it whole is the way:
    nothing to leave in the file, a layout this walk does not follow, a malformed file
    (protobuf's parser, run on the whole file, then says what is wrong), a big-endian
    machine (the bytes are little-endian), a text format."""
    text = onnx.serialization.registry.get_format_from_file_extension(Path(path).suffix)
    if sys.byteorder != "little" or text not in (None, "protobuf"):
        return None  # onnx.load reads a .json or .textproto file as text
    source = _Source(path)  # kept by the lazy tensors; closed when the last goes
    try:
        size = os.fstat(source.fileno()).st_size
        found = None
        if size >= min_bytes:
            with mmap.mmap(source.fileno(), size, access=mmap.ACCESS_READ) as buffer:
                found = _skeleton(buffer, size, min_bytes)
    except (Malformed, OSError, ValueError):
        found = None
    if found is None:
        source.close()
        return None
    skeleton, slices = found
    return ScannedModel(source, skeleton, slices)


def load_without_weights(path: str | os.PathLike) -> onnx.ModelProto:
    """The model file parsed without the bytes of its big weights (their tensors keep
    name, type and dims), for what reads only the graph; the whole file where ``scan``
    cannot walk it, and protobuf's errors as ``onnx.load`` raises them."""
    scanned = scan(path)
    if scanned is None:
        return onnx.load(os.fspath(path), load_external_data=False)
    scanned.source.close()
    return onnx.load_model_from_string(scanned.skeleton)


def _skeleton(buffer: mmap.mmap, size: int, min_bytes: int) -> tuple[bytes, list[_Slice]] | None:
    parts = list(fields(buffer, 0, size))
    graphs = [f for f in parts if f.number == _GRAPH and f.wire_type == LENGTH_DELIMITED]
    if len(graphs) != 1:  # no graph, or several that protobuf would merge
        return None
    graph_body, slices = _graph_without_weights(buffer, graphs[0], min_bytes)
    if not slices:
        return None
    out = bytearray()
    for field in parts:
        if field is graphs[0]:
            out += tag(_GRAPH, LENGTH_DELIMITED) + varint(len(graph_body)) + graph_body
        else:
            out += buffer[field.start : field.end]
    return bytes(out), slices


def _graph_without_weights(buffer: mmap.mmap, graph, min_bytes: int) -> tuple[bytes, list]:
    body = bytearray()
    slices: list[_Slice] = []
    index = 0
    for field in fields(buffer, graph.payload, graph.end):
        kept = None
        if field.number == _INITIALIZER and field.wire_type == LENGTH_DELIMITED:
            kept = _tensor_without_data(buffer, field, min_bytes)
            if kept is not None:
                tensor, offset, length = kept
                body += tag(_INITIALIZER, LENGTH_DELIMITED) + varint(len(tensor)) + tensor
                slices.append(_Slice(index, offset, length))
            index += 1
        if kept is None:
            body += buffer[field.start : field.end]
    return bytes(body), slices


def _tensor_without_data(buffer: mmap.mmap, field, min_bytes: int):
    """``(the tensor's fields but raw_data, raw_data's offset, its length)``, or None
    where the tensor is not plain or its data is small."""
    parts = list(fields(buffer, field.payload, field.end))
    raw = [f for f in parts if f.number == _RAW_DATA]
    if len(raw) != 1 or raw[0].wire_type != LENGTH_DELIMITED:
        return None
    if any(f.number not in _PLAIN_TENSOR_FIELDS for f in parts):
        return None
    if any(_varint(buffer, f) != 0 for f in parts if f.number == _DATA_LOCATION):
        return None
    types = [f for f in parts if f.number == _DATA_TYPE]
    if len(types) != 1 or not _byte_aligned(_varint(buffer, types[0])):
        return None
    length = raw[0].end - raw[0].payload
    if length < min_bytes:
        return None
    kept = b"".join(buffer[f.start : f.end] for f in parts if f is not raw[0])
    return kept, raw[0].payload, length


def _varint(buffer: mmap.mmap, field) -> int | None:
    if field.wire_type != VARINT:
        return None
    return read_varint(buffer, field.payload, field.end)[0]


def _byte_aligned(data_type: int | None) -> bool:
    """A numeric type of whole bytes, which numpy reads from the bytes as they lie (4-bit
    and smaller types are packed: they stay parsed)."""
    try:
        dtype = ir.DataType(data_type)
    except (ValueError, TypeError):
        return False
    if dtype in (ir.DataType.UNDEFINED, ir.DataType.STRING):
        return False
    return dtype.bitwidth % 8 == 0


def _lazy_or_whole(source: _Source, piece: _Slice, stripped: ir.TensorProtocol):
    if stripped.nbytes != piece.length:  # dims and bytes disagree: keep the tensor as written
        proto = onnx.TensorProto()
        proto.CopyFrom(stripped.raw)
        proto.raw_data = os.pread(source.fileno(), piece.length, piece.offset)
        return ir.serde.deserialize_tensor(proto)
    read = _FileRange(source, piece.offset, stripped.dtype, stripped.shape, stripped.size)
    return ir.LazyTensor(
        read, dtype=stripped.dtype, shape=stripped.shape,
        name=stripped.name, doc_string=stripped.doc_string,
    )  # fmt: skip


class _FileRange:
    """Reads a tensor's bytes from the open model file: a mapping of just its range (the
    address space stays the size of what is read), which lives as long as the array."""

    def __init__(
        self, source: _Source, offset: int, dtype: ir.DataType, shape: ir.Shape, count: int
    ) -> None:
        self.source = source
        self.offset = offset
        self.dtype = dtype
        self.shape = shape
        self.count = count

    def __call__(self) -> ir.Tensor:
        dtype = np.dtype(self.dtype.numpy())
        count = self.count
        start = self.offset - self.offset % mmap.ALLOCATIONGRANULARITY
        length = self.offset + count * dtype.itemsize - start
        mapped = mmap.mmap(self.source.fileno(), length, access=mmap.ACCESS_READ, offset=start)
        array = np.frombuffer(mapped, dtype=dtype, count=count, offset=self.offset - start)
        return ir.Tensor(array.reshape(self.shape.numpy()), dtype=self.dtype)
