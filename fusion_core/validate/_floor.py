"""The check's noise floor for models that quantize their activations at run time.

Some kernels round their float input to a coarse grid inside the op. onnxruntime's
``com.microsoft.MatMulNBits`` reads ``accuracy_level`` as the least precision of input A
(its schema: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8); only level 4 quantizes A, to int8
per block, and it is the level onnxruntime-genai's builder writes for CPU.
``DynamicQuantizeLinear`` (so also MatMulInteger and ConvInteger fed by it),
``com.microsoft.DynamicQuantizeMatMul`` and ``com.microsoft.DynamicQuantizeLSTM`` quantize
their float input X to 8 bits. A fusion upstream sums in another order and moves an
activation by an ulp or so; where that crosses a rounding boundary the quantized value
moves by a whole step, and over the layers the outputs differ by far more than the fp32
tolerance, for a right fusion as for a wrong one.

So the floor is measured on the original itself. The original runs again on the check's
own feeds with every activation such an op reads moved by at most ``PERTURBATION`` of its
magnitude (``x' = x + PERTURBATION * x * sin(4099 x)``: up to two float32 ulps, a sign
and size that vary per element); an output's floor is the
largest and the mean absolute difference this makes. That is the change a reordered fp32
sum makes, put where such a change is amplified. Why not elsewhere: a decoder's graph
inputs are token ids, nothing to perturb; onnxruntime's own optimizations against none
measure only the fusions it happens to find (a floor of 0 where it finds none); and
scaling x alone would not do, since a block's int8 scale scales with it and no rounding
moves.

The fused model is then compared per float output element by element with ``atol =
max(configured atol, FLOOR_MULTIPLE * floor's max)``, rtol as configured, and its mean
absolute error may not pass ``max(configured atol, FLOOR_MULTIPLE * floor's mean)``:
never looser than ``FLOOR_MULTIPLE`` times what the original itself does under the
perturbation, never tighter than configured. The mean is what catches a wrong fusion:
rounding flips are few and large, a wrong gamma moves every element. An
output the caller gave a tolerance for keeps it (the way to ask for the fp32 check on
such a model). A model without these ops gets no floor: the check as before. Only the
main graph is read; a quantizer inside a subgraph (If, Loop) is not perturbed.

``NoiseFloor`` also reports the floor of a model that computes in float16
(``_floor_fp16.py``, ``kind`` ``FLOAT16``): the same widening of a floor measured
another way, applied to the float16 defaults as well.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import onnx.helper as oh

from autofusion.fusion_core.validate._exact import ExactCheck
from autofusion.fusion_core.validate._stats import ErrorStats, Tolerance

__all__ = [
    "FLOAT16",
    "FLOOR_MULTIPLE",
    "PERTURBATION",
    "QUANTIZED",
    "NoiseFloor",
    "OutputFloor",
    "activation_quantizers",
]

# NoiseFloor.kind: what the original does that makes its own noise
QUANTIZED = "quantized activations"  # this module
FLOAT16 = "float16"  # _floor_fp16.py

# Relative: two float32 ulps of x at most (four where x's mantissa nears 2), about what
# a reordered sum moves an activation by. The floor counts rare events (an int8 rounding
# crossed), so the perturbation must cross some on any host and feeds: at 2**-24 (half an
# ulp, which rounds most values back to themselves) the int4 decoder of
# tests/fusion_core/test_noise_floor.py measured a floor of 2.1e-6 on an AVX2 host (AMD
# EPYC) on the check's feeds while its right fusions moved the logits by 0.073; at 2**-23
# the same feeds crossed nothing either (other feeds did: 0.065); at 2**-22 and 2**-20
# the floor was 0.094 and 0.087 (mean 5.1e-3, 6.7e-3).
PERTURBATION = 2.0**-22
# How far above the measured floor the tolerance may go. On int4 decoders at accuracy 4
# (hidden 256, 4 and 18 layers) the right fusions landed at 0.7-0.95x the floor's max and
# 0.9-1.1x its mean; a norm's gamma off by 1% at 4-40x the mean (4 layers; at 2**-24). With
# the perturbation at 2**-22 the last norm's wrong gamma is 2.2x the mean (AVX2 host): 2
# still fails it, narrowly, and the level-0 comparison (_exact.py) is the second net.
FLOOR_MULTIPLE = 2.0
_FREQUENCY = 4099.0  # sin(4099 x): neighbouring values get unrelated perturbations
_MS = "com.microsoft"
# op (domain, type) -> the index of the float input it quantizes
_QUANTIZERS = {
    ("", "DynamicQuantizeLinear"): 0,
    (_MS, "DynamicQuantizeMatMul"): 0,
    (_MS, "DynamicQuantizeLSTM"): 0,
    (_MS, "MatMulNBits"): 0,
}
_INT8_ACCURACY = 4  # MatMulNBits' accuracy_level that quantizes A


@dataclass(frozen=True)
class OutputFloor:
    name: str
    # max |perturbed original - original| over the check's samples (float16: |original
    # computed in float32 - original|)
    floor_abs: float
    floor_mean: float  # mean |perturbed original - original|, likewise
    rtol: float  # the element-wise tolerance the fused model was compared with
    atol: float
    mean_limit: float  # the fused model's mean |error| may not pass this


@dataclass
class FloorStats(ErrorStats):
    """Error statistics that also fail when the mean error passes ``mean_limit``."""

    mean_limit: float = math.inf
    multiple: float = FLOOR_MULTIPLE

    @property
    def passed(self) -> bool:
        return super().passed and not self.mean_abs > self.mean_limit

    def detail(self) -> str:
        if super().detail() or self.passed:
            return super().detail()
        return (
            f"mean abs diff {self.mean_abs:.3g} exceeds {self.mean_limit:.3g} "
            f"({self.multiple:g} x the noise floor's mean)"
        )


@dataclass
class NoiseFloor:
    """What ``CheckResult.noise_floor`` reports (see the module docstring)."""

    quantizers: dict[str, int]  # op -> how many, e.g. {"MatMulNBits accuracy_level 4": 29}
    perturbation: float | None = PERTURBATION  # None: the float16 floor moves no activation
    multiple: float = FLOOR_MULTIPLE
    outputs: list[OutputFloor] = field(default_factory=list)
    error: str | None = None  # why it could not be measured: the tolerance before it then
    reason: str = ""
    # Both models again with MatMulNBits at accuracy_level 0 (validate/_exact.py): set
    # when the original has MatMulNBits at level 4; None for the other quantizers
    exact: ExactCheck | None = None
    kind: str = QUANTIZED
    # FLOAT16: what of the main graph is float16, counted (_floor_fp16.float16_parts)
    float16: dict[str, int] = field(default_factory=dict)

    def widen(self, tols: Mapping[str, Tolerance], floors: Mapping[str, ErrorStats]) -> dict:
        """Each output's tolerance, widened to the floor where the caller gave none."""
        out = dict(tols)
        for name, tol in tols.items():
            floor = floors.get(name)
            if floor is None or not self._widens(tol) or not math.isfinite(floor.max_abs):
                continue
            atol = max(tol.atol, self.multiple * floor.max_abs)
            source = "noise floor" if atol > tol.atol else tol.source
            out[name] = replace(tol, atol=atol, source=source)
            mean_limit = max(tol.atol, self.multiple * floor.mean_abs)
            self.outputs.append(
                OutputFloor(name, floor.max_abs, floor.mean_abs, tol.rtol, atol, mean_limit)
            )
        self.reason = self._cause() + (
            f"; each element is compared with atol up to {self.multiple:g} x the floor's "
            "max, and the mean error may not pass that multiple of its mean"
        )
        return out

    def _widens(self, tol: Tolerance) -> bool:
        # The float16 floor stands for what the float16 default guesses at; the quantizers'
        # floor only for the configured (fp32) tolerance. The caller's own is kept.
        if self.kind == FLOAT16:
            return tol.source == "configured" or tol.source.startswith("default for float")
        return tol.source == "configured"

    def _cause(self) -> str:
        if self.kind == FLOAT16:
            parts = ", ".join(f"{n} x{k}" for n, k in self.float16.items())
            return (
                f"the model computes in float16 ({parts}): the same graph computed in "
                "float32 on the same inputs is the floor away from the original (its own "
                "float16 rounding)"
            )
        ops = ", ".join(f"{n} x{k}" for n, k in self.quantizers.items())
        return (
            f"the model quantizes activations at run time ({ops}): moving each activation "
            f"they read by at most {self.perturbation:.2g} of its size moves the original's "
            "outputs by the floor"
        )

    def stats(self, name: str, tol: Tolerance) -> ErrorStats:
        """The statistics ``name`` is judged by: with its mean limit where it has a floor."""
        limit = next((o.mean_limit for o in self.outputs if o.name == name), None)
        if limit is None:
            return ErrorStats(tol)
        return FloorStats(tol, mean_limit=limit, multiple=self.multiple)


