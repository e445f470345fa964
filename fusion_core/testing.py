"""Helpers for testing fusions: model builders and the four-part fusion assertion.

As onnxscript ships ``rewriter/testing.py``, this module is importable by anyone who
writes a pattern or a rewriter (and by this repository's tests), so that a Conv+BN+Relu
model is not written again in every test file. The builders draw non-degenerate random
weights (BatchNormalization statistics and scales away from 0 and 1): an identity-like
BN hides a wrong fold.

``assert_fused`` checks the four things a fusion must hold: the fused model passes the
ONNX checker, the fused ops are there (counts), the ops it replaces are gone, and its
outputs match the original's on onnxruntime within the stated ``rtol``/``atol``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh

from fusion_core.validate import make_session, random_inputs

__all__ = ["assert_fused", "conv_bn_relu", "op_counts"]

_F32 = onnx.TensorProto.FLOAT


def conv_bn_relu(
    *,
    in_channels: int = 3,
    out_channels: int = 4,
    height: int | str = 8,
    width: int | str = 8,
    batch: int | str = 1,
    prefix: str = "",
    doc: str = "",
    seed: int = 0,
    opset: int = 17,
) -> onnx.ModelProto:
    """``x -> Conv(3x3, pads 1) -> BatchNormalization -> Relu -> y``; nodes named
    ``{prefix}conv``, ``{prefix}bn``, ``{prefix}relu``; a str dim is symbolic."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w": rng.normal(0, 0.3, (out_channels, in_channels, 3, 3)),
        "gamma": rng.uniform(0.5, 1.5, out_channels),
        "beta": rng.normal(0, 0.1, out_channels),
        "mean": rng.normal(0, 0.1, out_channels),
        "var": rng.uniform(0.5, 2.0, out_channels),
    }
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], name=f"{prefix}conv", pads=[1, 1, 1, 1]),
        oh.make_node(
            "BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], name=f"{prefix}bn"
        ),
        oh.make_node("Relu", ["n"], ["y"], name=f"{prefix}relu", doc_string=doc),
    ]
    graph = oh.make_graph(
        nodes,
        "conv_bn_relu",
        [oh.make_tensor_value_info("x", _F32, [batch, in_channels, height, width])],
        [oh.make_tensor_value_info("y", _F32, [batch, out_channels, height, width])],
        [nh.from_array(a.astype(np.float32), name) for name, a in arrays.items()],
        doc_string=doc,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], doc_string=doc)
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def op_counts(model: onnx.ModelProto) -> Counter[str]:
    """Op types of the main graph, ``domain::op`` outside the default domain."""
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def assert_fused(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    *,
    fused_ops: Mapping[str, int],
    replaced_ops: Iterable[str] = (),
    rtol: float,
    atol: float,
    feeds: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
) -> None:
    """Raise AssertionError unless ``fused`` is a correct fusion of ``original``."""
    try:
        onnx.checker.check_model(fused, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise AssertionError(f"the fused model fails the ONNX checker: {exc}") from None
    counts = op_counts(fused)
    wrong = {op: (n, counts.get(op, 0)) for op, n in fused_ops.items() if counts.get(op, 0) != n}
    assert not wrong, f"fused op counts (expected, found): {wrong}; all ops: {dict(counts)}"
    left = {op: counts[op] for op in replaced_ops if counts.get(op)}
    assert not left, f"ops the fusion should have replaced are still there: {left}"
    inputs = dict(feeds) if feeds is not None else random_inputs(original, seed=seed, dims=dims)
    expected = _run(original, inputs)
    got = _run(fused, inputs)
    assert expected.keys() == got.keys(), f"outputs {sorted(got)} != {sorted(expected)}"
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol, err_msg=f"output {name}")


def _run(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = make_session(model)
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in inputs.items() if k in wanted})
    return dict(zip(names, outputs, strict=True))
