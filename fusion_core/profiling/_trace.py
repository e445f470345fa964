"""Running onnxruntime for profiling, and reading its own profiler trace: where the time
and the memory of a run go.

Sessions are made here for every measurement (``make_session``), so that latency runs and
traced runs share the same settings: fixed intra-op threads, no thread spinning, one
inter-op thread.

With ``SessionOptions.enable_profiling`` onnxruntime writes a Chrome-trace JSON file.
Every kernel execution is one event with ``"cat": "Node"``, a name
``"<node name>_kernel_time"`` and ``"dur"`` in microseconds; ``args`` carry the op type
(``op_name``), tensor sizes and the CPU allocator's statistics. Every ``Session.run`` is
one ``"model_run"`` event whose time window contains its kernels: that is how warm-up
runs are told apart and dropped, since onnxruntime cannot start profiling after the
session is created.

The profiler slows every kernel down by a few microseconds (it records shapes and
allocator statistics around each one), so trace times are for a breakdown, relative to
one another; the latency of a model comes from untraced runs. ``traced_run_us`` (the
median duration of a traced run) next to that latency shows how large the overhead is.

Node names are onnxruntime's: the model's own name for a named node; for an unnamed
node, or a node inlined from a model-local function, a name onnxruntime made up (such
names are not in the model, so records built on them cannot be mapped back to it).
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from autofusion.fusion_core.errors import ConfigError, ModelLoadError
from autofusion.fusion_core.ir import PROTOBUF_LIMIT_BYTES, load_model, save_model
from autofusion.fusion_core.onefile import load_without_weights
from autofusion.fusion_core.validate import session_file

__all__ = [
    "MemoryStats",
    "NodeProfile",
    "NodeTime",
    "OpTypeTime",
    "PreparedModel",
    "inputs_for",
    "make_session",
    "parse_trace",
    "prepare_model",
    "read_trace",
    "session_options",
    "timed_run",
]

KERNEL_SUFFIX = "_kernel_time"
Feeds = dict[str, np.ndarray]


class _KernelTotal:
    """``count`` kernel runs that took ``total_us`` in all (µs, as the trace reports)."""

    count: int
    total_us: float

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)  # type: ignore[call-overload]
        return data | {"total_us": float(self.total_us), "mean_us": float(self.mean_us)}


@dataclass(frozen=True)
class NodeTime(_KernelTotal):
    """One node's kernel time over the kept runs."""

    name: str
    op_type: str
    count: int
    total_us: float


@dataclass(frozen=True)
class OpTypeTime(_KernelTotal):
    """The sum of the node times of one op type: ``nodes`` distinct nodes ran ``count``
    kernels in all."""

    op_type: str
    nodes: int
    count: int
    total_us: float


@dataclass(frozen=True)
class MemoryStats:
    """Memory as onnxruntime's own allocator saw it, from the trace.

    * ``allocator_peak_bytes``: the high-water mark of bytes in use in the session's
      CPU allocator (trace ``mem_in_use_peak``) over all runs, warm-up included. It
      holds activations, kernel workspaces, outputs and the weights onnxruntime
      pre-packs or copies into it; it is not the process's resident memory (Python,
      the onnxruntime library and weights kept outside the allocator are not in it).
      This is the figure to compare between an original and a fused model.
    * ``arena_held_bytes``: what the CPU arena reserved from the system at most
      (``mem_arena_held``): the peak rounded up to the arena's chunk growth.
    * ``largest_node_io_bytes``: the largest sum of one kernel's non-weight inputs and
      outputs (``activation_size + output_size``), a lower bound for the peak that
      needs no allocator statistics.

    The first two are None when the trace carries no allocator statistics (the arena
    disabled, or a provider that does not report them).
    """

    allocator_peak_bytes: int | None
    arena_held_bytes: int | None
    largest_node_io_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocator_peak_bytes": self.allocator_peak_bytes,
            "arena_held_bytes": self.arena_held_bytes,
            "largest_node_io_bytes": self.largest_node_io_bytes,
        }


