"""What the written model declares of its intermediate values: the profile's decision.

The pre-passes infer a type and a shape for every value (the rewriters need them), and
onnx-ir writes each as the file's ``value_info``. What a file declares is not neutral to
the runtime that loads it: onnxruntime's graph optimizer fuses by the shapes it can prove,
and with every intermediate shape declared its CPU provider turns the residual Add and
LayerNormalization of post-norm encoders into SkipLayerNormalization, a kernel that runs
slower there than the two ops (docs/benchmarks.md section 39). The target profile says
which form its runtime wants (``TargetProfile.value_info``), a run may say otherwise
(``OptimizeConfig.value_info``):

* ``all``: every value's inferred type and shape is written;
* ``none``: only what the graph's interface declares (inputs, outputs, weights), so the
  runtime infers the rest itself, as it does for an exporter's file. A value whose shape
  onnx's own inference gets wrong without its declaration keeps it (onnx 1.2x infers the
  last dim of ONNX ``Attention``'s 3-D output as 0, which a branch that reads it then
  contradicts: the checker refuses such a file).

The form is made on the model itself, before the check and the measurement, so that what
is checked, timed and saved (``result.model`` by any writer) is the file the user gets.
What was left out stays known to the run (``WrittenForm.inferred``: measured selection's
region signatures read shapes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import onnx
import onnx_ir as ir

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.cost import load_target_profile
from autofusion.fusion_core.ir import weightless_proto

__all__ = ["Inferred", "ValueInfo", "WrittenForm", "value_info_of", "written_form"]

logger = logging.getLogger(__name__)

ValueInfo = Literal["all", "none"]
_SIZES_BYTES = 1024  # the weights that inference reads (split sizes, Reshape targets)
# What the written form left out of one value: its element type and its shape
Inferred = tuple[ir.TypeProtocol | None, ir.Shape | None]


@dataclass
class WrittenForm:
    """What ``written_form`` did: in the report's words, and what it left out by name."""

    lines: list[str] = field(default_factory=list)
    inferred: dict[str, Inferred] = field(default_factory=dict)


def value_info_of(config: OptimizeConfig) -> ValueInfo:
    """The run's own choice, else its target profile's."""
    if config.value_info is not None:
        return config.value_info
    return load_target_profile(config.target_profile).value_info


def written_form(model: ir.Model, config: OptimizeConfig) -> WrittenForm:
    """Leave out, in place, what ``model`` should not declare (module doc)."""
    if value_info_of(config) == "all":
        return WrittenForm()
    weights = {v.name: _forget(v) for v in _weights(model.graph) if _known(v)}
    values = {v.name: _forget(v) for v in _intermediates(model.graph) if _known(v)}
    kept = _restore_misread(model, values)
    if not weights and not values:
        return WrittenForm()
    source = "the run's value_info" if config.value_info else f"profile {config.target_profile!r}"
    line = (
        f"written form: the types and shapes of {len(values) - len(kept)} intermediate values "
        f"and {len(weights)} weights left out (value_info: none, from {source}); the runtime "
        "infers them as it loads the model"
    )
    if kept:
        line += f"; {len(kept)} kept, which onnx's inference gets wrong without: {_few(kept)}"
    return WrittenForm([line], {**weights, **{k: v for k, v in values.items() if k not in kept}})


def _weights(graph: ir.Graph) -> Iterator[ir.Value]:
    """Every weight of ``graph`` and its subgraphs that is not an input: its tensor
    says its type and shape."""
    for each in (graph, *_subgraphs(graph)):
        yield from (v for v in each.initializers.values() if not v.is_graph_input())


def _intermediates(graph: ir.Graph) -> Iterator[ir.Value]:
    """Every node output of ``graph`` and its subgraphs that is not a graph's output."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        yield from (value for value in node.outputs if not value.is_graph_output())


def _subgraphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield attribute.value
            elif attribute.type == ir.AttributeType.GRAPHS:
                yield from attribute.value


def _known(value: ir.Value) -> bool:
    return bool(value.name) and (value.type is not None or value.shape is not None)


def _forget(value: ir.Value) -> Inferred:
    known = (value.type, value.shape)
    value.type, value.shape = None, None
    return known


def _restore_misread(model: ir.Model, forgotten: dict[str, Inferred]) -> list[str]:
    """Give back their declarations to the values whose shape onnx's inference, run on
    the model without them, contradicts (another rank, another fixed size), with the
    other inputs and outputs of the node that makes them (what that node's inference
    reads): a file the checker or a runtime would read wrong. When inference still
    fails, or cannot run at all, every declaration comes back (the model as it was)."""
    values = {v.name: v for v in _intermediates(model.graph) if v.name in forgotten}
    try:
        inferred = onnx.shape_inference.infer_shapes(_graph_of(model))  # as the checker does
        misread = [n for n, info in _all_value_info(inferred.graph) if n in values and (
            _contradicts(forgotten[n], info))]  # fmt: skip
        restored = _restore(values, forgotten, _with_neighbours(values, misread))
        if restored:
            onnx.shape_inference.infer_shapes(_graph_of(model), strict_mode=True)
    except Exception as exc:  # onnx's inference fails on the written form: keep what we know
        logger.info("written form: onnx's shape inference failed (%s); every shape kept", exc)
        restored = list(forgotten)
        _restore(values, forgotten, restored)
    return restored


def _graph_of(model: ir.Model) -> onnx.ModelProto:
    return weightless_proto(model, keep_up_to=_SIZES_BYTES)


def _with_neighbours(values: dict[str, ir.Value], names: list[str]) -> list[str]:
    """``names`` and the other inputs and outputs of the nodes that make them."""
    found = dict.fromkeys(names)
    for name in names:
        node = values[name].producer()
        if node is not None:
            around = [*node.inputs, *node.outputs]
            found.update(
                dict.fromkeys(v.name for v in around if v is not None and v.name in values)
            )
    return list(found)


def _restore(values: dict[str, ir.Value], forgotten: dict[str, Inferred], names) -> list[str]:
    for name in names:
        if name in values:
            values[name].type, values[name].shape = forgotten[name]
    return list(names)


def _all_value_info(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.ValueInfoProto]]:
    yield from ((info.name, info) for info in graph.value_info)
    for node in graph.node:
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                yield from _all_value_info(sub)


def _contradicts(known: Inferred | None, info: onnx.ValueInfoProto) -> bool:
    if known is None or known[1] is None or not info.type.tensor_type.HasField("shape"):
        return False
    ours, theirs = known[1], info.type.tensor_type.shape.dim
    if len(ours) != len(theirs):
        return True
    return any(
        isinstance(mine, int) and other.HasField("dim_value") and mine != other.dim_value
        for mine, other in zip(ours, theirs, strict=True)
    )


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
