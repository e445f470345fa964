"""Pre-passes: make the graph say what it computes before patterns look at it.

Exporters hide constants behind Identity, Constant, Shape/Expand and CastLike chains
(the dynamo exporter builds every missing Conv bias at run time from the weight's
shape), and old models list their initializers as graph inputs. After these passes a
pattern sees plain constant initializers and inferred shapes.

Constant folding is onnxscript's (with size limits, so a pre-pass never materialises a
huge tensor); identity and unused-node elimination and lifting Constant nodes are
onnx-ir's passes. Our own code here is only what those do not do: treating IR<4
initializer-inputs as constants, removing inference-mode Dropout, and a linear
whole-graph shape inference (onnx's, with data propagation, so symbolic dims such as
the batch and sequence of a TorchScript export flow through Shape/Concat/Reshape).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import fold_constants

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.prepasses.broadcasts import BroadcastingExpandPass
from autofusion.fusion_core.prepasses.shape_reads import ShapeReadsFromInputsPass

__all__ = [
    "IdentityEliminationPass",
    "PrepassOptions",
    "SymbolicShapeInferencePass",
    "run_prepasses",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepassOptions:
    fold_constants: bool = True
    # Elements, not bytes. The output limit fits the largest conv/linear weights of
    # common CNNs (ResNet-50's fc is 2M) without materialising giant embedding tables.
    fold_input_size_limit: int = 1 << 22
    fold_output_size_limit: int = 1 << 23
    shape_inference: bool = True
    # Initializers above this many elements reach onnx's shape inference as typed graph
    # inputs without data (keeps the proto small and models over 2 GB inferable); the
    # small ones stay, since Reshape and data propagation read their values.
    shape_inference_initializer_limit: int = 1024


class InitializerInputsToConstantsPass(ir.passes.InPlacePass):
    """IR < 4 requires every initializer to be listed as a graph input; there they are
    constants, not overridable defaults, so drop them from the inputs (and move the
    model to IR 4, where the distinction exists)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.ir_version >= 4:
            return ir.passes.PassResult(model, modified=False)
        graph = model.graph
        kept = [v for v in graph.inputs if v.name not in graph.initializers]
        modified = len(kept) != len(graph.inputs)
        graph.inputs[:] = kept
        model.ir_version = 4
        return ir.passes.PassResult(model, modified=modified or True)


class DropoutEliminationPass(ir.passes.InPlacePass):
    """In inference a Dropout is the identity (when not forced into training mode and
    its mask is unused): https://onnx.ai/onnx/operators/onnx__Dropout.html"""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
                continue
            if len(node.outputs) > 1 and node.outputs[1].uses():
                continue
            if node.outputs[1:] and node.outputs[1].is_graph_output():
                continue
            training = node.inputs[2] if len(node.inputs) > 2 else None
            if training is not None:
                flag = constant_array(training)
                if flag is None or bool(flag.reshape(-1)[0]):
                    continue
            identity = ir.Node("", "Identity", [node.inputs[0]], name=node.name)
            ir.convenience.replace_nodes_and_values(
                model.graph, node, [node], [identity], [node.outputs[0]], [identity.outputs[0]]
            )
            modified = True
        return ir.passes.PassResult(model, modified=modified)


