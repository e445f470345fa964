"""Range analysis for fp16: which fused regions would leave float16 behind.

The original model runs in onnxruntime with every tensor a fused region touches exposed
(its outputs, and the intermediate tensors it removed: provenance lists them as
``autofusion.replaced_values``); each tensor's observed range over the samples is
recorded. A fused region is flagged when its values

- overflow: some |x| exceeds float16's largest finite value, 65504 (becomes inf), or
- underflow: more than 1% of its nonzero values are below float16's smallest normal,
  2^-14 ~ 6.1e-5 (they keep at most a few bits, or become 0). A few tiny values are in
  almost every tensor and cost nothing; a tensor made of them loses its precision.

Regions of patterns marked ``keep_fp32`` (the normalizations) are not flagged: their
fused op is meant to stay in fp32. They and the flagged regions together are the block
list a float16 conversion should honour (``fp32_nodes``: fused node names).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from autofusion.fusion_core import provenance
from autofusion.fusion_core.validate._regions import _with_outputs, fused_regions
from autofusion.fusion_core.validate._sessions import make_session

__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "PrecisionReport", "RangeFlag", "check_fp16"]

FP16_MAX = float(np.finfo(np.float16).max)  # 65504
FP16_MIN_NORMAL = float(np.finfo(np.float16).tiny)  # 2**-14
UNDERFLOW_FRACTION = 0.01  # of the nonzero values


@dataclass(frozen=True)
class RangeFlag:
    pattern: str
    fused_nodes: list[str]
    tensor: str
    problem: str  # "overflow" or "underflow"
    max_abs: float
    min_nonzero_abs: float | None
    subnormal_fraction: float  # of the nonzero values, below FP16_MIN_NORMAL


@dataclass
class PrecisionReport:
    precision: str = "fp16"
    flags: list[RangeFlag] = field(default_factory=list)
    kept_fp32: list[str] = field(default_factory=list)  # fused nodes of keep_fp32 patterns
    error: str | None = None

    @property
    def fp32_nodes(self) -> list[str]:
        flagged = [n for f in self.flags for n in f.fused_nodes]
        return sorted(set(self.kept_fp32) | set(flagged))

    def to_dict(self) -> dict:
        return {
            "precision": self.precision,
            "flags": [asdict(f) for f in self.flags],
            "kept_fp32": self.kept_fp32,
            "fp32_nodes": self.fp32_nodes,
            "error": self.error,
        }


def check_fp16(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
    keep_fp32: set[str],
) -> PrecisionReport:
    """Flag fused regions whose values leave float16, from the original's observed ranges."""
    report = PrecisionReport()
    original_values = {o for n in original.graph.node for o in n.output}
    regions = []
    for pattern, _, nodes in fused_regions(fused):
        names = [n.name for n in nodes]
        if pattern in keep_fp32:
            report.kept_fp32 += names
            continue
        tensors = [o for n in nodes for o in n.output if o in original_values]
        tensors += [t for n in nodes for t in _replaced_values(n) if t in original_values]
        regions.append((pattern, names, sorted(set(tensors))))
    wanted = sorted({t for *_, tensors in regions for t in tensors})
    if not wanted:
        return report
    try:
        session = make_session(_with_outputs(original, wanted))
        ranges: dict[str, _Range] = {}
        for feed in feeds:
            for name, array in zip(wanted, session.run(wanted, feed), strict=True):
                ranges[name] = _merge(ranges.get(name), _range(np.asarray(array)))
    except Exception as exc:  # onnxruntime raises many types; report them all
        report.error = f"could not record the original's ranges: {exc}"
        return report
    for pattern, names, tensors in regions:
        for tensor in tensors:
            max_abs, min_nonzero, tiny, nonzero = ranges.get(tensor, (0.0, None, 0, 0))
            fraction = tiny / nonzero if nonzero else 0.0
            problem = None
            if max_abs > FP16_MAX:
                problem = "overflow"
            elif fraction > UNDERFLOW_FRACTION:
                problem = "underflow"
            if problem:
                flag = RangeFlag(pattern, names, tensor, problem, max_abs, min_nonzero, fraction)
                report.flags.append(flag)
    return report


def _replaced_values(node: onnx.NodeProto) -> list[str]:
    return provenance.replaced_values(provenance.metadata(node))


_Range = tuple[float, float | None, int, int]  # max |x|, min nonzero |x|, tiny, nonzero


def _range(array: np.ndarray) -> _Range:
    """Magnitudes of a float tensor; nothing for any other."""
    if not np.issubdtype(array.dtype, np.floating) or array.size == 0:
        return 0.0, None, 0, 0
    magnitude = np.abs(array[np.isfinite(array)].astype(np.float64))
    nonzero = magnitude[magnitude > 0]
    return (
        float(magnitude.max()) if magnitude.size else 0.0,
        float(nonzero.min()) if nonzero.size else None,
        int((nonzero < FP16_MIN_NORMAL).sum()),
        int(nonzero.size),
    )


def _merge(a: _Range | None, b: _Range) -> _Range:
    if a is None:
        return b
    smallest = [v for v in (a[1], b[1]) if v is not None]
    return max(a[0], b[0]), (min(smallest) if smallest else None), a[2] + b[2], a[3] + b[3]
