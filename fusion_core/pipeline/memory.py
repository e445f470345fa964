"""The optimizing process's own memory: measured by phase, and predicted before a run.

``PhaseMemory`` hears each phase of ``run`` start (the ``on_phase`` names: ``load``,
``prepasses``, ``fuse``, ``check``, ``saving``, ``profiling``; ``measure``,
``progressive`` and ``fallback`` in those modes) and records, at the end of each, the
process's peak resident memory so far and its resident memory then. The peak is Linux's
``VmHWM`` (``/proc/self/status``), else ``getrusage``'s ``ru_maxrss``: a high-water
mark, so each phase's figure is the peak up to its end, and the phase whose figure
jumps is the one that raised it. The report's ``optimize_memory`` is its record.

``predict_memory(model_bytes, config)`` is the peak before the run, from the model's
bytes on disk (its file and external data), what the config runs and whether the model
and its fused copy keep their weights in a data file (``external_data``): a base (the
interpreter, onnx and onnxruntime) plus the largest multiple of the model among the
phases the config runs. The multiples are fitted to measurements, not derived:
``bench/bench_big_models.py`` on synthetic Llama-shaped decoders of 0.25, 0.5 and 1 GiB,
with their weights in a data file and saved as one file (docs/benchmarks.md, section 27,
"The check's sessions and the save, weights held once"), each the largest ratio measured
rounded up, so the prediction errs high on that family; other models (many small
tensors, folding that grows constants) may differ, hence the worker's margin.
Where the memory goes: with a data file the weights stay there, read lazily, so a run
holds the weights the fusions rewrite (the merged projections) and, with the check on,
one onnxruntime session at a time (the check reads both models from files, the fused one
saved to a scratch folder first); saving streams the weights to the output's data file.
In one file the big weights are left in the file at load and read from it when asked,
and saving writes one initializer at a time (``fusion_core.onefile``), so fusing and
saving cost what they cost with a data file; onnxruntime's sessions (the check's of the
original, profiling's of both models) read a copy with a data file written to a scratch
folder (``validate.session_file``: onnxruntime maps a data file but parses one file
whole), so the check and profiling cost what they cost with a data file too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.ir import PROTOBUF_LIMIT_BYTES

__all__ = [
    "BASE_BYTES",
    "MEASURE",
    "MULTIPLIERS",
    "ONE_FILE_MULTIPLIERS",
    "MemoryPrediction",
    "PhaseMemory",
    "peak_rss_bytes",
    "predict_memory",
    "predict_peak_bytes",
    "rss_bytes",
]

MEASURE = (
    "the optimizing process's peak resident memory (Linux: VmHWM, else ru_maxrss), and "
    "by phase the peak up to the end of the phase and the resident memory then"
)

# What the process holds besides the model: the interpreter, numpy, onnx, onnx-ir and
# onnxruntime imported, the patterns compiled (measured: 230-290 MiB on a 10 MB model).
BASE_BYTES = 400 << 20
# The phases run one after the other, so the peak is the largest phase's: BASE_BYTES +
# the model's bytes on disk times the largest multiple among the phases the run has.
# Fitted on the 0.25-6 GiB decoders of bench/bench_big_models.py (docs/benchmarks.md,
# sections 27 and 28, "Merged weights read when written"), each the largest
# (peak - BASE_BYTES) / model measured, rounded up. Since the merged projections are lazy
# nothing but the interpreter grows while fusing and saving (negative: the base is
# generous), the check holds one onnxruntime session (0.22, 0.60, 0.80, 0.94 at 0.25,
# 0.5, 1, 3 GiB) and profiling two (1.09, 1.53, 1.78 at 0.25, 0.5, 1 GiB, rising with
# the size, so the data file's, which reaches past 2 GB, keeps more room). With its
# weights in a data file, in and out:
MULTIPLIERS = {
    "save": 0.5,  # every run: load (lazy), fuse (merged weights lazy too), the save streamed
    # the check: the same, and one onnxruntime session at a time. A model that computes in
    # float16 gets one more session of the original, computed in float32 (the noise floor,
    # validate/_floor_fp16.py: each weight widened by a Cast where it is read, not copied):
    # measured not to move the check's peak (0.25 GiB fp16 decoder: that session 3.85x the
    # model against the original's 3.62x and the fused model's 4.82x; the check 7.47x with
    # the floor and without). That 7.47x is onnxruntime's CPU sessions of an fp16 model, not
    # the floor, and is above this multiple: the prediction does not read the model's types.
    "check": 1.25,
    "profile": 2.75,  # profiling's sessions of both models, from their files
    # the check at precision fp16 also compares value ranges on both models as protos
    # with their weights (validate.check_fp16): 9.2x measured at 95 MiB (section 28)
    "fp16_check": 9.5,
    # added to the largest in measured selection and progressive validation, which build
    # and run many variants (not measured on big models: an allowance, not a fit)
    "many_passes": 2.0,
}
# In one file (the input, or the fused model): the big weights read from the file when
# asked, saving streamed one initializer at a time, onnxruntime's sessions read from
# copies with a data file (docs/benchmarks.md, section 27, "A model in one file, weights
# held once" and "onnxruntime's sessions of a model in one file"; section 28, "Merged
# weights read when written"): measured as with a data file (0.22, 0.60, 0.81 checking;
# 1.08, 1.53, 1.77 profiling at 0.25, 0.5, 1 GiB), and a file of one piece is under 2 GB.
ONE_FILE_MULTIPLIERS = {"save": 0.5, "check": 1.25, "profile": 2.5, "fp16_check": 9.5}


def peak_rss_bytes() -> int | None:
    """This process's peak resident memory so far, in bytes (None: not measurable)."""
    found = _status_bytes("VmHWM")
    if found is not None:
        return found
    try:
        import resource  # POSIX only

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, ValueError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024  # macOS says bytes, Linux KiB


