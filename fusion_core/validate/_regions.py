"""Which fused region drifts: each fusion's outputs against the original tensors.

Every node a rewrite creates carries provenance (``autofusion.pattern`` and
``autofusion.replaced_nodes``), and a rewrite gives each replacement value the name of
the original value it stands in for. So the outputs of a fused region that the rest of
the graph reads have the same names in both models, and comparing them names the
region that computes something else.

Only those region outputs become extra graph outputs, of a copy of each model used for
this comparison alone (both run with onnxruntime's optimizations disabled, so nothing
is blocked by the extra outputs). Errors flow downstream, so the first failing region in
graph order is the one reported as the culprit; later failures may be its echo.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from autofusion.fusion_core import provenance
from autofusion.fusion_core.validate._sessions import make_session
from autofusion.fusion_core.validate._stats import ErrorStats, Tolerance

__all__ = ["RegionCheck", "RegionReport", "compare_regions", "fused_regions", "tensor_diffs"]


@dataclass(frozen=True)
class RegionCheck:
    pattern: str
    fused_nodes: list[str]
    replaced_nodes: list[str]
    tensors: list[str]  # region outputs compared by name
    max_abs_diff: float
    max_rel_diff: float
    passed: bool


@dataclass
class RegionReport:
    regions: list[RegionCheck] = field(default_factory=list)
    error: str | None = None

    @property
    def first_drift(self) -> RegionCheck | None:
        return next((r for r in self.regions if not r.passed), None)

    def to_dict(self) -> dict:
        first = self.first_drift
        return {
            "regions": [_finite(asdict(r)) for r in self.regions],
            "first_drift": _finite(asdict(first)) if first is not None else None,
            "error": self.error,
        }


def fused_regions(fused: onnx.ModelProto) -> list[tuple[str, list[str], list[onnx.NodeProto]]]:
    """(pattern, replaced original nodes, fused nodes) per applied fusion, in graph order."""
    regions: dict[tuple[str, tuple[str, ...]], list[onnx.NodeProto]] = {}
    for node in fused.graph.node:
        props = provenance.metadata(node)
        pattern = provenance.pattern(props)
        if pattern is not None:
            key = (pattern, tuple(provenance.replaced_nodes(props) or ()))
            regions.setdefault(key, []).append(node)
    return [(pattern, list(replaced), nodes) for (pattern, replaced), nodes in regions.items()]


def compare_regions(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
    *,
    rtol: float,
    atol: float,
) -> RegionReport:
    """Compare every fused region's outputs with the original tensors of the same name."""
    report = RegionReport()
    original_values = {o for n in original.graph.node for o in n.output}
    plan = []
    for pattern, replaced, nodes in fused_regions(fused):
        tensors = [o for n in nodes for o in n.output if o and o in original_values]
        plan.append((pattern, replaced, [n.name for n in nodes], tensors))
    wanted = sorted({t for *_, tensors in plan for t in tensors})
    if not wanted:
        return report
    try:
        worst = tensor_diffs(original, fused, wanted, feeds, rtol=rtol, atol=atol)
    except Exception as exc:  # onnxruntime raises many types; report them all
        report.error = f"could not run the models with the region outputs exposed: {exc}"
        return report
    for pattern, replaced, fused_nodes, tensors in plan:
        diffs = [worst[t] for t in tensors]
        report.regions.append(
            RegionCheck(
                pattern=pattern,
                fused_nodes=fused_nodes,
                replaced_nodes=replaced,
                tensors=tensors,
                max_abs_diff=max((d[0] for d in diffs), default=0.0),
                max_rel_diff=max((d[1] for d in diffs), default=0.0),
                passed=all(d[2] for d in diffs),
            )
        )
    return report


def tensor_diffs(
    a: onnx.ModelProto,
    b: onnx.ModelProto,
    names: list[str],
    feeds: list[dict[str, np.ndarray]],
    *,
    rtol: float,
    atol: float,
) -> dict[str, tuple[float, float, bool]]:
    """(max abs diff, max rel diff, within tolerance) of each named tensor of both models
    over the feeds; onnxruntime's errors propagate."""
    reference = make_session(_with_outputs(a, names))
    candidate = make_session(_with_outputs(b, names))
    # the check's own comparison rule (NaN matches NaN; shape or dtype differences fail)
    stats = {name: ErrorStats(Tolerance(rtol, atol)) for name in names}
    for feed in feeds:
        expected = reference.run(names, feed)
        actual = candidate.run(names, feed)
        for name, want, got in zip(names, expected, actual, strict=True):
            stats[name].update(np.asarray(want), np.asarray(got))
    return {name: (s.max_abs, s.max_rel, s.passed) for name, s in stats.items()}


def _with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs ``names`` (types left for onnxruntime)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    typed = {v.name: v for v in copy.graph.value_info}
    for name in names:
        if name in present:
            continue
        info = onnx.ValueInfoProto()
        if name in typed:
            info.CopyFrom(typed[name])
        else:
            info.name = name
        copy.graph.output.append(info)
    return copy


def _finite(data: dict) -> dict:
    """JSON has no infinity: a shape or dtype mismatch reads as None."""
    return {
        k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in data.items()
    }
