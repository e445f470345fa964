"""Error statistics of one output over many samples, accumulated sample by sample.

For expected values ``w`` and actual values ``g`` (both read as float64):

- ``err = |g - w|``; two NaNs, or two infinities of the same sign, count as equal
  (``err = 0``); any other NaN or infinity on either side makes ``err = inf``.
- max abs error ``max(err)``; max relative error ``max(err / max(|w|, 1e-12))``;
  mean abs error ``sum(err) / n`` over the finite errors.
- cosine similarity ``sum(w * g) / (||w|| * ||g||)`` over the elements where both are
  finite (1.0 when both norms are 0, 0.0 when only one is).
- an element passes when ``err <= atol + rtol * |w|`` (numpy's ``allclose`` rule);
  with ``rtol = atol = 0`` that is exact equality.
- a histogram of ``err`` per decade: ``HISTOGRAM_EDGES`` are the lower edges, bin ``i``
  holds ``edges[i] <= err < edges[i + 1]`` and the last bin ``err >= 1`` (infinite
  errors included), so the counts sum to the number of compared elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["HISTOGRAM_EDGES", "ErrorStats", "Tolerance", "default_tolerance"]

# Lower edges of the decade bins: [0, 1e-8), [1e-8, 1e-7), ..., [0.1, 1), [1, inf].
HISTOGRAM_EDGES: tuple[float, ...] = (0.0, *(10.0**k for k in range(-8, 1)))
_REL_FLOOR = 1e-12


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``; ``source`` says where it came from."""

    rtol: float
    atol: float
    source: str = "configured"

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0


# Defaults where the configured (fp32) tolerance would be meaningless.
_FLOAT_DEFAULTS = {"float16": (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2)}
_CONFIGURED = {"float32", "float64", "float", "double"}


def default_tolerance(dtype: str, rtol: float, atol: float) -> Tolerance:
    """The tolerance an output of ``dtype`` (an ONNX type name) gets when none is given.

    float32/float64 use the configured ``rtol``/``atol``; float16 uses rtol 1e-2 and
    atol 1e-3; bfloat16 rtol 2e-2 and atol 1e-2; integers and bool must be exact.
    Other floating types (float8 variants) use the configured values.
    """
    if dtype in _FLOAT_DEFAULTS:
        r, a = _FLOAT_DEFAULTS[dtype]
        return Tolerance(r, a, f"default for {dtype}")
    if dtype in _CONFIGURED or dtype.startswith("float"):
        return Tolerance(rtol, atol, "configured")
    return Tolerance(0.0, 0.0, f"exact for {dtype}")


@dataclass
class ErrorStats:
    """Running error statistics of one output against one tolerance."""

    tolerance: Tolerance
    elements: int = 0
    mismatches: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    sum_abs: float = 0.0
    finite: int = 0
    dot: float = 0.0
    norm_expected: float = 0.0
    norm_actual: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * len(HISTOGRAM_EDGES))
    problem: str = ""  # a structural failure (shape, dtype), which no number describes

    def fail(self, problem: str) -> None:
        """Record a failure that is not an element-wise error (e.g. a shape mismatch)."""
        self.problem = self.problem or problem
        self.max_abs = self.max_rel = math.inf

    def update(self, expected: np.ndarray, actual: np.ndarray) -> None:
        """Add one sample's values of this output."""
        if expected.shape != actual.shape:
            self.fail(f"shape {list(actual.shape)} != {list(expected.shape)}")
            return
        if expected.dtype != actual.dtype:
            self.fail(f"dtype {actual.dtype} != {expected.dtype}")
            return
        if expected.dtype.kind not in "biuf" and expected.dtype.name != "bfloat16":
            self._update_opaque(expected, actual)
            return
        w, g = expected.astype(np.float64).ravel(), actual.astype(np.float64).ravel()
        err = _abs_error(w, g)
        self.elements += err.size
        self.histogram = [a + b for a, b in zip(self.histogram, _histogram(err), strict=True)]
        if err.size == 0:
            return
        # Non-finite expected values only ever match exactly (err is then 0).
        scale = np.abs(np.where(np.isfinite(w), w, 0.0))
        bad = err > self.tolerance.atol + self.tolerance.rtol * scale
        rel = err / np.maximum(scale, _REL_FLOOR)
        self.mismatches += int(bad.sum())
        self.max_abs = max(self.max_abs, float(err.max()))
        self.max_rel = max(self.max_rel, float(rel.max()))
        finite_err = err[np.isfinite(err)]
        self.sum_abs += float(finite_err.sum())
        self.finite += finite_err.size
        both = np.isfinite(w) & np.isfinite(g)
        self.dot += float(np.dot(w[both], g[both]))
        self.norm_expected += float(np.dot(w[both], w[both]))
        self.norm_actual += float(np.dot(g[both], g[both]))

    def _update_opaque(self, expected: np.ndarray, actual: np.ndarray) -> None:
        # Strings and other non-numbers: equal or not, element by element.
        differ = int((expected != actual).sum())
        self.elements += expected.size
        self.mismatches += differ
        self.histogram[0] += expected.size - differ
        self.histogram[-1] += differ
        if differ:
            self.max_abs = self.max_rel = math.inf

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.finite if self.finite else 0.0

    @property
    def cosine_similarity(self) -> float | None:
        """None when nothing was compared; see the module docstring for the zero cases."""
        if self.elements == 0:
            return None
        if self.norm_expected == 0 and self.norm_actual == 0:
            return 1.0
        if self.norm_expected == 0 or self.norm_actual == 0:
            return 0.0
        return self.dot / math.sqrt(self.norm_expected * self.norm_actual)

    @property
    def passed(self) -> bool:
        return not self.problem and self.mismatches == 0

    def detail(self) -> str:
        """Why it failed, in words; empty when it passed."""
        if self.problem:
            return self.problem
        if not self.mismatches:
            return ""
        tol = self.tolerance
        rule = (
            "exact equality" if tol.exact else f"atol {tol.atol:g} + rtol {tol.rtol:g} * |expected|"
        )
        return (
            f"max abs diff {self.max_abs:.3g} exceeds {rule} "
            f"at {self.mismatches} of {self.elements} elements"
        )


def _abs_error(w: np.ndarray, g: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - w)
    same = (w == g) | (np.isnan(w) & np.isnan(g))
    err[same] = 0.0
    err[np.isnan(err)] = math.inf
    return err


def _histogram(err: np.ndarray) -> list[int]:
    # searchsorted(side="right") - 1 puts err == edge into the bin that starts there.
    bins = np.searchsorted(np.asarray(HISTOGRAM_EDGES), err, side="right") - 1
    return np.bincount(bins, minlength=len(HISTOGRAM_EDGES)).tolist()
