"""What a model costs a deployment besides time: its size on disk and the memory
onnxruntime takes to load and run it.

* **Size** (``model_size``, ``serialized_size``): the bytes of the model file and of
  every external-data file it references (each file counted once, whole), as shipped.
  A fused model that was not written (its check failed) is measured by serializing it
  the way ``fusion_core.ir.save_model`` writes it, into a scratch folder.
* **Peak memory** (``measure_memory``): each model runs in a fresh Python process
  (``fusion_core/profiling/_memory_child.py``: numpy and onnxruntime only) that loads the inputs,
  then creates one onnxruntime session (``ORT_ENABLE_ALL``, the given providers and
  threads) and runs it a few times. The figure is the process's peak resident memory
  (VmHWM) over session creation and the runs, less its resident memory just before the
  session: what loading and serving the model adds to a process (the model read, the
  weights copied and pre-packed, the allocator's arena, activations), the same
  interpreter and inputs underneath both models. One process per model, so neither
  inherits the other's heap, and nothing in the calling process changes. The session
  reads the model's own file, a model in one file included (onnxruntime then parses it
  whole, as a deployment reading that file does), never the data-file copy the latency
  and the trace read (``validate.session_file``): the figure is the file's as shipped.

onnxruntime's own allocator peak (``fusion_core.profiling.MemoryStats``, from the
profiler's trace) is a different figure: only what passes through its CPU allocator
(activations, workspaces, pre-packed weights), not the weights held elsewhere or the
arena's slack. The report carries both.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from autofusion.fusion_core.errors import FusionError
from autofusion.fusion_core.ir import save_model
from autofusion.fusion_core.onefile import load_without_weights

__all__ = [
    "MEMORY_LEVEL",
    "MEMORY_RUNS",
    "MemoryComparison",
    "ModelSize",
    "ProcessMemory",
    "measure_memory",
    "model_size",
    "serialized_size",
]

logger = logging.getLogger(__name__)

MEMORY_LEVEL = "ORT_ENABLE_ALL"  # what a user deploying with onnxruntime gets
MEMORY_RUNS = 3
_CHILD = Path(__file__).with_name("_memory_child.py")
Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelSize:
    """A model's bytes on disk: its file plus the external-data files it references."""

    total_bytes: int
    external_data_bytes: int
    files: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def model_size(path: str | os.PathLike | None) -> ModelSize | None:
    """The size of the model at ``path`` with its external data; None when no such file.

    Only locations inside the model's folder count (``fusion_core.ir.load_model``
    refuses any other before a model gets this far).
    """
    if path is None or not Path(path).is_file():
        return None
    path = Path(path)
    data_files = _external_files(path)
    external = sum(f.stat().st_size for f in data_files)
    return ModelSize(path.stat().st_size + external, external, 1 + len(data_files))


def serialized_size(model: ir.Model, *, external_data: bool = False) -> ModelSize:
    """The size ``model`` has once saved by ``fusion_core.ir.save_model`` (weights still
    read lazily from a source folder are written out whole, as saving does), in one file
    or with its weights in a data file (``external_data``), as ``run`` would save it."""
    with tempfile.TemporaryDirectory(prefix="autofusion-size-") as scratch:
        written = save_model(model, Path(scratch) / "model.onnx", external_data=external_data)
        sizes = [p.stat().st_size for p in written]
    return ModelSize(sum(sizes), sum(sizes[1:]), len(sizes))


def _external_files(path: Path) -> list[Path]:
    try:
        proto = load_without_weights(path)  # the locations only: a big file is not parsed whole
    except (OSError, ValueError, DecodeError):
        return []  # not a model: its own bytes are all there is to count
    root = path.parent.resolve()
    files = []
    for location in sorted({_location(t) for t in _tensors(proto)} - {None}):
        target = (root / location).resolve()
        if target.is_relative_to(root) and target.is_file() and target not in files:
            files.append(target)
    return files


def _location(tensor: onnx.TensorProto) -> str | None:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    entries = {e.key: e.value for e in tensor.external_data}
    return entries.get("location") or None


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for graph in attr.graphs:
            yield from _graph_tensors(graph)


