"""The API's model child: ``python -P -m app.services.model_child FOLDER``.

The API process never parses a large model, folds constants, infers shapes or matches a
pattern itself (DESIGN.md): a 222-byte ``TfIdfVectorizer`` loops forever in constant
folding and a 191-byte ``ConstantOfShape`` allocates 2.5 GB. That work runs here, in a
child with its own limits, started by ``app.services.model_sandbox``.

Why a module of ``app.services`` and not ``worker/sandbox.py``: the API must not import
``worker``, and what runs here is the API's own logic (the upload checks of
``model_checks`` and the pattern trial) that the worker's sandbox knows nothing about.
The child imports only ``app.core.config``, ``app.services.model_checks`` and
``fusion_core``: no database, no web framework beyond what ``ProblemError`` pulls in.

``FOLDER/request.json`` says what to do::

    {"task": "inspect" | "trial", "memory_limit_mb": N, "cpu_limit_s": N,
     "parent_pid": PID, "settings": {...Settings fields, no credentials...},
     "model": "/abs/path/model.onnx", "data_names": [...],          # inspect
     "pattern": {"name", "version", "enabled", "spec"}, "pictures": N}  # trial

and the child writes ``FOLDER/result.json`` (exit 0) or ``FOLDER/error.json`` (exit 3):
``{"problem": {status, slug, title, detail, extra}}`` for a refusal the user should see
as is, ``{"memory": true}`` when it ran out of its address space, ``{"internal": text}``
for anything else. The address-space, CPU-time and core-file limits are set before
anything big is imported; a thread exits the child when the API process that started it
is gone, so it never outlives its parent.
"""

from __future__ import annotations

# Only the standard library before the limits are in place.
import errno
import json
import os
import resource
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autofusion.app.services.sandbox_env import EXIT_ORPHANED, exit_with_parent

__all__ = [
    "ERROR_FILE",
    "EXIT_ERROR",
    "EXIT_ORPHANED",
    "MEMORY_HINTS",
    "REQUEST_FILE",
    "RESULT_FILE",
    "main",
]

REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"
ERROR_FILE = "error.json"
EXIT_ERROR = 3  # error.json written
# A child yields the CPU to the API process it serves: /healthz answers while it works.
_NICENESS = 10
# What C++ allocators, protobuf and onnx say when an allocation fails under RLIMIT_AS.
MEMORY_HINTS = (
    "bad_alloc",
    "cannot allocate memory",
    "out of memory",
    "memoryerror",
    "arena alloc failed",
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m autofusion.app.services.model_child FOLDER\n")
        return 2
    # First thing, before it writes anything: what it writes is private (0600). Set
    # here, not by the parent: uvloop's subprocess_exec takes no umask.
    os.umask(0o077)
    folder = Path(argv[0])
    try:
        request = json.loads((folder / REQUEST_FILE).read_text(encoding="utf-8"))
        _limit(int(request["memory_limit_mb"]), int(request["cpu_limit_s"]))
        exit_with_parent(int(request["parent_pid"]))
        result = _run(request)
    except BaseException as exc:  # every failure becomes error.json, then an exit code
        traceback.print_exc()
        _write_json(folder / ERROR_FILE, _describe(exc))
        return EXIT_ERROR
    _write_json(folder / RESULT_FILE, result)
    return 0


def _limit(memory_mb: int, cpu_s: int) -> None:
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # SIGXCPU at the soft limit, SIGKILL a second later should it be caught.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(_NICENESS)


def _run(request: dict[str, Any]) -> dict[str, Any]:
    from autofusion.app.core.config import Settings

    # Only what the API passed: no .env file, no secrets directory in a child.
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
        # The dashboard's match pictures (app/ui/report_view.py draws them the same way).
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
    if _is_memory(exc):
        return {"memory": True}
    try:
        from autofusion.app.core.errors import ProblemError
        from autofusion.fusion_core.errors import FusionError, PatternError
    except BaseException:  # the failure was in these imports: nothing more to learn
        return {"internal": f"{type(exc).__name__}: {exc}"}
    if isinstance(exc, ProblemError):
        problem = [exc.status, exc.slug, exc.title, exc.detail, exc.extra]
    elif isinstance(exc, FusionError):  # as app.api.problems maps it for a request
        extra = {}
        if isinstance(exc, PatternError) and exc.errors:
            extra["errors"] = [{"field": f, "message": m} for f, m in exc.errors]
        problem = [422, exc.code, type(exc).__name__, str(exc), extra]
    else:
        return {"internal": f"{type(exc).__name__}: {exc}"}
    keys = ("status", "slug", "title", "detail", "extra")
    return {"problem": dict(zip(keys, problem, strict=True))}


def _is_memory(exc: BaseException | None) -> bool:
    """Out of address space, even where a check turned it into a refusal: protobuf's
    ``DecodeError: Arena alloc failed`` became "not a valid ONNX file"."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, MemoryError):
            return True
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            return True
        # Our own errors may quote the model (a node called "out of memory"): only
        # what a library raised counts by its text.
        ours = type(exc).__module__.startswith(("app.", "fusion_core"))
        if not ours and any(hint in str(exc).lower() for hint in MEMORY_HINTS):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str), encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
