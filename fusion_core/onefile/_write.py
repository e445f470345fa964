"""A model written to one file one initializer at a time.

``ir.save`` converts the whole model to a ModelProto (every weight copied into it) and
serializes that to one byte string before writing: 2 copies of the weights besides the
model's own. Protobuf's wire format lets the file be written in parts instead, since a
parser takes a message's fields in any order and merges a repeated field's entries in the
order they come: the model's fields but ``graph``; then ``graph`` (field 7), whose bytes
are the graph's fields but its initializers followed by each initializer (field 5), one
tensor at a time: its proto without ``raw_data``, then ``raw_data`` (field 9) written
from the tensor itself (``tofile``: from its array, from its mapping of the source file,
or copied file to file by the kernel for one in a data file), so no proto and no byte
string holds its bytes. A length-delimited field needs its length first: each
initializer's is known before its bytes are read (the proto's size plus ``nbytes``), so
the graph's is too. The file parses to the model ``ir.save`` writes, field for field;
only the order of fields on disk differs. Tensors of strings and those parsed from a
proto (their data may be in typed fields) go as ``ir.serde.serialize_tensor`` makes
them, one at a time.

Subgraphs (If/Loop/Scan bodies) and functions go with the skeleton as they are: they
rarely hold big weights. The file is written beside the destination and moved over it
when complete, so a reader of the old file (a lazy tensor of the model being saved, see
``_read``) never sees it change.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.onefile._wire import LENGTH_DELIMITED, delimited_size, tag, varint

_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9  # ModelProto.graph, GraphProto.initializer, raw_data


def write_model(model: ir.Model, path: str | os.PathLike) -> None:
    """Write ``model`` to ``path`` as one ONNX file, holding at most one initializer of
    its main graph in memory at a time. Tensors still lazily read from a data file
    (``ir.ExternalTensor``) are written with their bytes, as if read in; those of
    subgraphs and attributes must be in memory already (``ir.save``'s rule too)."""
    path = Path(path)
    values = [v for v in model.graph.initializers.values() if v.const_value is not None]
    head, graph_body, has_graph = _skeleton(model, values)
    parts = [_part(value) for value in values]
    graph_size = len(graph_body) + sum(delimited_size(_INITIALIZER, p.size) for p in parts)
    scratch = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        with open(scratch, "xb") as out:
            out.write(head)
            if has_graph or values:
                out.write(tag(_GRAPH, LENGTH_DELIMITED) + varint(graph_size) + graph_body)
            for part in parts:
                out.write(tag(_INITIALIZER, LENGTH_DELIMITED) + varint(part.size))
                _write_tensor(out, part)
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def _skeleton(model: ir.Model, values: list[ir.Value]) -> tuple[bytes, bytes, bool]:
    """The model's bytes but its graph, the graph's bytes but its initializers, and
    whether the proto has a graph. The initializers stand in as empty tensors while the
    proto is made (their value infos and annotations are the graph's, as ``ir.save``
    writes them), then are cleared from it."""
    tensors = [value.const_value for value in values]
    try:
        for value in values:
            value.const_value = ir.Tensor(np.zeros(0, np.uint8))
        proto = ir.to_proto(model)
    finally:
        for value, tensor in zip(values, tensors, strict=True):
            value.const_value = tensor
    proto.graph.ClearField("initializer")
    has_graph = proto.HasField("graph")
    graph_body = proto.graph.SerializeToString()
    proto.ClearField("graph")
    return proto.SerializeToString(), graph_body, has_graph


class _Part(NamedTuple):
    tensor: ir.TensorProtocol  # the value's tensor, named as the value
    head: bytes | None  # its proto without raw_data; None: serialized whole
    size: int  # of the serialized tensor
    read_in: bool  # a data file's tensor written as its array reads (see ``_part``)


def _part(value: ir.Value) -> _Part:
    tensor = value.const_value
    assert tensor is not None
    tensor.name = value.name  # as ``ir.save`` names it
    if isinstance(tensor, ir.StringTensor | ir.serde.TensorProtoTensor):  # typed fields
        return _Part(tensor, None, ir.serde.serialize_tensor(tensor).ByteSize(), False)
    external = isinstance(tensor, ir.ExternalTensor)
    if external:  # as ``ir.external_data.load_to_model`` reads it in: name and type only
        fields = {"name": tensor.name}
    else:
        fields = {"name": tensor.name, "doc_string": tensor.doc_string,
                  "metadata_props": dict(tensor.metadata_props)}  # fmt: skip
    shell = ir.LazyTensor(_no_bytes, dtype=tensor.dtype, shape=tensor.shape, **fields)
    proto = ir.serde.serialize_tensor(shell)
    proto.ClearField("raw_data")
    head = proto.SerializeToString()
    # A data file's bytes are copied as they lie, but for a packed type (4 bits and
    # less: its padding is rewritten) or a ``length`` other than the dims say (numpy
    # reads ``nbytes``): those are read in as their array, as they were before.
    read_in = external and (
        tensor.dtype.bitwidth % 8 != 0 or tensor.length not in (None, tensor.nbytes)
    )
    return _Part(tensor, head, len(head) + delimited_size(_RAW_DATA, tensor.nbytes), read_in)


def _write_tensor(out, part: _Part) -> None:
    start = out.tell()
    if part.head is None:
        out.write(ir.serde.serialize_tensor(part.tensor).SerializeToString())
    else:
        out.write(part.head + tag(_RAW_DATA, LENGTH_DELIMITED) + varint(part.tensor.nbytes))
        if part.read_in:  # as ``load_to_model`` reads it: its array, as a tensor of its type
            source = part.tensor
            out.write(ir.Tensor(source.numpy(), dtype=source.dtype).tobytes())
            source.release()  # the array above is gone: its mapping can close
        else:  # from its array, its mapping of the source, or file to file by the kernel
            part.tensor.tofile(out)
    written = out.tell() - start
    if written != part.size:  # the graph's length is written: a wrong size corrupts it
        raise RuntimeError(
            f"tensor {part.tensor.name!r} took {written} bytes, {part.size} were expected"
        )


def _no_bytes() -> ir.Tensor:
    return ir.Tensor(np.zeros(0, np.uint8))
