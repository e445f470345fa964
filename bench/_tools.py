"""The optimizers ``bench_tools.py`` compares, each as ``run(src, dst, entry) -> info``.

Every tool goes from the exported file to an optimized file on disk, the way a user
runs it (load, optimize, save), so the timed span is the same for all. ``entry`` is
the model's corpus manifest entry (the transformer tools read the ORT model type, heads
and hidden size from it; bench_tools.py adds ``bench_threads``, the benchmark's
``--threads``, and ``measure_budget_s``). ``info`` is what the tool says about itself (its
own fusion counts; measured selection's record), recorded as is. A tool that does not
apply to a model raises NotApplicable.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import onnxruntime as ort

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, save_model
from autofusion.fusion_core.config import MeasureOptions

Runner = Callable[[Path, Path, dict], dict]


class NotApplicable(Exception):
    """The tool is not meant for this kind of model (recorded as "n/a", not a failure)."""


@dataclass(frozen=True)
class Tool:
    name: str
    family: str  # for grouping in tables and charts
    run: Runner
    description: str
    # Run once, with no warm-up: measured selection times the model for up to its budget,
    # so a warm-up run would double it; its one run's time is "measured selection time".
    once: bool = False


def _ort_offline(level: str) -> Runner:
    def run(src: Path, dst: Path, entry: dict) -> dict:
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.optimized_model_filepath = str(dst)
        so.log_severity_level = 3
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        return {}

    return run


def _ort_transformers(src: Path, dst: Path, entry: dict) -> dict:
    from onnxruntime.transformers import optimizer

    if not entry.get("ort_model_type"):
        raise NotApplicable("onnxruntime.transformers.optimizer is for transformer models")
    with contextlib.redirect_stdout(io.StringIO()):
        model = optimizer.optimize_model(
            str(src),
            model_type=entry["ort_model_type"],
            num_heads=entry["num_heads"],
            hidden_size=entry["hidden_size"],
        )
        model.save_model_to_file(str(dst))
    stats = model.get_fused_operator_statistics()
    return {"model_type": entry["ort_model_type"], "fused": {k: v for k, v in stats.items() if v}}


def _onnxscript_optimizer(src: Path, dst: Path, entry: dict) -> dict:
    import onnxscript.optimizer

    onnx.save(onnxscript.optimizer.optimize(onnx.load(str(src))), str(dst))
    return {}


def _onnxscript_rewriter(src: Path, dst: Path, entry: dict) -> dict:
    import onnxscript.rewriter

    onnx.save(onnxscript.rewriter.rewrite(onnx.load(str(src))), str(dst))
    return {}


def _onnxscript_ort_fusions(src: Path, dst: Path, entry: dict) -> dict:
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, counts = optimize_for_ort(ir.load(str(src)))
    ir.save(model, str(dst))
    return {"fused": {k: v for k, v in counts.items() if v}}


def _onnxoptimizer(src: Path, dst: Path, entry: dict) -> dict:
    import onnxoptimizer

    onnx.save(onnxoptimizer.optimize(onnx.load(str(src))), str(dst))
    return {}


def _onnxslim(src: Path, dst: Path, entry: dict) -> dict:
    import onnxslim

    with contextlib.redirect_stdout(io.StringIO()):
        model = onnxslim.slim(onnx.load(str(src)))
    onnx.save(model, str(dst))
    return {}


def _autofusion(
    target: str, preset_name: str, *, measured: bool = False, **overrides: Any
) -> Runner:
    from autofusion.app.services.strategies import PRESETS

    preset = next(p for p in PRESETS if p.name == preset_name)
    # The check is off: no other tool validates its output, and the comparison here
    # measures every output against the original anyway.
    config = OptimizeConfig(
        target=target,
        check=CheckOptions(enabled=False),
        **(preset.config_overrides() | overrides),
    )

    def run(src: Path, dst: Path, entry: dict) -> dict:
        # The cost model prices the shapes the model is run at (as `--shape` would):
        # without them it falls back to the patterns' cost hints. Real-world entries
        # carry the dims their inputs were generated at.
        dims = entry.get("dims") or symbolic_dims(src, entry.get("input_shapes") or {})
        update: dict[str, Any] = {"check": CheckOptions(enabled=False, dims=dims)}
        if measured:  # as `--selection measured --no-measure-cache --measure-threads N`
            update["selection"] = "measured"
            update["measure_options"] = MeasureOptions(
                budget_s=float(entry.get("measure_budget_s") or 60.0),
                threads=int(entry.get("bench_threads") or 1),
                cache_dir=None,
            )
        result = optimize(str(src), config.model_copy(update=update))
        save_model(result.model, dst)
        info: dict[str, Any] = {"fusions": result.counts, "rounds": result.rounds}
        if result.measurement is not None:
            info["measurement"] = result.measurement
        return info

    return run


def symbolic_dims(src: Path, shapes: dict[str, Any]) -> dict[str, int]:
    """Values of the graph's symbolic dimensions, read off the corpus's input shapes."""
    import onnx

    dims = {}
    for value in onnx.load(str(src), load_external_data=False).graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and value.name in shapes:
                dims[dim.dim_param] = int(shapes[value.name][axis])
    return dims


def all_tools() -> list[Tool]:
    tools = [
        Tool(
            "ort-extended",
            "onnxruntime",
            _ort_offline("ORT_ENABLE_EXTENDED"),
            "onnxruntime offline: SessionOptions.optimized_model_filepath, ORT_ENABLE_EXTENDED",
        ),
        Tool(
            "ort-all",
            "onnxruntime",
            _ort_offline("ORT_ENABLE_ALL"),
            "onnxruntime offline at ORT_ENABLE_ALL (adds layout transforms for this CPU)",
        ),
        Tool(
            "ort-transformers",
            "onnxruntime",
            _ort_transformers,
            "onnxruntime.transformers.optimizer.optimize_model, its defaults per model_type",
        ),
        Tool(
            "onnxscript-optimizer",
            "onnxscript",
            _onnxscript_optimizer,
            "onnxscript.optimizer.optimize (constant folding, dead code, inlining)",
        ),
        Tool(
            "onnxscript-rewriter",
            "onnxscript",
            _onnxscript_rewriter,
            "onnxscript.rewriter.rewrite with its default rules",
        ),
        Tool(
            "onnxscript-ort-fusions",
            "onnxscript",
            _onnxscript_ort_fusions,
            "onnxscript.rewriter.ort_fusions.optimize_for_ort",
        ),
        Tool(
            "onnxoptimizer",
            "onnxoptimizer",
            _onnxoptimizer,
            "onnxoptimizer.optimize with its default passes",
        ),
        Tool("onnxslim", "onnxslim", _onnxslim, "onnxslim.slim with its defaults"),
    ]
    for target, short in (("onnxruntime", "ort"), ("generic", "generic")):
        for preset in ("default", "vision", "nlp"):
            tools.append(
                Tool(
                    f"autofusion-{short}-{preset}",
                    "autofusion",
                    _autofusion(target, preset),
                    f"fusion_core.optimize, target {target}, strategy preset {preset}, check off",
                )
            )
    # Cost-based selection on the kernel factors fitted on this machine class
    # (docs/cost.md, "Kernel factors"): leaves out the fusions predicted to lose.
    tools.append(
        Tool(
            "autofusion-ort-cpu-kernels",
            "autofusion",
            _autofusion("onnxruntime", "default", selection="greedy", target_profile="cpu-kernels"),
            "fusion_core.optimize, target onnxruntime, greedy selection on cpu-kernels, check off",
        )
    )
    # Measured selection (fusion_core/pipeline/measured/): priority proposes, this machine
    # decides, at the benchmark's thread count, with no decision cache.
    for target, short in (("onnxruntime", "ort"), ("generic", "generic")):
        tools.append(
            Tool(
                f"autofusion-{short}-measured",
                "autofusion",
                _autofusion(target, "default", measured=True),
                f"fusion_core.optimize, target {target}, selection measured (ORT_ENABLE_ALL, "
                "the benchmark's threads, 60 s budget, no cache), check off; one run",
                once=True,
            )
        )
    return tools


def versions() -> dict[str, Any]:
    out = {}
    for dist in (
        "onnx",
        "onnx-ir",
        "onnxruntime",
        "onnxscript",
        "onnxoptimizer",
        "onnxslim",
        "numpy",
        "torch",
        "transformers",
        "matplotlib",
        "autofusion",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    try:  # read-only: which commit the autofusion numbers belong to
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        out["autofusion_commit"] = head.stdout.strip() or None
    except OSError:
        out["autofusion_commit"] = None
    return out


def worker(argv: list[str]) -> None:
    """``python bench/_tools.py TOOL SRC DST ENTRY_JSON WARMUP REPEAT OUT_JSON``: run one
    tool ``WARMUP`` + ``REPEAT`` times in this process and write its times (or its error)
    to OUT_JSON: ``optimize_s`` the timed runs, ``cold_s`` the warm-up runs (the first
    run in a process pays for lazy imports and first-touch memory).

    bench_tools.py runs every tool in a fresh process: a tool that crashes the
    interpreter (native code) or leaks memory takes only its own record down, and the
    imports are done before the clock starts."""
    import gc
    import json
    import time
    import traceback

    name, src, dst, entry_json, warmup, repeat, out = argv
    tool = next(t for t in all_tools() if t.name == name)
    if tool.once:
        warmup, repeat = 0, 1
    entry = json.loads(Path(entry_json).read_text())
    record: dict[str, Any] = {
        "status": "ok",
        "cold_s": [],
        "optimize_s": [],
        "info": {},
        "error": None,
    }
    for i in range(int(warmup) + int(repeat)):
        gc.collect()
        start = time.perf_counter()
        try:
            record["info"] = tool.run(Path(src), Path(dst), entry)
        except NotApplicable as why:
            record.update(status="n/a", error=str(why))
            break
        except Exception as err:  # any failure of the tool is a result, not a crash
            first = (str(err).strip().splitlines() or [""])[0]
            record.update(status="failed", error=f"{type(err).__name__}: {first[:300]}")
            record["traceback"] = traceback.format_exc(limit=6)[-3000:]
            break
        seconds = time.perf_counter() - start
        record["cold_s" if i < int(warmup) else "optimize_s"].append(seconds)
    Path(out).write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's app/
    worker(sys.argv[1:])
