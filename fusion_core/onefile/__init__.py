"""A model in one ONNX file at protobuf's wire level, for weights held once: read with
its big main-graph weights left in the file, each read when asked (``scan``, then
``ScannedModel.attach``), and written one initializer at a time (``write_model``).
``fusion_core.ir`` loads and saves through them; what reads only the graph of a file
(its size, the report's pictures) parses it without those weights
(``load_without_weights``)."""

from autofusion.fusion_core.onefile._read import (
    MIN_LAZY_BYTES,
    ScannedModel,
    load_without_weights,
    scan,
)
from autofusion.fusion_core.onefile._write import write_model

__all__ = ["MIN_LAZY_BYTES", "ScannedModel", "load_without_weights", "scan", "write_model"]
