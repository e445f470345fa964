"""The file onnxruntime reads a model from: the model's own, or a copy of a model in one
file with its weights in a data file.

onnxruntime parses a model in one file whole, weights included (protobuf copies every
byte), while it maps a data file: on the 0.27-1.01 GiB decoders of
``bench/bench_big_models.py`` a session of the one-file original added about 1.6x the
model over what stayed resident, one of the same model with a data file 1.0x (the
weights onnxruntime packs). So a model in one file whose weights ``fusion_core.onefile``
left in the file at load add up to ``MIN_COPY_BYTES`` or more is copied once, with its
weights in a data file, into a scratch folder the caller owns and removes: written from
the lazily loaded model one tensor at a time (``fusion_core.ir.save_model(...,
external_data=True)``), so the copy costs 1x the model on disk and nothing in memory.
It is the same model with the same bytes: onnxruntime runs the same kernels on the same
weights (prepacking applies alike). Smaller models keep their own file: no disk cost.

A copy that cannot be written (the disk full, a file size limit) is not an error: the
model's own file is used, as before, and a warning says what it costs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from autofusion.fusion_core.ir import load_model, save_model
from autofusion.fusion_core.onefile import scan

__all__ = ["MIN_COPY_BYTES", "session_file"]

logger = logging.getLogger(__name__)

# The weights left in one file from which a session reads a data-file copy instead
MIN_COPY_BYTES = 64 << 20


def session_file(
    path: str | os.PathLike, folder: str | os.PathLike, *, min_bytes: int | None = None
) -> Path:
    """The file a session of the model at ``path`` should read: ``path`` itself, or, for
    a model in one file whose big weights reach ``min_bytes`` (``MIN_COPY_BYTES`` when
    None), a copy in ``folder`` named as ``path`` with its weights in ``<name>.data``.

    Give only a file ``fusion_core.ir.load_model`` accepted (the copy is written from it
    and onnxruntime reads the original's external data where it lies)."""
    path = Path(path)
    limit = MIN_COPY_BYTES if min_bytes is None else min_bytes
    left_in = _weights_left_in(path)
    if not left_in or left_in < limit:
        return path
    copy = Path(folder) / path.name
    try:
        save_model(load_model(path), copy, external_data=True)
    except OSError as exc:
        for written in (copy, copy.with_name(copy.name + ".data")):
            written.unlink(missing_ok=True)
        logger.warning(
            "could not write a copy of %s with its weights in a data file (%s): onnxruntime "
            "parses the model in one file, which holds its weights once more while it loads",
            path,
            exc,
        )
        return path
    return copy


def _weights_left_in(path: Path) -> int:
    """The bytes of the weights a lazy load of ``path`` leaves in the file (0: a model
    with a data file, or one file that is read whole)."""
    scanned = scan(path)
    if scanned is None:
        return 0
    scanned.source.close()
    return sum(piece.length for piece in scanned.slices)
