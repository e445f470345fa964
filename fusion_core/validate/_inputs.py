"""Seeded random inputs for a model's graph inputs.

Symbolic dimensions take the value given in ``dims`` (by name) or 1. Float inputs are
standard normal; integer inputs are small non-negative values (``int_high``), so they
are valid indices into tables of at least that size; booleans are fair coin flips.
"""

from __future__ import annotations

import numpy as np
import onnx

__all__ = ["random_inputs"]


def random_inputs(
    model: onnx.ModelProto,
    *,
    seed: int,
    dims: dict[str, int] | None = None,
    int_high: int = 2,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dims = dims or {}
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1)
            for d in tensor_type.shape.dim
        ]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        feeds[value.name] = _sample(rng, shape, dtype, int_high)
    return feeds


def _sample(
    rng: np.random.Generator, shape: list[int], dtype: np.dtype, int_high: int
) -> np.ndarray:
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, int_high, size=shape).astype(dtype)
    raise ValueError(f"cannot generate inputs of dtype {dtype}")
