"""Structural checks of a rewritten graph, cheap enough to run after every round.

A rewrite must not change the model's interface (graph outputs keep their names,
element types and known dimensions) and must not leave a node reading a value that a
removed region produced. onnx's checker runs once at the end (``checker_problems``):
it is linear but not free, and a round cannot fix what it finds anyway.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

__all__ = ["OutputSignature", "checker_problems", "output_signature", "structure_problems"]

OutputSignature = list[tuple[str, str | None, tuple | None]]


def output_signature(model: ir.Model) -> OutputSignature:
    """(name, dtype, dims) of each graph output; symbolic and unknown dims read as None."""
    signature = []
    for value in model.graph.outputs:
        dtype = value.dtype.name if value.dtype is not None else None
        dims = None
        if value.shape is not None:
            dims = tuple(d if isinstance(d, int) else None for d in value.shape)
        signature.append((value.name or "", dtype, dims))
    return signature


def structure_problems(model: ir.Model, before: OutputSignature) -> list[str]:
    """What the rewritten graph broke, as sentences; empty when nothing."""
    problems = []
    after = output_signature(model)
    if [s[0] for s in after] != [s[0] for s in before]:
        problems.append(
            f"graph outputs changed from {[s[0] for s in before]} to {[s[0] for s in after]}"
        )
    else:
        for (name, dtype, dims), (_, new_dtype, new_dims) in zip(before, after, strict=True):
            if dtype is not None and new_dtype != dtype:
                problems.append(f"output {name!r} changed type from {dtype} to {new_dtype}")
            if dims is not None and new_dims is not None and not _compatible(dims, new_dims):
                problems.append(f"output {name!r} changed shape from {dims} to {new_dims}")
    graph = model.graph
    members = {id(node) for node in graph}
    inputs = {id(v) for v in graph.inputs}
    for node in graph:
        for value in node.inputs:
            if value is None or id(value) in inputs or value.const_value is not None:
                continue
            producer = value.producer()
            if producer is None and value.name not in graph.initializers:
                problems.append(
                    f"{node.op_type} {node.name!r} reads {value.name!r}, which no node produces"
                )
            elif producer is not None and id(producer) not in members:
                problems.append(
                    f"{node.op_type} {node.name!r} reads {value.name!r} from a removed node "
                    f"{producer.op_type} {producer.name!r}"
                )
    return problems


def checker_problems(proto: onnx.ModelProto, *, full_check: bool) -> list[str]:
    """onnx's checker; ``full_check`` adds strict shape inference (standard ops only)."""
    try:
        onnx.checker.check_model(proto, full_check=full_check)
    except Exception as exc:  # ValidationError, InferenceError: all mean the same here
        return [f"onnx.checker: {str(exc).strip().splitlines()[0]}"]
    return []


def _compatible(old: tuple, new: tuple) -> bool:
    return len(old) == len(new) and all(
        a is None or b is None or a == b for a, b in zip(old, new, strict=True)
    )
