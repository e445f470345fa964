"""The API's sandbox: ``python -P -m autofusion.app.services.api_sandbox FOLDER``.

The API process never parses a large model, folds constants, infers shapes or matches a
pattern itself (docs/architecture.md): a 222-byte ``TfIdfVectorizer`` loops forever in
constant folding and a 191-byte ``ConstantOfShape`` allocates 2.5 GB. That work runs
here, in a sandbox (``app.services.sandbox``: its limits, its exit with its parent),
started by ``app.services.model_work``.

Why a module of ``app.services`` and not ``worker/sandbox.py``: the API must not import
``worker``, and what runs here is the API's own logic (the upload checks of
``model_checks`` and the pattern trial) that the job's sandbox knows nothing about. It
imports only ``app.core.config``, ``app.services.model_checks`` and ``fusion_core``: no
database, no web framework beyond what ``ProblemError`` pulls in.

``FOLDER/request.json`` says what to do::

    {"task": "inspect" | "trial", "memory_limit_mb": N, "cpu_limit_s": N,
     "parent_pid": PID, "settings": {...Settings fields, no credentials...},
     "model": "/abs/path/model.onnx", "data_names": [...],          # inspect
     "pattern": {"name", "version", "enabled", "spec"}, "pictures": N}  # trial

and the sandbox writes ``FOLDER/result.json`` (exit 0) or ``FOLDER/error.json`` (exit 3):
``{"kind": "problem", "problem": {status, slug, title, detail, extra}}`` for a refusal
the user should see as is, ``{"kind": "memory"}`` when it ran out of its address space,
``{"kind": "internal", "message": text}`` for anything else.
"""

from __future__ import annotations

# Only the standard library before the limits are in place.
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autofusion.app.services.sandbox import (  # standard library only
    Progress,
    SandboxKind,
    is_out_of_memory,
    sandbox_main,
)

__all__ = ["MODEL_WORK"]

# The sandbox yields the CPU to the API process it serves: /healthz answers while it works.
_NICENESS = 10


def _work(_folder: Path, request: dict[str, Any], _progress: Progress) -> dict[str, Any]:
    """The task the request names: its result (``{}`` for a model that passed its checks)."""
    from autofusion.app.core.config import Settings

    # Only what the API passed: no .env file, no secrets directory in a sandbox.
    settings = Settings(_env_file=None, _secrets_dir=None, **request["settings"])
    model = Path(request["model"])
    if request["task"] == "inspect":
        from autofusion.app.services.model_checks import inspect_model

        inspect_model(model, request["data_names"], settings)
        return {}
    if request["task"] == "trial":
        return _trial(model, settings, request["pattern"], int(request.get("pictures", 0)))
    raise ValueError(f"unknown task {request['task']!r}")


def _trial(path: Path, settings: Any, pattern: dict[str, Any], pictures: int) -> dict[str, Any]:
    """Load the self-contained model, run the pre-passes, match the one pattern."""
    import onnx_ir as ir

    from autofusion.app.services.model_checks import inspect_model
    from autofusion.fusion_core import compile_pattern
    from autofusion.fusion_core.ir import model_from_proto
    from autofusion.fusion_core.patterns import Matcher
    from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses

    proto = _load_self_contained(path)
    inspect_model(path, (), settings)  # sizes and op domains, as for a job
    model = model_from_proto(proto)
    del proto
    spec = compile_pattern(pattern["spec"]).spec
    prepasses = run_prepasses(model, PrepassOptions())
    found = Matcher([spec]).find(model.graph)
    matches = [match.node_names() for match in found.candidates]
    result: dict[str, Any] = {
        "model_nodes": len(model.graph),
        "prepasses": list(prepasses),
        "matches": matches,
        "near_misses": [{"nodes": list(m.nodes), "reason": m.reason} for m in found.near_misses],
        "pictures": [],
    }
    if pictures and matches:
        # The dashboard's match pictures (fusion_core.report draws them the same way).
        from autofusion.fusion_core.report import GraphIndex, region_svg

        index = GraphIndex(ir.to_proto(model))
        drawn = (region_svg(index, names, f"match {n}") for n, names in enumerate(matches, 1))
        result["pictures"] = [svg for svg, _ in zip(drawn, range(pictures), strict=False) if svg]
    return result


def _load_self_contained(path: Path) -> Any:
    """The uploaded ModelProto, which must carry all of its weights inside the file."""
    import onnx
    from google.protobuf.message import DecodeError

    from autofusion.app.core.errors import ProblemError
    from autofusion.fusion_core import ModelLoadError

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
    return proto


def _external_tensor_names(model: Any) -> Iterator[str]:
    """Every tensor stored outside the file: main graph, subgraphs, functions."""
    from onnx.external_data_helper import uses_external_data

    graphs = [model.graph]
    nodes = [node for function in model.functions for node in function.node]
    while graphs or nodes:
        if graphs:
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


def _describe(exc: BaseException) -> dict[str, Any]:
    """What the parent needs to answer: a problem, out of memory, or an internal error."""
    if is_out_of_memory(exc):
        return {"kind": "memory"}
    internal = {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"}
    try:
        from autofusion.app.core.errors import ProblemError
        from autofusion.fusion_core.errors import FusionError, PatternError
    except BaseException:  # the failure was in these imports: nothing more to learn
        return internal
    if isinstance(exc, ProblemError):
        problem = [exc.status, exc.slug, exc.title, exc.detail, exc.extra]
    elif isinstance(exc, FusionError):  # as app.api.problems maps it for a request
        extra = {}
        if isinstance(exc, PatternError) and exc.errors:
            extra["errors"] = [{"field": f, "message": m} for f, m in exc.errors]
        problem = [422, exc.code, type(exc).__name__, str(exc), extra]
    else:
        return internal
    keys = ("status", "slug", "title", "detail", "extra")
    return {"kind": "problem", "problem": dict(zip(keys, problem, strict=True))}


MODEL_WORK = SandboxKind(
    module="autofusion.app.services.api_sandbox",
    request_file="request.json",
    error_file="error.json",
    result_file="result.json",
    log_file="sandbox.log",
    work=_work,
    describe=_describe,
    niceness=_NICENESS,
)

if __name__ == "__main__":
    sys.exit(sandbox_main(MODEL_WORK))
