"""What the check found: each output's comparison, each shape profile's, the verdict,
and the words every consumer (CLI, worker, CI client) uses for a failure."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from autofusion.fusion_core.validate._floor import NoiseFloor
from autofusion.fusion_core.validate._stats import HISTOGRAM_EDGES, ErrorStats

__all__ = [
    "CANNOT_LOAD",
    "FAILURE_WORDS",
    "FUSED_CANNOT_RUN",
    "INVALID_GRAPH",
    "MISMATCH",
    "ORIGINAL_CANNOT_RUN",
    "CheckResult",
    "OutputCheck",
    "ProfileCheck",
    "describe_failure",
    "first_line",
]


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs_diff: float
    max_rel_diff: float
    rtol: float
    atol: float
    passed: bool
    detail: str = ""
    dtype: str = ""
    elements: int = 0  # compared, over all samples
    mismatches: int = 0  # elements outside the tolerance
    mean_abs_diff: float = 0.0
    cosine_similarity: float | None = None
    # Counts of |error| per decade bin; CheckResult.histogram_edges are the lower edges.
    histogram: list[int] = field(default_factory=list)
    tolerance_source: str = ""  # "configured", "override", "default for float16", ...

    @classmethod
    def from_stats(cls, name: str, dtype: str, stats: ErrorStats, detail: str = "") -> OutputCheck:
        tol = stats.tolerance
        return cls(
            name=name,
            max_abs_diff=stats.max_abs,
            max_rel_diff=stats.max_rel,
            rtol=tol.rtol,
            atol=tol.atol,
            passed=stats.passed,
            detail=detail or stats.detail(),
            dtype=dtype,
            elements=stats.elements,
            mismatches=stats.mismatches,
            mean_abs_diff=stats.mean_abs,
            cosine_similarity=stats.cosine_similarity,
            histogram=list(stats.histogram),
            tolerance_source=tol.source,
        )


@dataclass
class ProfileCheck:
    """One shape profile: the dims it used (every symbolic dim, defaults included)."""

    dims: dict[str, int]
    samples: int
    seeds: list[int]  # one per sample; empty for caller-supplied feeds
    passed: bool = False
    outputs: list[OutputCheck] = field(default_factory=list)
    error: str | None = None
    # Why the check added this profile, for one it added ("" for those asked for)
    added: str = ""


# Why a check that did not pass failed (CheckResult.failure):
ORIGINAL_CANNOT_RUN = "original_cannot_run"  # the inputs are wrong for the model, not the fusion
FUSED_CANNOT_RUN = "fused_cannot_run"
CANNOT_LOAD = "cannot_load"  # onnxruntime refuses the fused graph
INVALID_GRAPH = "invalid_graph"  # the fused graph breaks onnx's rules or the interface
MISMATCH = "mismatch"
# Each failure in the words every consumer uses (CLI, worker, CI client): "does not
# match" only where outputs were compared and differ.
FAILURE_WORDS = {
    ORIGINAL_CANNOT_RUN: "the check could not run",
    CANNOT_LOAD: "the fused graph is invalid: onnxruntime cannot load it",
    INVALID_GRAPH: "the fused graph is invalid",
    FUSED_CANNOT_RUN: "the fused model fails to run",
    MISMATCH: "the fused model does not match the original",
}


def describe_failure(check: CheckResult) -> str:
    """One sentence on why ``check`` failed, in its failure kind's words."""
    words = FAILURE_WORDS.get(check.failure or "", "the check failed")
    if check.failure == MISMATCH:
        worst = max(check.outputs, key=lambda o: o.max_abs_diff, default=None)
        detail = f"output {worst.name!r}: {worst.detail}" if worst and worst.detail else None
        detail = detail or _exact_detail(check)
        return f"{words} ({detail})" if detail else words
    if check.failure == ORIGINAL_CANNOT_RUN:
        return check.error or words
    error = check.error or ""
    for prefix in ("onnxruntime cannot load the fused model: ", "the fused model fails to run: "):
        error = error.removeprefix(prefix)
    return f"{words}: {error}" if error else words


@dataclass
class CheckResult:
    passed: bool
    samples: int  # per profile
    seed: int
    outputs: list[OutputCheck] = field(default_factory=list)  # over all profiles
    error: str | None = None
    # None when passed; else ORIGINAL_CANNOT_RUN, FUSED_CANNOT_RUN, CANNOT_LOAD,
    # INVALID_GRAPH or MISMATCH (FAILURE_WORDS)
    failure: str | None = None
    # The dynamic dims of the inputs (free names: "batch", "x[2]" for an unnamed one)
    dynamic_dims: list[str] = field(default_factory=list)
    profiles: list[ProfileCheck] = field(default_factory=list)
    histogram_edges: list[float] = field(default_factory=lambda: list(HISTOGRAM_EDGES))
    # Set when the original quantizes activations at run time (validate/_floor.py) or
    # computes in float16 (_floor_fp16.py): the measured floor and the tolerance each
    # output was compared with; None otherwise
    noise_floor: NoiseFloor | None = None
    # Profiles the check added and left out since the original cannot run at their sizes
    # (a model that runs only at some lengths): their dims and why, not a failure
    skipped: list[str] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)

    @property
    def max_rel_diff(self) -> float:
        return max((o.max_rel_diff for o in self.outputs), default=0.0)

    def to_dict(self) -> dict:
        """JSON-ready: plain types only, infinities and NaNs as None."""
        extra = {"max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff}
        extra["reason"] = None if self.passed else describe_failure(self)
        return _jsonable(asdict(self) | extra)


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _exact_detail(check: CheckResult) -> str:
    """Why the level-0 comparison failed, where it did (``validate/_exact.py``)."""
    exact = check.noise_floor.exact if check.noise_floor else None
    failed = [o for o in exact.outputs if not o.passed] if exact else []
    if not failed:
        return ""
    worst = max(failed, key=lambda o: o.max_abs_diff)
    return (
        f"with MatMulNBits at accuracy_level {exact.accuracy_level}, A not quantized: "
        f"output {worst.name!r}: {worst.detail}"
    )


def first_line(text: str) -> str:
    text = text.strip().splitlines()[0] if text.strip() else text
    return text[:400]
