"""How large attention scores can be, proven from the graph: ``score_bound(w)`` bounds
``|w|`` for scores ``w = MatMul(Q, K^T) * s`` (or ``/ s``) from bounds on the 2-norm of
each query row and each key column (Cauchy-Schwarz: ``|q . k| <= |q| |k|``), which
``fiber_bound(value, axis)`` proves for every vector of ``value`` along ``axis``:

* a constant: the largest norm among its vectors, computed;
* ``Gather(table, ids)`` on axis 0 of a 2-D constant table, along the last axis: the
  largest norm of the table's rows (token and position embeddings);
* ``LayerNormalization`` over the last axis, along it: ``max|gamma| * sqrt(D) +
  |beta|``, since the normalized vector ``(x - mean) / sqrt(var + eps)`` has squared
  norm ``D * var / (var + eps) <= D``;
* ``MatMul(x, W)`` or ``Gemm(x, W, bias)`` of a constant 2-D ``W``, along the last
  axis: ``|W|_2 * |x| + |bias row|`` (``|W|_2`` the largest singular value, or the
  Frobenius norm, which bounds it, for a weight over 4M entries), ``alpha`` and
  ``beta`` taken in;
* ``Add`` of two operands whose dimension on ``axis`` is the output's (a bias
  broadcast over the other axes included): the sum of their bounds (triangle
  inequality); ``Mul``/``Div`` by a scalar constant: scaled;
* ``Transpose``: the input's along ``perm[axis]``; ``Slice``, ``Split``, ``Identity``,
  ``Cast``, ``Unsqueeze``, ``Squeeze`` and an ``Expand`` that keeps the axis's size
  keep (a vector of the output is the input's, a part of it, or a copy of it), axes
  renumbered where added or taken;
* ``Reshape``, along the last axis, where the input's last dimension is a known
  multiple of the output's: each output row is a contiguous part of one input row;
  where the output's is a multiple ``k`` of the input's (heads merged), ``sqrt(k)``
  times the input's: each output row is ``k`` whole input rows;
* ``Concat`` along another axis than the joined one: the largest of the inputs';
  ``Gather`` of a computed value along an axis it does not gather (Funnel's pick of
  the pooled rows): the data's; ``AveragePool`` along an axis its window does not span
  (N, C, or kernel 1 and stride 1): the input's, each vector being a mean of the
  input's (weights summing to at most 1, so no longer: triangle inequality);
* any other vector of ``n`` elements each proven at most ``v`` in magnitude
  (``element_bound``: Funnel's sinusoid positions): ``sqrt(n) * v``.

Rounding: each op computes its value with a relative error far below 1%, so the bound
returned is multiplied by ``_ROUNDING`` (1.05) to cover what float32 arithmetic adds.
Anything else (a graph input, an op not listed) has no bound: None.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._value_bounds import value_bound
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import known_dims

__all__ = ["element_bound", "fiber_bound", "score_bound"]

_ONNX = ("", "ai.onnx")
_DEPTH = 40
_ROUNDING = 1.05
_SVD_LIMIT = 4_000_000  # entries: beyond this the Frobenius norm bounds the spectral one
_KEEP = frozenset({"Identity", "Cast", "Slice", "Split"})


def score_bound(scores: ir.Value) -> float | None:
    """A proven bound on ``|scores|`` for ``MatMul(Q, K^T)`` times or divided by a scalar
    constant, else None."""
    factor, value = 1.0, scores
    producer = value.producer()
    if producer is not None and producer.op_type in ("Mul", "Div") and producer.domain in _ONNX:
        found = _scaled(producer)
        if found is None:
            return None
        factor, value = found
        producer = value.producer()
    if producer is None or producer.op_type != "MatMul" or producer.domain not in _ONNX:
        return None
    q, kt = producer.inputs
    if q is None or kt is None or q.shape is None or kt.shape is None:
        return None
    weights: dict[int, float] = {}
    rows = fiber_bound(q, len(q.shape) - 1, weights)
    cols = fiber_bound(kt, len(kt.shape) - 2, weights) if len(kt.shape) >= 2 else None
    if rows is None or cols is None:
        return None
    return rows * cols * factor * _ROUNDING


def _scaled(node: ir.Node) -> tuple[float, ir.Value] | None:
    """(|factor|, the scaled value) of ``x * s``, ``s * x`` or ``x / s``."""
    for value, constant in (node.inputs, tuple(reversed(node.inputs))):
        if node.op_type == "Div" and value is not node.inputs[0]:
            continue
        array = constant_array(constant)
        if value is None or array is None or array.size != 1 or not np.isfinite(array).all():
            continue
        number = abs(float(array.item()))
        if node.op_type == "Div":
            return (1.0 / number, value) if number > 0 else None
        return number, value
    return None


def fiber_bound(
    value: ir.Value, axis: int, weights: dict[int, float], depth: int = 0
) -> float | None:
    """A proven bound on the 2-norm of every vector of ``value`` along ``axis``
    (counted from the front), else None. ``weights`` keeps each weight's norm, by id."""
    rank = len(value.shape) if value.shape is not None else None
    if depth > _DEPTH or rank is None or not 0 <= axis < rank:
        return None
    array = constant_array(value)
    if array is not None:
        return _largest_norm(array, axis)
    node = value.producer()
    if node is None or node.domain not in _ONNX:
        return None
    last = axis == rank - 1
    step = _STEPS.get(node.op_type)
    found = step(node, value, axis, last, weights, depth + 1) if step is not None else None
    return found if found is not None else _from_elements(value, axis, depth)