@dataclass(frozen=True)
class ProcessMemory:
    """One model's memory in its own process (module doc), bytes; ``error`` instead
    when it could not be measured (the figures are then None)."""

    peak_bytes: int | None = None
    session_bytes: int | None = None  # the peak while the session was created
    resident_bytes: int | None = None  # still resident after the runs
    baseline_bytes: int | None = None  # the process before the session (not counted)
    method: str | None = None  # VmHWM (reset before the session) or ru_maxrss
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryComparison:
    """The original's and the fused model's ``ProcessMemory``, measured alike."""

    level: str
    providers: tuple[str, ...]
    threads: int
    runs: int
    original: ProcessMemory
    fused: ProcessMemory | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "providers": list(self.providers),
            "threads": self.threads,
            "runs": self.runs,
            "original": self.original.to_dict(),
            "fused": self.fused.to_dict() if self.fused is not None else None,
        }


def measure_memory(
    original: str | os.PathLike,
    fused: str | os.PathLike | None = None,
    *,
    feeds: Feeds | None = None,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    threads: int = 1,
    providers: tuple[str, ...] = ("CPUExecutionProvider",),
    runs: int = MEMORY_RUNS,
    timeout_s: float = 600.0,
) -> MemoryComparison:
    """Peak memory of the model file(s), one fresh process each, one after the other.

    Inputs are ``feeds``, else generated as the profile generates them (``seed``,
    ``dims``). A model that cannot be measured (its process fails, is killed or runs
    past ``timeout_s``, or its inputs cannot be passed to a process: object arrays) gets a
    ``ProcessMemory`` with the reason: this never raises for the model's sake.
    """
    paths = {"original": original} | ({"fused": fused} if fused is not None else {})
    with tempfile.TemporaryDirectory(prefix="autofusion-memory-") as scratch:
        try:
            files = _save_feeds(feeds or _generated(original, seed, dims), Path(scratch))
        except (OSError, ValueError, DecodeError, FusionError) as exc:
            reason = f"no inputs to give it: {exc}"
            measured = {label: _failed(label, reason) for label in paths}
        else:
            request = {
                "feeds": files,
                "level": MEMORY_LEVEL,
                "threads": threads,
                "providers": list(providers),
                "runs": runs,
            }
            measured = {
                label: _measure_one(request | {"model": os.fspath(path)}, label, timeout_s)
                for label, path in paths.items()
            }
    return MemoryComparison(
        MEMORY_LEVEL, tuple(providers), threads, runs, measured["original"], measured.get("fused")
    )


def _generated(original: str | os.PathLike, seed: int, dims: Mapping[str, int] | None) -> Feeds:
    from autofusion.fusion_core.validate import random_inputs

    # the graph is all the inputs need: a model in one file is not parsed whole here
    return random_inputs(load_without_weights(original), seed=seed, dims=dict(dims or {}))


def _save_feeds(feeds: Feeds, folder: Path) -> dict[str, str]:
    """Each input in its own ``.npy`` file (any input name works, unlike ``np.savez``
    keywords); input name -> file."""
    files = {}
    for index, (name, value) in enumerate(feeds.items()):
        files[name] = str(folder / f"input{index}.npy")
        np.save(files[name], np.asarray(value), allow_pickle=False)
    return files


def _measure_one(request: dict[str, Any], label: str, timeout_s: float) -> ProcessMemory:
    command = [sys.executable, "-P", str(_CHILD), json.dumps(request)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _failed(label, f"took more than {timeout_s:.0f} s")
    except OSError as exc:
        return _failed(label, f"could not start a Python process: {exc}")
    answer = _last_json(done.stdout)
    if done.returncode < 0:
        return _failed(label, f"its process was killed by signal {-done.returncode}")
    if "error" in answer or done.returncode != 0:
        reason = answer.get("error") or _last_line(done.stderr) or f"exit {done.returncode}"
        return _failed(label, str(reason))
    fields = ("peak_bytes", "session_bytes", "resident_bytes", "baseline_bytes", "method")
    return ProcessMemory(**{k: answer.get(k) for k in fields})


def _failed(label: str, reason: str) -> ProcessMemory:
    logger.warning("could not measure the memory of the %s model: %s", label, reason)
    return ProcessMemory(error=f"could not measure the {label} model's memory: {reason}")


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
