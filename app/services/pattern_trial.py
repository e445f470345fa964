"""Try one registered pattern on an uploaded model, without creating a job.

The upload goes through the same door as a job's (``uploads.receive_upload``: streamed
to disk under ``data_dir`` with the size limit counted as it arrives, and
``model_checks.inspect_model``: sizes, op domains), with one rule more: the model must be
self-contained. It is read with ``onnx.load`` *without* external data, and a model that
refers to external data, or an upload with ``data`` parts, is refused; this endpoint
never reads a file other than the model. The model then goes through the pre-passes a
job runs and is matched against the one pattern: every match (node names) and every near
miss (nodes and the reason) come back.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx.external_data_helper import uses_external_data
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from app.core.config import Settings
from app.core.problems import ProblemError
from app.models import PatternRecord
from app.services.model_checks import inspect_model
from app.services.uploads import receive_upload
from fusion_core import ModelLoadError, compile_pattern
from fusion_core.ir import model_from_proto
from fusion_core.patterns import Matcher, NearMiss
from fusion_core.prepasses import PrepassOptions, run_prepasses

__all__ = [
    "LISTED",
    "PatternTrial",
    "load_self_contained",
    "receive_trial_model",
    "trial_upload",
    "try_pattern",
]

LISTED = 1000  # matches and near misses returned in full up to this many each


@dataclass(frozen=True)
class PatternTrial:
    pattern: str
    version: int
    enabled: bool
    model_nodes: int
    prepasses: list[str]
    matches: list[list[str]]
    near_misses: list[NearMiss]


async def trial_upload(request: Request, settings: Settings, record: PatternRecord) -> PatternTrial:
    """Receive the multipart upload (one ``model`` part) and try ``record`` on it."""
    model = await receive_trial_model(request, settings)
    return await run_in_threadpool(try_pattern, record, model)


async def receive_trial_model(request: Request, settings: Settings) -> ir.Model:
    """The multipart upload's one ``model`` part, checked and loaded (self-contained)."""
    upload = await receive_upload(request, settings)
    try:
        if upload.data_names or upload.config_text is not None:
            raise ProblemError(
                422,
                "invalid-upload",
                "Invalid upload",
                "this endpoint takes one 'model' part and nothing else (no 'data' or 'config')",
            )
        model = await run_in_threadpool(load_self_contained, upload.model_path, settings)
    finally:
        await run_in_threadpool(shutil.rmtree, upload.folder, True)
    return model


def load_self_contained(path: Path, settings: Settings) -> ir.Model:
    """Read an uploaded model that must carry all of its weights inside the file."""
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, ValueError, TypeError, RuntimeError, RecursionError) as exc:
        raise ModelLoadError(
            f"the upload is not a valid ONNX model: {exc}",
            hint="send the .onnx file written by onnx.save or an exporter",
        ) from None
    external = sorted(set(_external_tensor_names(proto)))
    if external:
        raise ProblemError(
            422,
            "unsafe-external-data",
            "Unsafe external data",
            f"the model refers to external data (tensors {external[:5]}); testing a pattern "
            "takes only self-contained models: save it with onnx.save without "
            "save_as_external_data, or submit it as a job with its data files",
        )
    inspect_model(path, (), settings)  # sizes and op domains, as for a job
    return model_from_proto(proto)


def try_pattern(record: PatternRecord, model: ir.Model) -> PatternTrial:
    """Match ``record``'s pattern on ``model`` (changed in place by the pre-passes)."""
    spec = compile_pattern(record.spec).spec
    prepasses = run_prepasses(model, PrepassOptions())
    found = Matcher([spec]).find(model.graph)
    return PatternTrial(
        pattern=record.name,
        version=record.version,
        enabled=record.enabled,
        model_nodes=len(model.graph),
        prepasses=prepasses,
        matches=[match.node_names() for match in found.candidates],
        near_misses=list(found.near_misses),
    )


def _external_tensor_names(model: onnx.ModelProto) -> Iterator[str]:
    """Every tensor stored outside the file: main graph, subgraphs, functions."""
    graphs = [model.graph]
    nodes = [node for function in model.functions for node in function.node]
    while graphs:
        graph = graphs.pop()
        nodes.extend(graph.node)
        tensors = list(graph.initializer)
        for sparse in graph.sparse_initializer:
            tensors += [sparse.values, sparse.indices]
        yield from (t.name for t in tensors if uses_external_data(t))
        while nodes:
            node = nodes.pop()
            for attr in node.attribute:
                tensors = [attr.t, *attr.tensors]
                for sparse in [attr.sparse_tensor, *attr.sparse_tensors]:
                    tensors += [sparse.values, sparse.indices]
                yield from (t.name or node.name for t in tensors if uses_external_data(t))
                graphs.extend([attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs)
