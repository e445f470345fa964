"""Checks of a model's tensor data without reading it (part of ``model_checks``).

External data: the location (a plain uploaded file, no link, no climbing out), the
entries (only ``location``, ``offset``, ``length``, ``checksum``, each once) and the
range (inside the file, of the size the tensor needs). Data stored in the model: its
size (``raw_data`` bytes or the typed field's count) against the dims and data type.
Text: every string field of the model is UTF-8 (``check_text_fields``). Every refusal is
a 422 ProblemError.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import TensorProto

from autofusion.app.core.errors import ProblemError

__all__ = [
    "check_external",
    "check_stored_size",
    "check_text_fields",
    "element_count",
    "invalid_model",
    "not_text",
    "text_of",
    "unsafe",
]

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


def text_of(value: str | bytes, what: str) -> str:
    """``value`` as text: protobuf hands out a string field that is not UTF-8 as bytes."""
    if isinstance(value, bytes):
        raise invalid_model(
            f"{what} is not valid UTF-8 text ({value[:40]!r}); export the model again"
        )
    return value


# A field's place in the model: (parent place, field name, index or None), () at the top.
_Place = tuple


def check_text_fields(model: onnx.ModelProto) -> None:
    """Refuse the model when any string field, at any depth, is not UTF-8 text.

    ONNX's schema is proto2, and protobuf's parser keeps such a field as bytes instead of
    refusing the file; the job would then fail deep in the optimizer (onnx-ir cannot
    write the field back) as an internal error. The walk goes by the schema, every field
    that is set, so a doc string, a metadata entry or a field a later ONNX adds is
    covered as well as the names the other checks read.
    """
    pending: list[tuple[Message, _Place]] = [(model, ())]
    while pending:  # iterative: subgraphs nest as deep as protobuf allows
        message, place = pending.pop()
        for descriptor, value in message.ListFields():
            repeated = _is_repeated(descriptor)
            if descriptor.type == FieldDescriptor.TYPE_STRING:
                values = enumerate(value) if repeated else [(None, value)]
                for index, text in values:
                    if isinstance(text, bytes):
                        raise _not_text((place, descriptor.name, index), text)
            elif descriptor.type == FieldDescriptor.TYPE_MESSAGE:
                if repeated:
                    pending.extend((m, (place, descriptor.name, i)) for i, m in enumerate(value))
                else:
                    pending.append((value, (place, descriptor.name, None)))


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    # protobuf 6 added ``is_repeated`` and later releases dropped ``label``.
    if hasattr(descriptor, "is_repeated"):
        return descriptor.is_repeated
    return descriptor.label == FieldDescriptor.LABEL_REPEATED


def _not_text(place: _Place, value: bytes) -> ProblemError:
    parts = []
    while place:
        place, name, index = place
        parts.append(name if index is None else f"{name}[{index}]")
    return not_text(".".join(reversed(parts)), value)


def not_text(field: str, value: bytes | None = None) -> ProblemError:
    """The 422 for a string field of the model that is not UTF-8 (``at``: the field)."""
    start = f" (it starts {value[:40]!r})" if value is not None else ""
    return ProblemError(
        422,
        "invalid-model",
        "Invalid model",
        f"the model's field {field} is not valid UTF-8 text{start}; fix that string where "
        "the model is made (onnx.save writes only UTF-8) and export the model again",
        at=field,
    )


def invalid_model(detail: str) -> ProblemError:
    return ProblemError(422, "invalid-model", "Invalid model", detail)


def unsafe(detail: str, where: str) -> ProblemError:
    return ProblemError(
        422,
        "unsafe-external-data",
        "Unsafe external data",
        f"{detail} ({_LOCATION_HINT})",
        at=where,
    )


def element_count(dims: Iterable[int], where: str) -> int:
    """The product of ``dims``; stops multiplying once it is absurd (dims may be huge)."""
    dims = list(dims)
    if any(d < 0 for d in dims):
        raise invalid_model(f"{where} declares a negative dimension {dims[:16]}")
    if 0 in dims:
        return 0
    count = 1
    for d in dims:
        count *= d
        if count > 1 << 64:
            break
    return count


def check_external(tensor: TensorProto, where: str, folder: Path, data_names: set[str]) -> None:
    info = _external_entries(tensor, where)
    location = info.get("location", "")
    try:
        path = _check_location(location, where, folder, data_names)
        size = path.stat().st_size
    except (OSError, ValueError):  # a NUL byte, a name too long for the file system
        raise unsafe(
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
        raise unsafe(
            f"external data of {where} ({location!r}, offset {offset}, length {length}) runs "
            f"past the end of the file ({size} bytes)",
            where,
        )


def _external_entries(tensor: TensorProto, where: str) -> dict[str, str]:
    """The external-data entries as a mapping: known keys only, each at most once (onnx's
    own loader sets any key as an attribute, ``basepath`` and ``__class__`` included)."""
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        key = text_of(entry.key, f"an external-data key of {where}")
        if key not in _EXTERNAL_KEYS:
            raise unsafe(
                f"{where} has an external-data entry {key[:80]!r}; only "
                f"{', '.join(_EXTERNAL_KEYS)} are allowed",
                where,
            )
        if key in info:
            raise unsafe(f"{where} gives the external-data entry {key!r} twice", where)
        info[key] = text_of(entry.value, f"the external-data {key} of {where}")
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


def check_stored_size(tensor: TensorProto, where: str) -> None:
    """The data stored inside the model (``raw_data`` or the typed field) has exactly the
    size the dims and data type say: a runtime reads past a short buffer otherwise."""
    if tensor.HasField("raw_data"):
        if tensor.data_type == TensorProto.STRING:
            raise invalid_model(f"{where} is a string tensor with raw_data, which ONNX forbids")
        needed, stored = _nbytes(tensor, where), len(tensor.raw_data)
        if stored != needed:
            raise _size_mismatch(tensor, where, needed, f"{stored} bytes of raw_data")
        return
    count = element_count(tensor.dims, where)
    try:
        typed = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    except (KeyError, ValueError):
        if count == 0:
            return
        raise invalid_model(f"{where} has an unknown data type {tensor.data_type}") from None
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
        return element_count(tensor.dims, where)
    return _nbytes(tensor, where)


def _check_location(location: str, where: str, folder: Path, data_names: set[str]) -> Path:
    if location.strip() in ("", "."):
        raise unsafe(f"{where} has an empty external-data location", where)
    if _is_runtime_marker(location):
        raise unsafe(
            f"{where} refers to external data at {location!r}, named like the markers "
            f"onnxruntime reserves ({_MARKER_MEANING}); rename the data file",
            where,
        )
    windows = PureWindowsPath(location)
    if location.startswith(("/", "\\")) or windows.is_absolute() or windows.drive:
        raise unsafe(f"{where} refers to external data at absolute path {location!r}", where)
    parts = PurePosixPath(location).parts
    if ".." in parts or "\\" in location:
        raise unsafe(f"{where} refers to external data outside the upload: {location!r}", where)
    # Uploaded parts are regular files, but the location may still name a link that
    # something else put in the folder: look at each component without following it.
    current = folder
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise unsafe(f"{where} refers to external data through a symlink: {location!r}", where)
    if "/".join(parts) not in data_names or not current.is_file():
        raise unsafe(
            f"{where} refers to external data {location!r}, which is not one of the uploaded "
            f"data files {sorted(data_names)}",
            where,
        )
    if current.stat().st_nlink > 1:
        raise unsafe(f"external-data file {location!r} of {where} is a hard link", where)
    if not current.resolve().is_relative_to(folder.resolve()):
        raise unsafe(f"{where} refers to external data outside the upload: {location!r}", where)
    return current


# onnxruntime reads some locations as something other than a file: "*/_ORT_MEM_ADDR_/*"
# and "*/_ORT_NATIVE_ENDIAN_MEM_ADDR_/*" make it read the tensor from the memory address
# in ``offset`` (core/framework/tensorprotoutils.h, kTensorProtoMemoryAddressTag). Any
# part named like its markers is refused, so a marker a later release adds is too.
_MARKER_PREFIX = "_ORT_"
_MARKER_MEANING = "it reads */_ORT_MEM_ADDR_/* as a memory address, not a file"


def _is_runtime_marker(location: str) -> bool:
    parts = location.replace("\\", "/").split("/")
    return any(part.strip().upper().startswith(_MARKER_PREFIX) for part in parts)


def _int_entry(info: dict[str, str], key: str, where: str) -> int | None:
    if key not in info:
        return None
    try:
        value = int(info[key])
    except ValueError:
        raise invalid_model(
            f"{where} has a non-integer external-data {key} {info[key]!r}"
        ) from None
    if value < 0:
        raise invalid_model(f"{where} has a negative external-data {key} {value}")
    return value


def _nbytes(tensor: TensorProto, where: str) -> int:
    count = element_count(tensor.dims, where)
    if tensor.data_type in _PACKED_BITS:
        return math.ceil(count * _PACKED_BITS[tensor.data_type] / 8)
    if tensor.data_type == TensorProto.STRING:
        raise invalid_model(f"{where} is a string tensor, which cannot use external data")
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, ValueError, TypeError):
        raise invalid_model(f"{where} has an unknown data type {tensor.data_type}") from None
    return count * itemsize