def _from_elements(value: ir.Value, axis: int, depth: int) -> float | None:
    """``sqrt(n) * max|x|`` for a vector of ``n`` elements each proven at most ``max|x|``
    (``value_bound``): where no step above bounds the vector as a whole."""
    size = value.shape[axis] if value.shape is not None else None
    if not isinstance(size, int):
        return None
    largest = element_bound(value, depth + 1)
    return None if largest is None else largest * math.sqrt(size)


def element_bound(value: ir.Value, depth: int = 0) -> float | None:
    """A proven bound on ``|x|`` for every element of ``value`` (``value_bound``), a
    MatMul's elements from the norms of A's rows and B's columns (Cauchy-Schwarz)."""
    return value_bound(value, depth, _product_bound)


def _product_bound(node: ir.Node) -> float | None:
    """``|A @ B|`` from the norms of A's rows and B's columns, with float32's rounding."""
    a, b = node.inputs
    if a is None or b is None or a.shape is None or b.shape is None or len(b.shape) < 2:
        return None
    weights: dict[int, float] = {}
    rows = fiber_bound(a, len(a.shape) - 1, weights)
    cols = fiber_bound(b, len(b.shape) - 2, weights)
    return None if rows is None or cols is None else rows * cols * _ROUNDING


def _largest_norm(array: np.ndarray, axis: int) -> float | None:
    if array.dtype.kind != "f" or array.size == 0 or not np.isfinite(array).all():
        return None
    norms = np.sqrt(np.sum(np.square(array.astype(np.float64)), axis=axis))
    return float(np.max(norms))


def _kept(node, value, axis, last, weights, depth):
    source = node.inputs[0]
    if source is None or source.shape is None or len(source.shape) != len(value.shape):
        return None
    return fiber_bound(source, axis, weights, depth)


def _expand(node, value, axis, last, weights, depth):
    source = node.inputs[0]
    dims, out = known_dims(source), known_dims(value)
    if dims is None or out is None or len(dims) > len(out):
        return None
    mapped = axis - (len(out) - len(dims))
    if mapped < 0 or dims[mapped] is None or dims[mapped] != out[axis]:
        return None  # copies of one number along the axis: a longer vector
    return fiber_bound(source, mapped, weights, depth)  # type: ignore[arg-type]


