"""The check's noise floor for models that compute in float16.

fp16 keeps 11 bits. An fp16 decoder's logits carry the model's own rounding: the original
graph is some ulps away from the same graph computed in float32, and a right fusion that
rounds at other places (a fused norm keeps its sum in float32, a fused attention its
softmax) lands about as far from the original again, more than the float16 default
(rtol 1e-2, atol 1e-3) on values near 0. So, as for activation quantizers (``_floor.py``),
the floor is measured on the original itself: the same graph computed in float32 on the
check's own feeds, each output's largest and mean absolute difference from the original
(its own fp16 error). The fused model is then held to ``atol = max(atol before, MULTIPLE
x floor's max)``, rtol as before, and a mean absolute error up to ``max(atol before,
MULTIPLE x floor's mean)`` (``NoiseFloor.widen``). An output the caller gave a tolerance
for keeps it.

The float32 graph is the original edited in place, no weight copied or widened in memory
(``in_float32``): every float16 source (an input, an initializer, a Constant or a node
whose ``dtype``/``value`` makes float16) is read through a Cast to float, which is exact;
every Cast to float16 casts to float; every declared float16 value type is float. The
inputs stay float16 (the check's own feeds, widened by their Cast), so nothing else
changes. Each widening Cast goes just before the first node that reads its source, and
onnxruntime runs it there, so a run holds the widened weights in use, not a float32 copy
of the model: the session costs what the original's does (measured: see the check's
multiple in ``fusion_core/pipeline/memory.py``). Where the edit does not load (an fp16
part it cannot widen, e.g. inside a model-local function), the floor is not measured and
the check keeps the tolerance before it (``NoiseFloor.error``). bfloat16 is left alone.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import onnx
import onnx.helper as oh

from autofusion.fusion_core.validate._floor import FLOAT16, NoiseFloor

__all__ = ["FLOAT16_MULTIPLE", "float16_floor", "float16_parts", "in_float32"]

# How far above the measured floor the tolerance may go. Measured on the float16 decoders
# of bench/_big_models.py (hidden 64 and 256, 2 to 24 layers, the check's 2 samples, batch
# 1 x 16 tokens; floor max 2.8e-3 to 4.5e-3, mean 4.4e-4 to 6.8e-4 on logits): the right
# fusions (all norms, rotary, attention, SiLU) at 1.09-1.72x the floor's max (their
# elements pass from 0.77-1.56x with rtol 1e-2, 8 samples too) and 1.18-1.38x its mean;
# the one-op forms of tests/fusion_core/rewriters/test_fp16_decoder.py at 0-2.2x the max
# (a one-ulp flip against a half-ulp floor, inside rtol) and 0-0.88x the mean. Wrong
# fusions injected into the fused decoder: a norm's gamma off by 1% at 4.5-28x the mean
# (a middle norm of 16-24 layers the least), a rotary's halves swapped (interleaved) at
# 9-360x. 2 leaves 1.45x above the right fusions' mean and 2.2x below the mildest wrong one.
FLOAT16_MULTIPLE = 2.0
_F16, _F32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
_SUFFIX = "_autofusion_f32"
# ops whose output type an attribute gives, not an input: ``dtype`` or a ``value`` tensor
_VALUE_OPS = {"Constant", "ConstantOfShape"}
_DTYPE_OPS = {
    "EyeLike",
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
}


def float16_parts(model: onnx.ModelProto) -> dict[str, int]:
    """What of the main graph is float16, counted: empty for a model without float16.

    Any float16 input, output, initializer, Constant or Cast to float16 counts, not only
    a model whose weights or outputs are mostly float16: the floor is measured, not
    assumed, so where float16 plays a small part the floor is small and the tolerance
    before it stands (``widen`` takes the larger); mixed-precision models (float32 inputs
    and outputs, float16 inside, as onnxconverter-common's ``keep_io_types`` writes them)
    and autocast exports (float32 weights cast to float16 before each MatMul) have their
    rounding inside, which is what the floor is for. A float32 model gets no floor."""
    graph = model.graph
    parts: Counter[str] = Counter()
    parts["float16 inputs"] = sum(_is_f16(v.type) for v in graph.input)
    parts["float16 outputs"] = sum(_is_f16(v.type) for v in graph.output)
    parts["float16 initializers"] = sum(t.data_type == _F16 for t in graph.initializer)
    for node in graph.node:
        if node.op_type == "Cast" and _attr(node, "to") == _F16:
            parts["Casts to float16"] += 1
        elif _makes_f16(node):
            parts[f"float16 {node.op_type}"] += 1
    return {kind: n for kind, n in parts.items() if n}


def float16_floor(parts: dict[str, int]) -> NoiseFloor:
    """The floor ``CheckResult.noise_floor`` reports for a model with these float16 parts."""
    return NoiseFloor({}, perturbation=None, multiple=FLOAT16_MULTIPLE, kind=FLOAT16, float16=parts)


@contextmanager
def in_float32(model: onnx.ModelProto) -> Iterator[None]:
    """``model`` computed in float32 for the length of the block (see the module); put
    back as it was after."""
    undo: list[Callable[[], None]] = []
    try:
        _widen(model.graph, {}, undo, main=True)
        yield
    finally:
        for step in reversed(undo):
            step()


def _widen(graph: onnx.GraphProto, outer: dict[str, str], undo: list, *, main: bool) -> None:
    """Widen ``graph`` and its subgraphs; ``outer``: the enclosing graphs' float16 sources
    and the names of their float32 Casts, which a subgraph reads as well."""
    local = {name: name + _SUFFIX for name in _sources(graph, main=main)}
    renamed = outer | local
    first: dict[str, int] = {}  # each local source's first reader, where its Cast goes
    for k, node in enumerate(graph.node):
        for name in _reads(node) & local.keys():
            first.setdefault(name, k)
        for index, name in enumerate(node.input):
            if name in renamed:
                node.input[index] = renamed[name]
                undo.append(functools.partial(node.input.__setitem__, index, name))
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == _F16:
                attr.i = _F32
                undo.append(functools.partial(setattr, attr, "i", _F16))
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                _widen(sub, renamed, undo, main=False)
    declared = [*graph.value_info, *graph.output, *([] if main else graph.input)]
    for value in declared:
        if value.name not in local:
            _widen_type(value.type, undo)
    # Each Cast just before its first reader: a subgraph's nodes must stay in order, and
    # a weight is widened when it is used, not all at once
    for k, name in sorted(((k, name) for name, k in first.items()), reverse=True):
        graph.node.insert(k, oh.make_node("Cast", [name], [local[name]], to=_F32))
    undo.append(functools.partial(_drop_casts, graph.node, {local[name] for name in first}))


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names ``node`` reads, its subgraphs' included (outer values they use)."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else attr.graphs:
            for inner in sub.node:
                names |= _reads(inner)
    return names


def _drop_casts(nodes: list, outputs: set[str]) -> None:
    for k in reversed(range(len(nodes))):
        if nodes[k].op_type == "Cast" and nodes[k].output[0] in outputs:
            del nodes[k]


def _sources(graph: onnx.GraphProto, *, main: bool) -> list[str]:
    """The names of the float16 values ``graph`` makes from no float input: its inputs
    (the main graph's: a subgraph's inputs are its parent's values, widened there), its
    initializers, and the outputs of ops whose attributes make float16."""
    names = dict.fromkeys(v.name for v in graph.input if main and _is_f16(v.type))
    names.update(dict.fromkeys(t.name for t in graph.initializer if t.data_type == _F16))
    for node in graph.node:
        if _makes_f16(node):
            names.update(dict.fromkeys(o for o in node.output if o))
    return list(names)


def _makes_f16(node: onnx.NodeProto) -> bool:
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _VALUE_OPS:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        return value is not None and value.data_type == _F16
    return node.op_type in _DTYPE_OPS and _attr(node, "dtype") == _F16


def _attr(node: onnx.NodeProto, name: str) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), None)


def _is_f16(value_type: onnx.TypeProto) -> bool:
    return value_type.HasField("tensor_type") and value_type.tensor_type.elem_type == _F16


def _widen_type(value_type: onnx.TypeProto, undo: list) -> None:
    """A float16 tensor type (alone, or in a sequence or an optional) made float."""
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type" and value_type.tensor_type.elem_type == _F16:
        value_type.tensor_type.elem_type = _F32
        undo.append(functools.partial(setattr, value_type.tensor_type, "elem_type", _F16))
    elif kind in ("sequence_type", "optional_type"):
        _widen_type(getattr(value_type, kind).elem_type, undo)
