"""The check's second comparison for int4 models: both models at ``accuracy_level`` 0.

The noise floor (``_floor.py``) bounds what the check resolves by the original's own
noise: on an 18-layer int4 decoder at accuracy_level 4 (A quantized to int8 in the
kernel) that noise is as large as a norm's gamma off by 1% in a middle or last layer,
so such a fused model passes the floor. ``com.microsoft.MatMulNBits`` has a switch the
dynamic quantizers lack: at accuracy_level 0 it sums A in fp32 against the dequantized
weights, with no rounding of A to hide a wrong fusion. So when the original has
MatMulNBits at level 4, both models run again on the check's own feeds with every
main-graph MatMulNBits at level 0 (the fused model's too: fusions keep or merge them),
compared with the tolerance each output had before the floor widened it (configured,
or the caller's per output). The check passes only if both comparisons pass.

No weights are copied or written: each model's graph is read without its weights, the
attribute set, and onnxruntime reads the weights from where the model's data file lies
(the session option ``make_session(data_folder=...)``, as the floor's perturbed run); a
proto is edited in place and put back. One session at a time, as ``compare_models``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.helper as oh

from autofusion.fusion_core.validate._stats import ErrorStats, Tolerance

__all__ = [
    "EXACT_LEVEL",
    "ExactCheck",
    "ExactOutput",
    "at_level",
    "nbits_at_int8",
    "nbits_count",
    "run_exact",
]

EXACT_LEVEL = 0  # MatMulNBits' accuracy_level with A unquantized (fp32 sums on CPU)
_INT8_LEVEL = 4  # the level whose rounding of A the floor stands for


@dataclass(frozen=True)
class ExactOutput:
    name: str
    max_abs_diff: float
    mean_abs_diff: float
    rtol: float
    atol: float
    passed: bool
    detail: str = ""


@dataclass
class ExactCheck:
    """What ``NoiseFloor.exact`` reports (see the module docstring)."""

    nodes: dict[str, int]  # MatMulNBits set to the level: {"original": 29, "fused": 25}
    accuracy_level: int = EXACT_LEVEL
    passed: bool | None = None  # None: not run (``reason``) or could not run (``error``)
    max_abs_diff: float = 0.0
    outputs: list[ExactOutput] = field(default_factory=list)
    error: str | None = None
    reason: str = ""
    seconds: float = 0.0  # both level-0 sessions: load and runs


def _nbits(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [
        n
        for n in model.graph.node
        if n.op_type == "MatMulNBits" and n.domain in ("com.microsoft", "")
    ]


def _level(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)


def nbits_count(model: onnx.ModelProto) -> int:
    """How many MatMulNBits the main graph has (``at_level`` sets each)."""
    return len(_nbits(model))


def nbits_at_int8(model: onnx.ModelProto) -> int:
    """How many of the main graph's MatMulNBits quantize A to int8 (accuracy_level 4)."""
    return sum(_level(n) == _INT8_LEVEL for n in _nbits(model))


@contextmanager
def at_level(model: onnx.ModelProto, level: int = EXACT_LEVEL) -> Iterator[int]:
    """``model`` with every main-graph MatMulNBits at accuracy_level ``level`` for the
    length of the block (yields how many); put back as it was after."""
    nodes = _nbits(model)
    saved = [(n, list(n.attribute)) for n in nodes]
    for node in nodes:
        kept = [a for a in node.attribute if a.name != "accuracy_level"]
        del node.attribute[:]
        node.attribute.extend([*kept, oh.make_attribute("accuracy_level", level)])
    try:
        yield len(nodes)
    finally:
        for node, attributes in saved:
            del node.attribute[:]
            node.attribute.extend(attributes)


def run_exact(
    open_original: Callable[[], object],
    open_fused: Callable[[], object],
    names: Sequence[str],
    feeds: Sequence[Mapping[str, np.ndarray]],
    tols: Mapping[str, Tolerance],
    check: ExactCheck,
) -> None:
    """The level-0 original on ``feeds`` (its session released), then the level-0 fused
    model on the same feeds, each output judged by ``tols``; the verdict into ``check``."""
    session = open_original()
    expected = [session.run(list(names), dict(feed)) for feed in feeds]
    del session  # its weights with it: one session at a time
    session = open_fused()
    stats = {n: ErrorStats(tols[n]) for n in names}
    for feed, want in zip(feeds, expected, strict=True):
        for name, w, g in zip(names, want, session.run(list(names), dict(feed)), strict=True):
            stats[name].update(np.asarray(w), np.asarray(g))
    check.outputs = [
        ExactOutput(
            n, s.max_abs, s.mean_abs, s.tolerance.rtol, s.tolerance.atol, s.passed, s.detail()
        )
        for n, s in stats.items()
    ]
    check.max_abs_diff = max((o.max_abs_diff for o in check.outputs), default=0.0)
    check.passed = all(o.passed for o in check.outputs)