def _transpose(node, value, axis, last, weights, depth):
    perm = node.attributes.get("perm")
    source = node.inputs[0]
    if perm is None or source is None:
        return None
    return fiber_bound(source, list(perm.value)[axis], weights, depth)


def _unsqueeze(node, value, axis, last, weights, depth):
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    rank = len(value.shape)
    if axes is None:
        return None
    added = sorted(int(a) % rank for a in axes.reshape(-1))
    if axis in added:
        return None
    return fiber_bound(node.inputs[0], axis - sum(a < axis for a in added), weights, depth)


def _reshape(node, value, axis, last, weights, depth):
    source = node.inputs[0]
    dims, out = known_dims(source), known_dims(value)
    if not last or dims is None or out is None or not dims or not out:
        return None
    if not isinstance(dims[-1], int) or not isinstance(out[-1], int) or out[-1] <= 0:
        return None
    if not dims[-1] % out[-1]:
        return fiber_bound(source, len(dims) - 1, weights, depth)
    if out[-1] % dims[-1]:
        return None
    # each output row is k whole input rows side by side (heads merged): sqrt(k) times
    inner = fiber_bound(source, len(dims) - 1, weights, depth)
    return None if inner is None else inner * math.sqrt(out[-1] // dims[-1])


def _gather(node, value, axis, last, weights, depth):
    table = constant_array(node.inputs[0])
    gather_axis = node.attributes.get("axis")
    if not last or table is None or table.ndim != 2 or (gather_axis and gather_axis.value != 0):
        return None
    return _largest_norm(table, 1)


def _layer_norm(node, value, axis, last, weights, depth):
    attribute = node.attributes.get("axis")
    norm_axis = attribute.value if attribute is not None else -1
    dims = known_dims(value)
    if value is not node.outputs[0] or not last or norm_axis % len(value.shape) != axis:
        return None
    if dims is None:
        return None
    size, gamma = dims[-1], constant_array(node.inputs[1])
    given = len(node.inputs) > 2 and node.inputs[2] is not None
    beta = constant_array(node.inputs[2]) if given else np.zeros(1, np.float32)
    if not isinstance(size, int) or gamma is None or beta is None:
        return None
    if not np.isfinite(gamma).all() or not np.isfinite(beta).all():
        return None
    spread = float(np.max(np.abs(gamma))) * math.sqrt(size)
    return spread + float(np.sqrt(np.sum(np.square(np.broadcast_to(beta, (size,)), dtype=float))))


def _projection(node, value, axis, last, weights, depth):
    x, weight = node.inputs[0], node.inputs[1]
    matrix = constant_array(weight)
    if not last or x is None or x.shape is None or matrix is None or matrix.ndim != 2:
        return None
    alpha, beta, bias = 1.0, 1.0, None
    if node.op_type == "Gemm":
        attrs = {k: a.value for k, a in node.attributes.items()}
        if attrs.get("transA", 0):
            return None
        matrix = matrix.T if attrs.get("transB", 0) else matrix
        alpha, beta = abs(attrs.get("alpha", 1.0)), abs(attrs.get("beta", 1.0))
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            bias = constant_array(node.inputs[2])
            if bias is None:
                return None
    size = fiber_bound(x, len(x.shape) - 1, weights, depth)
    spectral = _spectral(matrix, weights, id(weight))
    if size is None or spectral is None:
        return None
    offset = 0.0
    if bias is not None:  # broadcast to whole rows: one number is a vector of them
        rows = np.atleast_2d(bias)
        offset = _largest_norm(np.broadcast_to(rows, (rows.shape[0], matrix.shape[1])), 1)
    return None if offset is None else alpha * spectral * size + beta * offset


def _spectral(matrix: np.ndarray, weights: dict[int, float], key: int) -> float | None:
    if key not in weights:
        if matrix.dtype.kind != "f" or not np.isfinite(matrix).all():
            return None
        wide = matrix.astype(np.float64)
        exact = wide.size <= _SVD_LIMIT
        weights[key] = float(np.linalg.norm(wide, 2 if exact else "fro"))
    return weights[key]


def _added(node, value, axis, last, weights, depth):
    dims = known_dims(value)
    if dims is None or len(node.inputs) != 2:
        return None
    total = 0.0
    for operand in node.inputs:
        theirs = known_dims(operand) if operand is not None else None
        mapped = axis - (len(dims) - len(theirs)) if theirs is not None else -1
        if mapped < 0 or theirs[mapped] is None or theirs[mapped] != dims[axis]:  # type: ignore[index]
            return None  # a number broadcast along the axis: a longer vector than its own
        part = fiber_bound(operand, mapped, weights, depth)  # type: ignore[arg-type]
        if part is None:
            return None
        total += part
    return total


def _scaled_step(node, value, axis, last, weights, depth):
    found = _scaled(node)
    if found is None:
        return None
    factor, source = found
    if source.shape is None or len(source.shape) != len(value.shape):
        return None
    inner = fiber_bound(source, axis, weights, depth)
    return None if inner is None else inner * factor


def _squeeze(node, value, axis, last, weights, depth):
    source = node.inputs[0]
    axes = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if source is None or source.shape is None or axes is None:
        return None
    removed = sorted(int(a) % len(source.shape) for a in axes.reshape(-1))
    kept = [a for a in range(len(source.shape)) if a not in removed]
    return fiber_bound(source, kept[axis], weights, depth)


def _concat(node, value, axis, last, weights, depth):
    """Along an axis other than the joined one, each vector is one input's."""
    joined = node.attributes.get("axis")
    if joined is None or joined.value % len(value.shape) == axis:
        return None
    parts = [fiber_bound(v, axis, weights, depth) if v is not None else None for v in node.inputs]
    return None if any(p is None for p in parts) else max(parts)  # type: ignore[type-var]


def _gather_of(node, value, axis, last, weights, depth):
    """``Gather`` of a computed value, along an axis it does not gather: a vector of the
    data's (Funnel's ``select`` of the pooled rows)."""
    data, indices = node.inputs
    attribute = node.attributes.get("axis")
    if constant_array(data) is not None or indices is None or indices.shape is None:
        return _gather(node, value, axis, last, weights, depth)
    if data is None or data.shape is None:
        return None
    at = (attribute.value if attribute is not None else 0) % len(data.shape)
    if axis < at:
        return fiber_bound(data, axis, weights, depth)
    if axis >= at + len(indices.shape):
        return fiber_bound(data, axis - len(indices.shape) + 1, weights, depth)
    return None


def _average_pool(node, value, axis, last, weights, depth):
    """Along an axis the window does not span (N, C, or kernel 1 with stride 1), each
    vector is a mean of the input's, weights summing to at most 1: no longer."""
    kernel = node.attributes.get("kernel_shape")
    strides = node.attributes.get("strides")
    source = node.inputs[0]
    if kernel is None or source is None or len(node.outputs) != 1:
        return None
    spans = list(kernel.value)
    steps = list(strides.value) if strides is not None else [1] * len(spans)
    spatial = axis - 2
    if spatial >= 0 and (spatial >= len(spans) or spans[spatial] != 1 or steps[spatial] != 1):
        return None
    return fiber_bound(source, axis, weights, depth)


_STEPS = {
    **dict.fromkeys(_KEEP, _kept),
    "Expand": _expand,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Gather": _gather_of,
    "Concat": _concat,
    "AveragePool": _average_pool,
    "LayerNormalization": _layer_norm,
    "MatMul": _projection,
    "Gemm": _projection,
    "Add": _added,
    "Mul": _scaled_step,
    "Div": _scaled_step,
}
