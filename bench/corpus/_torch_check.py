"""Check an exported corpus file against its framework's outputs, and describe it.

Why: a corpus model is only useful if it is a faithful export. Each file is checked
with ``onnx.checker`` (full check) and run in onnxruntime with every graph
optimization disabled, so that what is compared is the exporter's graph, not
onnxruntime's rewrite of it, against the outputs torch computed on the same inputs.
A file that fails is not written to the corpus.

No torch here: ``export_yolo.py`` and the optimum export run torch in a side
environment that saves its inputs and outputs, and the check runs in the main one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort


class ExportCheckError(RuntimeError):
    """An exported file that does not reproduce torch; the message says where."""


# What a failed export or check raises (torch's exporter errors are RuntimeErrors; OSError:
# a file a side venv did not write).
EXPORT_ERRORS = (
    ExportCheckError,
    OSError,
    RuntimeError,
    ValueError,
    TypeError,
    onnx.checker.ValidationError,
)


class ExportLog:
    """The exporters' bookkeeping: each model written or failed, logged the same way, and
    one SystemExit naming the failures at the end."""

    def __init__(self, tool: str) -> None:
        self.tool, self.log = tool, logging.getLogger(tool)
        self.written: list[str] = []
        self.failed: list[str] = []

    def failure(self, name: str, err: BaseException) -> None:
        self.failed.append(name)
        text = str(err).strip()
        first = text.splitlines()[0][:300] if text else ""
        self.log.error("%s: not exported: %s: %s", name, type(err).__name__, first)

    def wrote(self, name: str, entry, start: float) -> None:
        """``entry``: the model's meta entry; ``start``: its perf_counter start."""
        self.written.append(name)
        elapsed = time.perf_counter() - start
        kib = entry.size_bytes / 1024
        self.log.info("%s: %d nodes, %.0f KiB, %.1f s", name, entry.node_count, kib, elapsed)

    def done(self) -> list[str]:
        if self.failed:
            count, names = len(self.failed), ", ".join(self.failed)
            raise SystemExit(f"{self.tool}: {count} model(s) failed: {names}")
        return self.written


def session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def compare(name: str, got: np.ndarray, expected: np.ndarray, *, atol: float, rtol: float) -> float:
    """Max abs diff of one output; raises when |got - expected| > atol + rtol * |expected|."""
    if got.shape != expected.shape:
        raise ExportCheckError(f"{name}: onnxruntime shape {got.shape}, torch {expected.shape}")
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    bound = atol + rtol * np.abs(expected.astype(np.float64))
    if not np.all(diff <= bound):  # also catches NaN
        worst = float(np.nanmax(diff)) if np.isfinite(diff).any() else float("nan")
        raise ExportCheckError(
            f"{name}: onnxruntime differs from torch (max abs diff {worst:.3g}, "
            f"atol {atol}, rtol {rtol})"
        )
    return float(diff.max()) if diff.size else 0.0


def check_outputs(
    path: Path,
    cases: list[tuple[dict[str, np.ndarray], list[np.ndarray]]],
    *,
    atol: float,
    rtol: float,
) -> float:
    """Run each (feeds, expected outputs) case; the max abs diff over all of them."""
    sess = session(path)
    worst = 0.0
    for feeds, expected in cases:
        got = sess.run(None, feeds)
        if len(got) < len(expected):
            raise ExportCheckError(f"{path}: {len(got)} outputs, torch gave {len(expected)}")
        names = [o.name for o in sess.get_outputs()][: len(expected)]
        for name, out, ref in zip(names, got[: len(expected)], expected, strict=True):
            label = f"{path.parent.name}/{name} at {_shapes(feeds)}"
            worst = max(worst, compare(label, out, ref, atol=atol, rtol=rtol))
    return worst


def check_file(path: Path) -> None:
    """onnx.checker with the full check (shape inference included); no external data."""
    if any(p.name.startswith(path.name) and p != path for p in path.parent.iterdir()):
        raise ExportCheckError(f"{path}: a side file (external data?) beside the model")
    onnx.checker.check_model(str(path), full_check=True)


def _shapes(feeds: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())
