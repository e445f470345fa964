"""The shape inferences a model gets, best first: onnxruntime's symbolic one, then onnx's.

onnxruntime's symbolic inference follows shape arithmetic that onnx's data propagation
drops, but it is wrong on control flow and slow on image models with a dynamic size,
which therefore get two inferences at concrete sizes, keeping the dims both agree on.
Every inference is best effort: a failure is logged and yields None, never an error.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
import types
from pathlib import Path

import onnx
import onnx_ir as ir

__all__ = ["inferred_models"]

logger = logging.getLogger(__name__)


def inferred_models(graph: ir.Graph, proto: onnx.ModelProto) -> list[onnx.ModelProto | None]:
    """The inferred models of ``proto`` (the model of ``graph``), best first; None for
    an inference that failed."""
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
    if _has_control_flow(graph):
        pass
    elif _has_dynamic_image_input(graph):
        inferences.insert(0, _static_dims_of_image_model(proto))
    else:
        inferences.insert(0, _onnxruntime_inference(proto))
    # onnx's inference checks its own shapes (``_onnx_inference``); the two-size merge
    # of an image model may contradict itself on a shape computation (PP-OCRv4's
    # recognizer: a Concat of sizes) and still give the channels the fusions need, which
    # is why the others are kept whole.
    return inferences


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
    """onnx's inference, with data propagation where its shapes hold together.

    Data propagation computes Reshape targets from Shape reads, and is sometimes wrong:
    on a TorchScript Cohere it gives an interleaved rotary's stacked halves a rank of 6,
    whose Add onnxruntime then refuses to load ("Incompatible dimensions"). So each
    result must pass onnx's own strict inference over the shapes it wrote (``_consistent``);
    without data propagation it is the plain inference, which was right there."""
    for data_prop in (True, False):
        try:
            result = onnx.shape_inference.infer_shapes(
                proto, check_type=False, strict_mode=False, data_prop=data_prop
            )
        except Exception as exc:  # inference is best effort, never fatal
            logger.warning("onnx shape inference failed, continuing without it: %s", exc)
            return None
        if _consistent(result):
            return result
        logger.info("onnx shape inference (data_prop=%s) gave contradicting shapes", data_prop)
    return None


def _consistent(inferred: onnx.ModelProto | None) -> bool:
    """Whether the shapes an inference wrote agree with every op's shape rule: onnx's
    strict inference run over them raises where two contradict (an Add of [.., 32] and
    [.., 16]), as onnxruntime would when it loads the model."""
    if inferred is None:
        return False
    try:
        onnx.shape_inference.infer_shapes(inferred, check_type=False, strict_mode=True)
    except onnx.shape_inference.InferenceError:
        return False
    except Exception:
        return True
    return True


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
            # opset 18 moved every Reduce's axes to an input, which it reads for ReduceSum
            # and ReduceMean only: without this a ReduceMax (gpt-oss's sinks) ends it
            for op in ("ReduceMax", "ReduceMin"):
                inference.dispatcher_.setdefault(op, inference._infer_ReduceMean)
            inference.dispatcher_["Split"] = functools.partial(
                _split_by_computed_sizes, symbolic_shape_infer, inference
            )
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


def _split_by_computed_sizes(module: types.ModuleType, inference, node) -> None:
    """A Split whose sizes are computed at run time gives each part a size of its own.
    onnxruntime's rule takes such a Split for an even one (``dim / parts``), which is
    wrong for a sorted dispatch's per-expert slabs (JetMoE: ``2*tokens/3`` written for a
    part the router sizes); the model it wrote fails in onnxruntime."""
    computed = len(node.input) > 1 and node.input[1] and inference._try_get_value(node, 1) is None
    if not computed:
        inference._infer_Split(node)
        return
    shape = inference._get_sympy_shape(node, 0)
    axis = module.handle_negative_axis(module.get_attribute(node, "axis", 0), len(shape))
    element = inference.known_vi_[node.input[0]].type.tensor_type.elem_type
    for index, name in enumerate(node.output):
        own = inference._new_symbolic_dim_from_output(node, index, axis)
        dims = module.get_shape_from_sympy_shape([*shape[:axis], own, *shape[axis + 1 :]])
        value_info = inference.known_vi_[name]
        value_info.CopyFrom(onnx.helper.make_tensor_value_info(name, element, dims))


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
