"""What measured selection remembers: a decision per machine class, model structure and
group of fusions, so that a second job on the same architecture measures little.

* The **machine class** is what makes a timing transferable: the CPU model, the number
  of CPUs, the onnxruntime version, the providers, the level and the thread count.
* The **model structure** is the graph without its weights: every node's op, domain,
  attributes and edges, every input's type and shape, every initializer's dtype and
  dims, the values of small tensors only (shapes, axes, scales decide what fuses and
  how fast; large weights do not), plus the input sizes measured. A retrained model, or
  another checkpoint of the same architecture, has the same structure.
* A **group** is named by its key (pattern and region class, ``_groups.py``).

One small JSON file per decision, written atomically (a temporary file renamed), so
that concurrent jobs on one machine never read half a file; an unreadable entry is a
miss, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort

__all__ = ["DecisionCache", "machine_class", "model_structure"]

_CACHE_VERSION = 1
_SMALL_TENSOR_ELEMENTS = 16


def machine_class(*, level: str, threads: int, providers: Sequence[str]) -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "onnxruntime": ort.__version__,
        "providers": list(providers),
        "level": level,
        "threads": threads,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def model_structure(model: onnx.ModelProto, dims: Mapping[str, int]) -> str:
    """A sha256 of the graph without its weights (see the module doc)."""
    digest = hashlib.sha256(b"autofusion-structure/1\n")
    digest.update(json.dumps(dict(sorted(dims.items()))).encode())
    _graph_digest(model.graph, digest)
    for opset in model.opset_import:
        digest.update(f"opset {opset.domain}:{opset.version}\n".encode())
    for function in model.functions:
        digest.update(f"function {function.domain}::{function.name}\n".encode())
        for node in function.node:
            _node_digest(node, digest)
    return digest.hexdigest()


def _graph_digest(graph: onnx.GraphProto, digest: Any) -> None:
    for value in list(graph.input) + list(graph.output):
        digest.update(f"value {value.name} {value.type.SerializeToString().hex()}\n".encode())
    for tensor in graph.initializer:
        digest.update(_tensor_text(tensor).encode())
    for node in graph.node:
        _node_digest(node, digest)


def _node_digest(node: onnx.NodeProto, digest: Any) -> None:
    digest.update(
        f"node {node.domain}::{node.op_type} {list(node.input)} -> {list(node.output)}\n".encode()
    )
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            digest.update(f"  {attr.name} {_tensor_text(attr.t)}".encode())
        elif attr.type == onnx.AttributeProto.GRAPH:
            digest.update(f"  {attr.name} graph\n".encode())
            _graph_digest(attr.g, digest)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for graph in attr.graphs:
                _graph_digest(graph, digest)
        else:
            digest.update(f"  {attr.name} {onnx.helper.get_attribute_value(attr)!r}\n".encode())


def _tensor_text(tensor: onnx.TensorProto) -> str:
    elements = 1
    for d in tensor.dims:
        elements *= d
    text = f"tensor {tensor.name} {tensor.data_type} {list(tensor.dims)}"
    if elements <= _SMALL_TENSOR_ELEMENTS and tensor.data_location != onnx.TensorProto.EXTERNAL:
        # a dtype numpy cannot show: the dims are enough
        with contextlib.suppress(ValueError, TypeError):
            text += f" {onnx.numpy_helper.to_array(tensor).tolist()!r}"
    return text + "\n"


class DecisionCache:
    """Decisions by key in ``folder``; ``None`` as the folder: nothing is kept."""

    def __init__(self, folder: str | os.PathLike | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.hits = self.misses = 0

    @staticmethod
    def key(machine: Mapping[str, Any], structure: str, group: str) -> str:
        text = json.dumps(
            {"v": _CACHE_VERSION, "machine": machine, "structure": structure, "group": group},
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        if self.folder is None:
            return None
        try:
            entry = json.loads((self.folder / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("kept"), bool):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        if self.folder is None:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=self.folder, suffix=".tmp", delete=False, encoding="utf-8"
            ) as f:
                json.dump(dict(entry), f)
            os.replace(f.name, self.folder / f"{key}.json")
        except OSError:  # a cache that cannot be written costs a measurement next time
            pass