@dataclass
class NodeProfile:
    """Per-node and per-op-type kernel times of ``runs`` profiled runs of one model."""

    level: str
    runs: int
    nodes: list[NodeTime] = field(default_factory=list)
    op_types: list[OpTypeTime] = field(default_factory=list)
    memory: MemoryStats = field(default_factory=lambda: MemoryStats(None, None, 0))
    traced_run_us: float | None = None

    @property
    def total_us(self) -> float:
        return float(sum(n.total_us for n in self.nodes))

    def per_run_us(self, name: str) -> float | None:
        """The node's kernel time per run, or None when the trace has no such node."""
        for node in self.nodes:
            if node.name == name:
                return node.total_us / max(self.runs, 1)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "runs": self.runs,
            "total_us_per_run": self.total_us / max(self.runs, 1),
            "nodes": [n.to_dict() for n in self.nodes],
            "op_types": [o.to_dict() for o in self.op_types],
            "memory": self.memory.to_dict(),
            "traced_run_us": self.traced_run_us,
        }


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The events of a trace file onnxruntime wrote (a JSON list)."""
    events = json.loads(Path(path).read_text(encoding="utf-8"))
    return events if isinstance(events, list) else list(events.get("traceEvents", []))


def parse_trace(events: list[dict[str, Any]], *, skip_runs: int, level: str) -> NodeProfile:
    """Aggregate the kernel events of every run after the first ``skip_runs``."""
    kernels = [e for e in events if _is_kernel(e)]
    windows = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        for e in events
        if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    kept_runs = [end - start for start, end in windows[skip_runs:]]
    kept = [e for e in kernels if _run_index(windows, float(e.get("ts", 0))) >= skip_runs]
    runs = max(len(windows) - skip_runs, 0) if windows else _runs_without_windows(kept)
    nodes = _node_times(kept)
    return NodeProfile(
        level=level,
        runs=runs,
        nodes=nodes,
        op_types=_op_type_times(nodes),
        memory=_memory(kernels),
        traced_run_us=float(statistics.median(kept_runs)) if kept_runs else None,
    )


def _is_kernel(event: dict[str, Any]) -> bool:
    return event.get("cat") == "Node" and str(event.get("name", "")).endswith(KERNEL_SUFFIX)


def _run_index(windows: list[tuple[float, float]], ts: float) -> int:
    """The index of the run whose window holds ``ts``; 0 when there are no windows
    (then nothing can be told apart and every kernel is kept)."""
    if not windows:
        return 0
    return max(bisect.bisect_right(windows, (ts, float("inf"))) - 1, 0)


def _runs_without_windows(kernels: list[dict[str, Any]]) -> int:
    counts: dict[str, int] = defaultdict(int)
    for event in kernels:
        counts[event["name"]] += 1
    return max(counts.values(), default=0)


def _node_times(kernels: list[dict[str, Any]]) -> list[NodeTime]:
    totals: dict[str, list] = {}
    for event in kernels:
        name = str(event["name"])[: -len(KERNEL_SUFFIX)]
        op_type = str((event.get("args") or {}).get("op_name", ""))
        entry = totals.setdefault(name, [op_type, 0, 0.0])
        entry[1] += 1
        entry[2] += float(event.get("dur", 0))
    nodes = [NodeTime(name, op, count, total) for name, (op, count, total) in totals.items()]
    return sorted(nodes, key=lambda n: (-n.total_us, n.name))


def _op_type_times(nodes: list[NodeTime]) -> list[OpTypeTime]:
    grouped: dict[str, list[NodeTime]] = defaultdict(list)
    for node in nodes:
        grouped[node.op_type].append(node)
    op_types = [
        OpTypeTime(
            op_type=op,
            nodes=len(members),
            count=sum(n.count for n in members),
            total_us=sum(n.total_us for n in members),
        )
        for op, members in grouped.items()
    ]
    return sorted(op_types, key=lambda o: (-o.total_us, o.op_type))


def _memory(kernels: list[dict[str, Any]]) -> MemoryStats:
    args = [e.get("args") or {} for e in kernels]
    return MemoryStats(
        allocator_peak_bytes=_max_of(args, "mem_in_use_peak"),
        arena_held_bytes=_max_of(args, "mem_arena_held"),
        largest_node_io_bytes=max(
            (_int(a, "activation_size") + _int(a, "output_size") for a in args), default=0
        ),
    )


def _max_of(args: list[dict[str, Any]], key: str) -> int | None:
    values = [_int(a, key) for a in args if key in a]
    return max(values) if values else None


def _int(args: dict[str, Any], key: str) -> int:
    try:
        return int(args.get(key, 0))
    except (TypeError, ValueError):
        return 0


@dataclass
class PreparedModel:
    """A model ready for onnxruntime: ``proto`` for its graph and metadata (the bytes of
    big weights may be left out or external references), ``source`` for onnxruntime
    (bytes, or a file path: the model's own, or a copy with its weights in a data file,
    ``validate.session_file``)."""

    label: str
    proto: onnx.ModelProto
    source: bytes | str


def prepare_model(model: Any, label: str, scratch: Path) -> PreparedModel:
    """Accept a path, a ModelProto or an onnx-ir model; files it must write go to
    ``scratch``, which must outlive every session made from the result (prepare each
    model once and hand every session the result: a copy is written once)."""
    if isinstance(model, PreparedModel):
        return model
    if isinstance(model, str | os.PathLike):
        load_model(model)  # refuses hostile external-data paths; raises ModelLoadError
        # The graph alone here; onnxruntime reads a one-file model with big weights from a
        # copy with a data file (mapped, not parsed whole), made once in scratch.
        source = session_file(model, scratch / label)
        return PreparedModel(label, load_without_weights(model), str(source))
    if isinstance(model, ir.Model):
        # Weights may still sit lazily in a source folder: saving writes them out whole.
        path = scratch / f"{label}-{id(model)}.onnx"
        save_model(model, path)
        return PreparedModel(label, onnx.load(path, load_external_data=False), str(path))
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"cannot profile a {type(model).__name__}: pass a ModelProto or a path")
    if model.ByteSize() <= PROTOBUF_LIMIT_BYTES:
        return PreparedModel(label, model, model.SerializeToString())
    # Over 2 GB a model cannot be one protobuf: onnxruntime reads it from a file with
    # its weights beside it (as fusion_core.validate's make_session does).
    path = scratch / f"{label}-{id(model)}.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data strips the tensors it writes out
    onnx.save_model(copy, path, save_as_external_data=True, location=path.name + ".data")
    return PreparedModel(label, model, str(path))


def session_options(level: str, threads: int) -> ort.SessionOptions:
    """The options every timed session shares (the benchmarks' too): the graph
    optimization ``level`` by name, ``threads`` intra-op threads, no spinning."""
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # Spinning threads would steal the CPUs the other interleaved sessions need.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def make_session(
    model: PreparedModel,
    level: str,
    *,
    threads: int,
    providers: Sequence[str],
    profile_prefix: str | None = None,
) -> ort.InferenceSession:
    """A session with the settings every measurement shares; with ``profile_prefix``
    onnxruntime's profiler traces every run into a file starting with it."""
    so = session_options(level, threads)
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    try:
        return ort.InferenceSession(model.source, so, providers=list(providers))
    except Exception as exc:  # onnxruntime raises many types; all mean "cannot load"
        raise ModelLoadError(f"onnxruntime could not load the {model.label} model: {exc}") from exc


def inputs_for(session: ort.InferenceSession, feeds: Feeds) -> Feeds:
    """The feeds this session reads: a fused model may drop an input the original had."""
    names = [i.name for i in session.get_inputs()]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise ConfigError(f"no input values for {missing}", hint=f"inputs given: {sorted(feeds)}")
    return {n: feeds[n] for n in names}


def timed_run(session: ort.InferenceSession, inputs: Feeds, label: str) -> float:
    """Seconds one run took; a failing run is the caller's inputs not fitting."""
    start = time.perf_counter()
    try:
        session.run(None, inputs)
    except Exception as exc:
        raise ConfigError(
            f"onnxruntime failed to run the {label} model: {exc}",
            hint="check the input shapes (dims) match the model",
        ) from exc
    return time.perf_counter() - start
