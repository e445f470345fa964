"""Run the original and the fused model side by side in onnxruntime and compare.

onnxruntime's own graph optimizations are disabled for both sessions, so the check
measures our rewrite and not onnxruntime's. Every output is compared with
``|fused - original| <= atol + rtol * |original|`` (numpy's ``allclose`` rule).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from fusion_core.ir import PROTOBUF_LIMIT_BYTES
from fusion_core.validate._inputs import random_inputs

__all__ = ["CheckResult", "OutputCheck", "compare_models", "make_session"]


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs_diff: float
    max_rel_diff: float
    rtol: float
    atol: float
    passed: bool
    detail: str = ""


@dataclass
class CheckResult:
    passed: bool
    samples: int
    seed: int
    outputs: list[OutputCheck] = field(default_factory=list)
    error: str | None = None

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)

    def to_dict(self) -> dict:
        return asdict(self) | {"max_abs_diff": self.max_abs_diff}


def make_session(
    model: onnx.ModelProto, *, optimized: bool = False, threads: int = 1
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimized
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if model.ByteSize() <= PROTOBUF_LIMIT_BYTES:
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    # Over 2 GB a model cannot be one protobuf: hand onnxruntime a file with its
    # weights beside it, in a folder that lives as long as the session.
    folder = tempfile.TemporaryDirectory(prefix="autofusion-")
    path = Path(folder.name) / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data strips the tensors it writes out
    onnx.save_model(copy, path, save_as_external_data=True, location="model.onnx.data")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session._autofusion_folder = folder  # keeps the weights alive
    return session


def compare_models(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    *,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    samples: int = 2,
    seed: int = 0,
    dims: dict[str, int] | None = None,
    feeds: list[dict[str, np.ndarray]] | None = None,
) -> CheckResult:
    """Compare every output of ``fused`` against ``original`` on seeded random inputs."""
    result = CheckResult(passed=False, samples=samples, seed=seed)
    try:
        reference, candidate = make_session(original), make_session(fused)
    except Exception as exc:  # onnxruntime raises many types; report them all
        result.error = f"onnxruntime could not load a model: {exc}"
        return result
    feeds = feeds or [random_inputs(original, seed=seed + k, dims=dims) for k in range(samples)]
    names = [o.name for o in reference.get_outputs()]
    worst: dict[str, tuple[float, float, str]] = {n: (0.0, 0.0, "") for n in names}
    try:
        for feed in feeds:
            expected = reference.run(names, feed)
            actual = candidate.run(names, feed)
            for name, want, got in zip(names, expected, actual, strict=True):
                worst[name] = _worse(
                    worst[name], _diff(np.asarray(want), np.asarray(got), rtol, atol)
                )
    except Exception as exc:
        result.error = f"onnxruntime failed to run a model: {exc}"
        return result
    for name in names:
        abs_diff, rel_diff, detail = worst[name]
        passed = not detail
        result.outputs.append(OutputCheck(name, abs_diff, rel_diff, rtol, atol, passed, detail))
    result.passed = all(o.passed for o in result.outputs)
    return result


def _diff(want: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> tuple[float, float, str]:
    if want.shape != got.shape:
        return float("inf"), float("inf"), f"shape {list(got.shape)} != {list(want.shape)}"
    if want.dtype != got.dtype:
        return float("inf"), float("inf"), f"dtype {got.dtype} != {want.dtype}"
    if not np.issubdtype(want.dtype, np.number) or want.size == 0:
        same = bool(np.array_equal(want, got))
        return (0.0 if same else float("inf")), 0.0, "" if same else "values differ"
    w, g = want.astype(np.float64), got.astype(np.float64)
    nan_mismatch = np.isnan(w) != np.isnan(g)
    err = np.abs(w - g)
    err[np.isnan(w) & np.isnan(g)] = 0.0
    abs_diff = float(np.nanmax(err)) if err.size else 0.0
    rel_diff = float(np.nanmax(err / np.maximum(np.abs(w), 1e-12))) if err.size else 0.0
    bad = bool(nan_mismatch.any()) or bool((err > atol + rtol * np.abs(w)).any())
    detail = (
        f"max abs diff {abs_diff:.3g} exceeds atol {atol:g} + rtol {rtol:g} * |expected|"
        if bad
        else ""
    )
    return abs_diff, rel_diff, detail


def _worse(a: tuple[float, float, str], b: tuple[float, float, str]) -> tuple[float, float, str]:
    return (max(a[0], b[0]), max(a[1], b[1]), a[2] or b[2])
