"""The multipart form of an upload, part by part: python-multipart's callbacks write file
parts straight to disk in the upload folder and hold only small text parts (``config``
and the fields a caller names) in memory, bounded to ``MAX_CONFIG_BYTES``.

Also the upload's problems (422 invalid upload or config, 413 too large), which the other
steps raise too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.multipart import parse_options_header

from autofusion.app.core.errors import ProblemError

__all__ = [
    "CONFIG_FIELD",
    "DATA_FIELD",
    "DATA_UPLOAD_FIELD",
    "MAX_CONFIG_BYTES",
    "MAX_DATA_FILES",
    "MODEL_FIELD",
    "FormWriter",
    "Upload",
    "bad_upload",
    "check_file_name",
    "invalid_config",
    "too_large",
]

MODEL_FIELD, DATA_FIELD, CONFIG_FIELD = "model", "data", "config"
# The id of a complete data upload (POST /v1/uploads), repeatable: the file joins the
# job's data files under the upload's name, as if sent as a 'data' part.
DATA_UPLOAD_FIELD = "data_upload"
MAX_UPLOAD_ID_BYTES = 200
DEFAULT_MODEL_NAME = "model.onnx"
MAX_CONFIG_BYTES = 1 << 20
MAX_DATA_FILES = 1000
MAX_NAME_LENGTH = 255


@dataclass
class Upload:
    """What ``receive_upload`` wrote: the model and data files, by name, in ``folder``."""

    folder: Path
    model_name: str | None = None
    data_names: list[str] = field(default_factory=list)
    # The 'data_upload' fields, in order (ids of data uploads, not checked yet).
    data_uploads: list[str] = field(default_factory=list)
    config_text: str | None = None
    # Small text parts a caller asked for by name (the dashboard's form fields).
    fields: dict[str, str] = field(default_factory=dict)
    # Whose slots its work takes: its tenant, or on a server without keys its client's
    # address (``_receive._slot_owner``).
    owner: str | None = None

    @property
    def model_path(self) -> Path:
        return self.folder / (self.model_name or DEFAULT_MODEL_NAME)


def bad_upload(detail: str, field_name: str | None = None) -> ProblemError:
    extra = {"field": field_name} if field_name else {}
    return ProblemError(422, "invalid-upload", "Invalid upload", detail, **extra)


def too_large(detail: str, limit: int) -> ProblemError:
    return ProblemError(413, "payload-too-large", "Payload too large", detail, limit=limit)


def invalid_config(field_name: str, message: str) -> ProblemError:
    return ProblemError(
        422,
        "invalid-config",
        "Invalid config",
        f"{field_name}: {message}",
        errors=[{"field": field_name, "message": message}],
    )


def check_file_name(name: str, field_name: str, *, what: str | None = None) -> str:
    """A plain file name: no path separators, not ``.``/``..``, no control characters.
    ``what`` names it in the refusal (default: the file name of a ``field_name`` part)."""
    if (
        not name
        or name in (".", "..")
        or len(name) > MAX_NAME_LENGTH
        or any(c in name for c in "/\\:")
        or any(ord(c) < 32 for c in name)
    ):
        what = what or f"the file name {name!r} of a {field_name!r} part"
        raise bad_upload(
            f"{what} is not a plain file name "
            "(no '/', '\\', ':', '..' or control characters, at most 255 characters)",
            field_name,
        )
    return name


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class FormWriter:
    """python-multipart callbacks: file parts go to disk as they arrive, ``config`` to a
    bounded buffer; anything unexpected stops the upload with a problem."""

    def __init__(
        self,
        upload: Upload,
        text_fields: frozenset[str] = frozenset(),
        *,
        data_uploads: bool = False,
    ) -> None:
        self.upload = upload
        self.text_fields = text_fields
        self.data_uploads = data_uploads  # 'data_upload' fields are taken
        self._text: bytearray | None = None
        self.finished = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._field: str | None = None
        self._file: BinaryIO | None = None
        self._config: bytearray | None = None
        self._names: set[str] = set()

    def callbacks(self) -> dict:
        return {
            name: getattr(self, name)
            for name in (
                "on_part_begin",
                "on_part_data",
                "on_part_end",
                "on_header_field",
                "on_header_value",
                "on_header_end",
                "on_headers_finished",
                "on_end",
            )
        }

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def on_part_begin(self) -> None:
        self._disposition, self._field = b"", None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if bytes(self._header_name).strip().lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name, self._header_value = bytearray(), bytearray()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise bad_upload("every part needs a Content-Disposition header with a name")
        self._field = _decode(options[b"name"])
        filename = _decode(options[b"filename"]) if b"filename" in options else None
        if self._field == MODEL_FIELD:
            if self.upload.model_name is not None:
                raise bad_upload("send exactly one 'model' part", MODEL_FIELD)
            self.upload.model_name = self._open(filename or DEFAULT_MODEL_NAME, MODEL_FIELD)
        elif self._field == DATA_FIELD and filename == "":
            pass  # a browser's file input left empty: a part of no file, skipped
        elif self._field == DATA_FIELD:
            if filename is None:
                raise bad_upload(
                    "each 'data' part needs a filename: the name external-data locations use",
                    DATA_FIELD,
                )
            if len(self.upload.data_names) + len(self.upload.data_uploads) >= MAX_DATA_FILES:
                raise bad_upload(f"at most {MAX_DATA_FILES} data files", DATA_FIELD)
            self.upload.data_names.append(self._open(filename, DATA_FIELD))
        elif self._field == DATA_UPLOAD_FIELD and self.data_uploads and filename is None:
            if len(self.upload.data_names) + len(self.upload.data_uploads) >= MAX_DATA_FILES:
                raise bad_upload(f"at most {MAX_DATA_FILES} data files", DATA_UPLOAD_FIELD)
            self._text = bytearray()
        elif self._field == CONFIG_FIELD:
            if self._config is not None:
                raise bad_upload("send at most one 'config' part", CONFIG_FIELD)
            self._config = bytearray()
        elif self._field in self.text_fields and filename is None:
            if self._field in self.upload.fields:
                raise bad_upload(f"send at most one {self._field!r} part", self._field)
            self._text = bytearray()
        else:
            expected = "'model', 'data', 'data_upload' or 'config'"
            if not self.data_uploads:
                expected = "'model', 'data' or 'config'"
            raise bad_upload(
                f"unknown form field {self._field!r}; expected {expected}", self._field
            )

    def _open(self, name: str, field_name: str) -> str:
        check_file_name(name, field_name)
        if name in self._names:
            raise bad_upload(f"two parts are named {name!r}; file names must differ", field_name)
        self._names.add(name)
        # "xb": a fresh folder holds only what we write, never a link planted beforehand.
        self._file = open(self.upload.folder / name, "xb")  # noqa: SIM115 (closed in on_part_end)
        return name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None:
            self._file.write(data[start:end])
        elif self._text is not None:
            too_long = len(self._text) + (end - start) > MAX_UPLOAD_ID_BYTES
            if self._field == DATA_UPLOAD_FIELD and too_long:
                raise bad_upload(
                    "a 'data_upload' field holds the id of one data upload (POST /v1/uploads)",
                    DATA_UPLOAD_FIELD,
                )
            if len(self._text) + (end - start) > MAX_CONFIG_BYTES:
                raise too_large(
                    f"the {self._field!r} part exceeds {MAX_CONFIG_BYTES} bytes", MAX_CONFIG_BYTES
                )
            self._text += data[start:end]
        elif self._config is not None and self._field == CONFIG_FIELD:
            if len(self._config) + (end - start) > MAX_CONFIG_BYTES:
                raise too_large(
                    f"the 'config' part exceeds {MAX_CONFIG_BYTES} bytes", MAX_CONFIG_BYTES
                )
            self._config += data[start:end]

    def on_part_end(self) -> None:
        if self._file is not None:
            self.close()
        elif self._text is not None and self._field == DATA_UPLOAD_FIELD:
            self.upload.data_uploads.append(_decode(bytes(self._text)).strip())
            self._text = None
        elif self._text is not None:
            self.upload.fields[self._field] = _decode(bytes(self._text))
            self._text = None
        elif self._field == CONFIG_FIELD and self._config is not None:
            try:
                self.upload.config_text = bytes(self._config).decode("utf-8")
            except UnicodeDecodeError:
                raise invalid_config("config", "the config is not UTF-8 text") from None

    def on_end(self) -> None:
        self.finished = True