def activation_quantizers(model: onnx.ModelProto) -> tuple[dict[str, int], list[str]]:
    """The main graph's ops that quantize a float activation at run time, counted by
    kind, and the activations they read (each once)."""
    kinds: Counter[str] = Counter()
    names: dict[str, None] = {}
    for node in model.graph.node:
        index = _QUANTIZERS.get((node.domain or "", node.op_type))
        if index is None or len(node.input) <= index or not node.input[index]:
            continue
        if node.op_type == "MatMulNBits":
            level = next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)
            if level != _INT8_ACCURACY:
                continue
            kinds[f"MatMulNBits accuracy_level {level}"] += 1
        else:
            kinds[node.op_type] += 1
        names[node.input[index]] = None
    return dict(kinds), list(names)


@contextmanager
def perturbed(model: onnx.ModelProto, activations: Sequence[str]) -> Iterator[None]:
    """``model`` with every quantizer reading its activation moved by the perturbation,
    for the length of the block; put back as it was after (no copy of the weights)."""
    readers = _readers(model, activations)
    dtypes = _float_types(model)
    added = []
    for k, name in enumerate(activations):
        added += _perturb_nodes(name, f"_autofusion_floor_{k}", dtypes.get(name))
    saved = [(node, i, node.input[i]) for node, i in readers]
    for node, i, name in saved:
        node.input[i] = f"_autofusion_floor_{activations.index(name)}"
    model.graph.node.extend(added)  # onnxruntime orders the nodes itself
    try:
        yield
    finally:
        del model.graph.node[len(model.graph.node) - len(added) :]
        for node, i, name in saved:
            node.input[i] = name