def rss_bytes() -> int | None:
    """This process's resident memory now (Linux only; None elsewhere)."""
    return _status_bytes("VmRSS")


def _status_bytes(key: str) -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class PhaseMemory:
    """An ``on_phase`` callback that records the memory at the end of each phase, then
    passes the name on to ``on_phase``."""

    def __init__(self, on_phase: Callable[[str], None] | None = None) -> None:
        self._on_phase = on_phase
        self._phase: str | None = None
        self.before_bytes = rss_bytes()  # what the process held before the run
        self.by_phase: dict[str, dict[str, int | None]] = {}

    def __call__(self, name: str) -> None:
        self._close()
        self._phase = name
        if self._on_phase is not None:
            self._on_phase(name)

    def _close(self) -> None:
        if self._phase is not None:  # a phase run twice (a fallback) keeps its last figures
            figures = {"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": rss_bytes()}
            self.by_phase[self._phase] = figures
        self._phase = None

    def record(
        self, model_bytes: int | None, config: OptimizeConfig | None, *, external_data: bool = False
    ) -> dict[str, Any]:
        """The report's ``optimize_memory``: the phase running now ends here.
        ``external_data``: the fused model was saved with its weights in a data file."""
        self._close()
        peak = peak_rss_bytes()
        predicted = None
        if model_bytes is not None:
            predicted = predict_memory(model_bytes, config, external_data=external_data)
        return {
            "measure": MEASURE,
            "peak_rss_bytes": peak,
            "model_bytes": model_bytes,
            "ratio": round(peak / model_bytes, 3) if peak and model_bytes else None,
            "before_bytes": self.before_bytes,
            "by_phase": dict(self.by_phase),
            "predicted_peak_bytes": predicted.peak_bytes if predicted else None,
            "prediction": predicted.basis if predicted else None,
        }


@dataclass(frozen=True)
class MemoryPrediction:
    peak_bytes: int
    model_bytes: int
    multiplier: float  # of the model's bytes, on top of BASE_BYTES
    basis: str  # what the multiplier stands for, in words

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": self.peak_bytes,
            "model_bytes": self.model_bytes,
            "multiplier": self.multiplier,
            "basis": self.basis,
        }


def predict_memory(
    model_bytes: int, config: OptimizeConfig | None = None, *, external_data: bool = False
) -> MemoryPrediction:
    """The peak resident memory ``run`` (``optimize``, saving, profiling) is expected to
    reach on a model of ``model_bytes`` (its file and external data) with ``config``:
    ``BASE_BYTES`` + the largest multiple of the model among its phases (``MULTIPLIERS``,
    fitted: see the module). ``external_data``: the model comes with its weights in a
    data file and the fused model is saved so too (``run``'s default for such a model);
    False: either is one file (the service's fused model is), which costs as much with
    the check or profiling (onnxruntime reads copies with a data file) and less with
    neither (measured: see the module).
    Past 2 GB both have a data file, whatever it says."""
    config = config or OptimizeConfig()
    streamed = external_data or model_bytes > PROTOBUF_LIMIT_BYTES
    table = MULTIPLIERS if streamed else ONE_FILE_MULTIPLIERS
    phases = ["save"] + ["check"] * config.check.enabled + ["profile"] * config.profile
    if config.check.enabled and config.precision == "fp16":
        phases.append("fp16_check")
    multiplier = max(table[p] for p in phases)
    parts = ["the check on" if config.check.enabled else "the check off"]
    if config.profile:
        parts.append("profiled")
    if "fp16_check" in phases:
        parts.append("fp16 ranges checked")
    mode = config.mode
    if mode != "plain":
        multiplier += MULTIPLIERS["many_passes"]
        parts.append("measured selection" if mode == "measured" else "progressive validation")
    if not streamed:
        parts.append("one file")
    peak = BASE_BYTES + int(multiplier * max(0, model_bytes))
    basis = f"{multiplier:g}x the model + {BASE_BYTES >> 20} MiB ({', '.join(parts)})"
    return MemoryPrediction(peak, model_bytes, multiplier, basis)


def predict_peak_bytes(
    model_bytes: int, config: OptimizeConfig | None = None, *, external_data: bool = False
) -> int:
    """``predict_memory(model_bytes, config, external_data=...).peak_bytes``."""
    return predict_memory(model_bytes, config, external_data=external_data).peak_bytes
