"""What the corpus tier's conftest and tests share: the cache, the CLI, the cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "corpus"))

import meta  # noqa: E402  (bench/corpus is not a package)
import node_tests  # noqa: E402

CACHE = meta.cache_dir()
WORKERS = int(os.environ.get("AUTOFUSION_CORPUS_WORKERS", "2"))
CALL_TIMEOUT = 120
MODEL_TIMEOUT = 600
RESULTS: dict[str, dict] = {"models": {}, "node_tests": {}}


def cli() -> list[str]:
    """The installed ``autofusion`` command next to this interpreter."""
    script = Path(sys.executable).with_name("autofusion")
    if not script.is_file():
        raise RuntimeError(f"no autofusion script next to {sys.executable}; pip install -e .")
    return [str(script)]


def node_cases() -> dict[str, Path]:
    """The ONNX backend test models the no-traceback test runs (a sample unless
    ``AUTOFUSION_NODE_TESTS=all``)."""
    models = node_tests.all_models(CACHE)
    return models if os.environ.get("AUTOFUSION_NODE_TESTS") == "all" else node_tests.sample(models)


def optimize(path: Path, info: meta.ModelMeta, target: str, tmp: Path):
    """``autofusion optimize`` as a user runs it: (process, report or None, seconds); the
    optimized model is ``tmp / "out.onnx"`` (``optimized_path``)."""
    report = tmp / "report.json"
    cmd = [
        *cli(),
        "optimize",
        str(path),
        "-o",
        str(tmp / "out.onnx"),
        "--target",
        target,
        "--report",
        str(report),
    ]
    for profile in info.shapes:
        cmd += ["--shape", ",".join(f"{k}={v}" for k, v in profile.items())]
    if info.atol is not None:
        cmd += ["--atol", str(info.atol)]
    if info.rtol is not None:
        cmd += ["--rtol", str(info.rtol)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=MODEL_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(cmd, -9, "", f"timed out after {MODEL_TIMEOUT} s")
    seconds = time.perf_counter() - start
    data = json.loads(report.read_text()) if report.is_file() else None
    return proc, data, seconds


def optimized_path(tmp: Path) -> Path:
    return tmp / "out.onnx"


def decoder_logits(path: Path, *, length: int, padded: int, seed: int) -> np.ndarray:
    """The logits of a synthetic decoder (``bench/_big_models.py``) on a batch of two
    token rows of ``length``, the first ``padded`` of the second masked (left padding, as
    batched generation pads). One session from the file, released after: the weights are
    mapped, not packed (prepacking off), so a 2 GiB model costs its pages, not a copy."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    mask = np.ones((2, length), np.int64)
    mask[1, :padded] = 0
    feeds = {
        "input_ids": np.random.default_rng(seed).integers(0, 8192, (2, length)),
        "attention_mask": mask,
        "position_ids": np.tile(np.arange(length), (2, 1)),
    }
    return session.run(None, feeds)[0]
