"""onnxruntime sessions as the benchmarks open them, and a failure in one line.

Shared by ``bench_tools.py``, the real-world corpus (``_real_world.py``: the sample an
original runs on is found by opening it at both levels) and the other benchmarks, so
every timed run uses the options the reports' own measurements use.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from autofusion.fusion_core.profiling import session_options

# The two levels every benchmark measures: no onnxruntime fusion, and all of it.
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL")


def session(path: Path, level: str, threads: int) -> ort.InferenceSession:
    """A session with the options the reports' own measurements use."""
    options = session_options(level, threads)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds_for(sess: ort.InferenceSession, feeds: dict) -> dict:
    """The feeds the session's inputs name (a sample may hold more)."""
    return {i.name: feeds[i.name] for i in sess.get_inputs()}


def short(err: Exception) -> str:
    """An error as one line: its type and the first 300 characters of its message."""
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:300]}"