class IdentityEliminationPass(ir.passes.InPlacePass):
    """Remove ``y = Identity(x)`` wherever that keeps every graph's outputs, in every graph.

    onnx-ir's own pass (1.1) renames ``x`` to ``y`` when ``y`` is a graph output, which
    breaks two things it does not look at: a ``Scan`` body that returns both the carried
    sum ``x`` and its copy ``y`` (the body then returns one value twice and the first
    output loses its name: the ONNX node test ``test_scan_sum`` computed ``[1e-45, 0]``
    instead of ``[9, 12]``), and a branch of ``If`` whose output copies a value of the
    outer graph (the rename raises "already an output of a different graph"). So an
    Identity that produces a graph output is removed only when ``x`` is made by a node of
    the same graph and is no graph's input, initializer or output; other copies stay.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graphs = [model.graph, *model.functions.values()]
        nodes = [n for g in graphs for n in ir.traversal.RecursiveGraphIterator(g)]
        modified = False
        for node in nodes:
            if _is_identity(node) and node.graph is not None:
                modified |= _eliminate_identity(node)
        return ir.passes.PassResult(model, modified=modified)


def _is_identity(node: ir.Node) -> bool:
    return (
        node.op_type == "Identity"
        and node.domain in ("", "ai.onnx")
        and len(node.inputs) == 1
        and len(node.outputs) == 1
        and node.inputs[0] is not None
    )


def _eliminate_identity(node: ir.Node) -> bool:
    source, copy = node.inputs[0], node.outputs[0]
    graph = node.graph
    if copy.is_graph_output():
        producer = source.producer()
        if (
            producer is None
            or producer.graph is not graph
            or source.is_graph_output()
            or source.is_graph_input()
            or source.is_initializer()
        ):
            return False
    if source.type is None:
        source.type = copy.type
    if source.shape is None:
        source.shape = copy.shape
    was_output = copy.is_graph_output()
    ir.convenience.replace_all_uses_with(copy, source, replace_graph_outputs=True)
    if was_output:
        source.name = copy.name
    graph.remove(node, safe=True)
    return True


class SymbolicShapeInferencePass(ir.passes.InPlacePass):
    """onnx's shape inference with data propagation over the whole graph, in linear time.

    Large initializers are handed to onnx as typed inputs without data (the model's
    inputs and initializers are restored before returning); the inferred shapes fill in
    the dims the model does not know yet, by value name. Known dims are never
    overwritten, and a failure of the inference leaves the model as it was: shapes are
    best effort, never fatal.
    """

    def __init__(self, *, initializer_limit: int = 1024) -> None:
        super().__init__()
        self.initializer_limit = initializer_limit

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        proto = self._proto_without_large_initializers(model)
        modified = False
        # onnxruntime's symbolic inference first: it follows shape arithmetic that onnx's
        # data propagation drops (Where/Equal/Expand/Range in the mask builders of
        # transformers 5), so a TorchScript BERT's mask reads [batch, 1, sequence,
        # sequence] instead of four fresh unknowns. onnx's then fills in what it left.
        # onnxruntime's symbolic inference gives an If the rank of one branch even when
        # the other differs (silero-vad: rank 4 for an LSTM input of rank 3) and carries
        # that downstream, so it is used only on graphs without control flow.
        # It is also slow where it helps least: on an image model with dynamic height
        # and width, sympy simplifies ever longer floor(...) expressions through every
        # Conv, Pool and Resize (26 s on PP-OCRv4's 672-node detector, 18 s on a YOLOv8n;
        # onnx's inference takes 3 ms there). CNN fusions need channels, which are static.
        inferences = [_onnx_inference(proto)]
        if _has_control_flow(model.graph):
            pass
        elif _has_dynamic_image_input(model.graph):
            inferences.insert(0, _static_dims_of_image_model(proto))
        else:
            inferences.insert(0, _onnxruntime_inference(proto))
        values = _values_named_once(model.graph)
        for inferred in inferences:
            if inferred is None:
                continue
            types = {info.name: info.type for info in inferred.graph.value_info}
            types.update((info.name, info.type) for info in inferred.graph.output)
            for value in values:
                if value.name in types:
                    modified |= _merge_type(value, types[value.name])
        return ir.passes.PassResult(model, modified=modified)

    def _proto_without_large_initializers(self, model: ir.Model) -> onnx.ModelProto:
        graph = model.graph
        everything = list(graph.initializers.values())
        large = [
            v
            for v in everything
            if v.const_value is None or v.const_value.size > self.initializer_limit
        ]
        input_count = len(graph.inputs)
        input_names = {v.name for v in graph.inputs}
        try:
            for value in large:
                if value.const_value is not None:
                    value.shape = value.shape or value.const_value.shape
                    value.dtype = value.dtype or value.const_value.dtype
                graph.initializers.pop(value.name)
                if value.name not in input_names:
                    graph.inputs.append(value)
            return ir.serde.serialize_model(model)
        finally:
            # Restore inputs and initializers exactly, in their original order. Only the
            # containers' own methods keep a value's bookkeeping right: a slice ``del``
            # on graph.inputs would leave the flag behind, so ``is_graph_input()`` would
            # stay True and every large weight would read as an overridable default.
            while len(graph.inputs) > input_count:
                graph.inputs.pop()
            graph.initializers.clear()
            for value in everything:
                graph.initializers.add(value)


def _values_named_once(graph: ir.Graph) -> list[ir.Value]:
    """Node outputs of ``graph`` and its subgraphs whose name no other value shares.

    The inferred types come back by name, and the two branches of an ``If`` often
    define values of the same name with different shapes (silero-vad's LSTM input is
    rank 3 in one branch, rank 2 in the other): such a name says nothing reliable.
    """
    values = [v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs]
    counts = Counter(v.name for v in values)
    return [v for v in values if counts[v.name] == 1]


_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def _static_dims_of_image_model(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """The dims that do not depend on the image size, from two concrete inferences.

    onnxruntime's inference is fast with numbers: it runs with the dynamic spatial dims
    set to 224 and then to 256, and a dim is kept where both agree (the channels of a
    conv, the width of a LayerNorm in an OCR recognizer's transformer); dims that follow
    the image come back unknown, and symbolic ones (the batch) stay as they were.
    """
    inferred = [_onnxruntime_inference(_with_spatial_size(proto, size)) for size in (224, 256)]
    if inferred[0] is None or inferred[1] is None:
        return None
    other = {info.name: info for info in inferred[1].graph.value_info}
    merged = onnx.ModelProto()
    merged.CopyFrom(inferred[0])
    for info in merged.graph.value_info:
        twin = other.get(info.name)
        dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
        if twin is None or not twin.type.HasField("tensor_type"):
            info.type.tensor_type.ClearField("shape")
            continue
        twin_dims = twin.type.tensor_type.shape.dim
        if len(dims) != len(twin_dims):
            info.type.tensor_type.ClearField("shape")
            continue
        for dim, twin_dim in zip(dims, twin_dims, strict=True):
            if dim != twin_dim:
                dim.Clear()  # follows the image size (a number or "h + 224"): unknown
    del merged.graph.output[:]  # outputs are inferred from value_info alone
    return merged


def _with_spatial_size(proto: onnx.ModelProto, size: int) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for value in copy.graph.input:
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type not in _FLOAT_PROTO_TYPES or len(tensor_type.shape.dim) not in (
            4,
            5,
        ):
            continue
        for dim in list(tensor_type.shape.dim)[2:]:
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                dim.Clear()
                dim.dim_value = size
    return copy


_FLOAT_PROTO_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
    }
)


def _has_dynamic_image_input(graph: ir.Graph) -> bool:
    """A 4-D/5-D float input whose spatial dims (axes 2+) are not all known.

    A decoder's KV cache (``past_key_values.0.key``: [batch, heads, past_sequence, size])
    is 4-D too, but its dynamic axis is a sequence: set to 224 it would name the key
    length ``sequence_length + 224`` everywhere downstream."""
    for value in graph.inputs:
        shape = value.shape
        if value.dtype not in _FLOAT_TYPES or shape is None or len(shape) not in (4, 5):
            continue
        dynamic = [d for d in list(shape)[2:] if not isinstance(d, int)]
        if dynamic and not _is_sequence_cache(value.name or "", dynamic):
            return True
    return False


_SEQUENCE_CACHE = re.compile(r"past|cache|history|present|seq", re.IGNORECASE)


def _is_sequence_cache(name: str, dynamic: list) -> bool:
    """A KV-cache input: named like one, or every dynamic axis named like a sequence."""
    if _SEQUENCE_CACHE.search(name):
        return True
    names = [d.value for d in dynamic if getattr(d, "value", None)]
    return len(names) == len(dynamic) and all(_SEQUENCE_CACHE.search(n) for n in names)


_FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)


def _has_control_flow(graph: ir.Graph) -> bool:
    return any(n.op_type in _CONTROL_FLOW and n.domain in ("", "ai.onnx") for n in graph)


def _onnx_inference(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    try:
        return onnx.shape_inference.infer_shapes(
            proto, check_type=False, strict_mode=False, data_prop=True
        )
    except Exception as exc:  # inference is best effort, never fatal
        logger.warning("onnx shape inference failed, continuing without it: %s", exc)
        return None


def _onnxruntime_inference(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference, strict first.

    Without ``auto_merge`` it stops at the first broadcast of two different symbols
    (BERT adds position embeddings of ``Min(64, sequence)`` rows to ``sequence`` rows);
    with it, such symbols are taken as equal, which holds whenever the model runs unless
    one of them is 1 at run time. That assumption is the one the exporter made too, and
    every fused model is still checked against the original.

    Driven step by step rather than through ``SymbolicShapeInference.infer_shapes``:
    that one writes ``sym_shape_infer_temp.onnx`` (and external data) into the current
    directory when some shape stays unknown, and throws away the shapes it did infer.
    """
    symbolic_shape_infer = _symbolic_shape_infer_module()
    # Its warnings ("unsupported broadcast ...") are the reason for the second try.
    ort_logger = logging.getLogger(symbolic_shape_infer.__name__)
    level = ort_logger.level
    ort_logger.setLevel(logging.ERROR)
    result = None
    try:
        for auto_merge in (False, True):
            inference = symbolic_shape_infer.SymbolicShapeInference(2**31 - 1, auto_merge, False, 0)
            complete = False
            inference._preprocess(proto)
            while inference.run_:
                complete = inference._infer_impl()
            inference._update_output_from_vi()
            result = inference.out_mp_
            if complete:
                break
    except Exception as exc:  # best effort, never fatal: keep what the last try gave
        logger.info("onnxruntime symbolic shape inference failed: %s", exc)
    finally:
        ort_logger.setLevel(level)
    return result


@functools.cache
def _symbolic_shape_infer_module() -> types.ModuleType:
    """onnxruntime's ``tools/symbolic_shape_infer.py``, without ``onnxruntime.tools``.

    That package's ``__init__`` imports its PyTorch export helpers, which import torch
    whenever it is installed: 2.4 s of every optimize for a module that needs only onnx,
    numpy and sympy. So the file is loaded on its own, once.
    """
    import onnxruntime

    path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("_autofusion_symbolic_shape_infer", path)
    if spec is None or spec.loader is None:  # a different onnxruntime layout
        from onnxruntime.tools import symbolic_shape_infer

        return symbolic_shape_infer
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _merge_type(value: ir.Value, type_proto: onnx.TypeProto) -> bool:
    """Fill in what ``value`` does not know from an inferred type; True if it changed."""
    modified = False
    if value.type is None:
        inferred_type = ir.serde.deserialize_type_proto_for_type(type_proto)
        if inferred_type is not None:
            value.type = inferred_type
            modified = True
    shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
    if shape is None:
        return modified
    if value.shape is None:
        value.shape = shape
        return True
    if len(value.shape) != len(shape):
        return modified  # a conflict: keep what the model says
    dims = [_better_dim(old, new) for old, new in zip(value.shape, shape, strict=True)]
    if dims != list(value.shape):
        value.shape = ir.Shape(dims)
        modified = True
    return modified


def _better_dim(old: int | ir.SymbolicDim, new: int | ir.SymbolicDim) -> int | ir.SymbolicDim:
    """A known dim beats a symbol, a named symbol beats an unknown one; ties keep ``old``."""
    if isinstance(old, int):
        return old
    if isinstance(new, int) or (_unknown(old) and not _unknown(new)):
        return new
    return old


def _unknown(dim: ir.SymbolicDim) -> bool:
    # onnx's inference names the dims it cannot relate to anything "unk__<n>"
    return dim.value is None or dim.value.startswith("unk__")


def _fold_constant_of_shape(node: ir.Node) -> bool | None:
    # onnxscript keeps ConstantOfShape to keep files small, but weights written as
    # ConstantOfShape (as in the ONNX model zoo's light models) must become constants
    # for BatchNorm folding. The output size limit still bounds what is materialised.
    if node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        return True
    return None


def run_prepasses(model: ir.Model, options: PrepassOptions) -> list[str]:
    """Run the pre-passes in place; return the names of those that changed the model."""
    changed = []

    def run(name: str, pass_: ir.passes.PassBase) -> None:
        if pass_(model).modified:
            changed.append(name)

    run("initializer_inputs", InitializerInputsToConstantsPass())
    run("dropout_elimination", DropoutEliminationPass())
    run("identity_elimination", IdentityEliminationPass())
    if options.fold_constants:
        try:
            result = fold_constants(
                model,
                onnx_shape_inference=options.shape_inference,
                input_size_limit=options.fold_input_size_limit,
                output_size_limit=options.fold_output_size_limit,
                should_fold=_fold_constant_of_shape,
            )
        except Exception as exc:  # onnxscript's folder on an op it mishandles: go on
            # What it folded before failing is folded correctly; the check still runs.
            logger.warning("constant folding stopped: %s: %s", type(exc).__name__, exc)
            changed.append(f"constant_folding: stopped early ({type(exc).__name__})")
        else:
            if result.modified:
                changed.append("constant_folding")
        run(
            "lift_constants",
            common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        )
        run("identity_elimination", IdentityEliminationPass())
    run("remove_unused", common.RemoveUnusedNodesPass())
    run("topological_sort", common.TopologicalSortPass())
    # Constant folding infers each node's shape on its own, which loses symbolic dims
    # computed at run time (Shape -> Concat -> Reshape); a whole-graph inference with
    # data propagation keeps them. Not onnx-ir's ShapeInferencePass: it is quadratic in
    # the number of initializers in onnx-ir 1.1 (docs/benchmarks.md).
    if options.shape_inference:
        run(
            "shape_inference",
            SymbolicShapeInferencePass(initializer_limit=options.shape_inference_initializer_limit),
        )
        run("shape_reads_from_inputs", ShapeReadsFromInputsPass())
        run("broadcasting_expand", BroadcastingExpandPass())
        run("remove_unused", common.RemoveUnusedNodesPass())
    return changed