def _readers(model: onnx.ModelProto, activations: Sequence[str]) -> list[tuple]:
    wanted = set(activations)
    found = []
    for node in model.graph.node:
        index = _QUANTIZERS.get((node.domain or "", node.op_type))
        if index is not None and len(node.input) > index and node.input[index] in wanted:
            found.append((node, index))
    return found


def _float_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of the values the graph declares, and MatMulNBits' A as its scales'
    (the schema ties them: T1)."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info]}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:
        if node.op_type == "MatMulNBits" and len(node.input) > 2 and node.input[2] in types:
            types.setdefault(node.input[0], types[node.input[2]])
    return types


# One ulp at most of each float type, relative
_ULPS = {onnx.TensorProto.FLOAT16: 2.0**-11, onnx.TensorProto.BFLOAT16: 2.0**-8}


def _perturb_nodes(name: str, out: str, dtype: int | None) -> list[onnx.NodeProto]:
    """``out = x + eps * x * sin(4099 x)``, computed in float32, cast back to x's type."""
    dtype = dtype or onnx.TensorProto.FLOAT
    eps = _ULPS.get(dtype, PERTURBATION)
    p = out + "_"
    return [
        oh.make_node("Cast", [name], [p + "x"], to=onnx.TensorProto.FLOAT),
        _const(p + "f", _FREQUENCY),
        _const(p + "e", eps),
        oh.make_node("Mul", [p + "x", p + "f"], [p + "xf"]),
        oh.make_node("Sin", [p + "xf"], [p + "s"]),
        oh.make_node("Mul", [p + "x", p + "s"], [p + "xs"]),
        oh.make_node("Mul", [p + "xs", p + "e"], [p + "d"]),
        oh.make_node("Add", [p + "x", p + "d"], [p + "y"]),
        oh.make_node("Cast", [p + "y"], [out], to=dtype),
    ]


def _const(name: str, value: float) -> onnx.NodeProto:
    tensor = onnx.numpy_helper.from_array(np.array(value, np.float32), name)
    return oh.make_node("Constant", [], [name], value=tensor)


def measure_floors(
    session_of: Callable[[], object],
    names: Sequence[str],
    runs: Sequence[tuple[Mapping[str, np.ndarray], Sequence[np.ndarray]]],
) -> dict[str, ErrorStats]:
    """Each float output's differences between the edited original (``session_of()``:
    perturbed, or computed in float32) and the original's outputs ``runs`` on the same
    feeds, compared in float64 (a float32 output against a float16 one)."""
    session = session_of()
    stats = {n: ErrorStats(Tolerance(0.0, 0.0)) for n in names}
    for feed, expected in runs:
        for name, want, got in zip(names, expected, session.run(names, dict(feed)), strict=True):
            if np.asarray(want).dtype.kind == "f":
                wide = np.asarray(want, np.float64)
                stats[name].update(wide, np.asarray(got).astype(np.float64))
    return {n: s for n, s in stats.items() if s.elements}


def external_folder(path: str | os.PathLike) -> str:
    """Where a model file's external data lies (its own folder)."""
    return os.fspath(os.path.dirname(os.path.abspath(path)))
