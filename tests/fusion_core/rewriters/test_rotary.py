"""``rotary`` on its own, on 4-D heads ``x[batch, 4, seq, 16]`` (not a head split, so
the op rotates ``x`` itself): the partial form (the first 8 features rotated, Phi-3's
``partial_rotary_factor = 0.5``) with angles from ``position_ids`` (``Bc = B``: cache rows
``b * S + s``), and the full form with angles from ``Range(0, S)`` (``Bc = 1``, as the
dynamo exporter writes a prefill: the one-element position ids ``[0]``).

Tolerance: rtol = atol = 1e-5; RotaryEmbedding computes ``x * cos - x2 * sin`` as the
graph does, the outputs differed by about 1e-7.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import build_model, op_sequence, optimize_quiet, run_both
from tests.fusion_core.decoder_text import ANGLES, FREQ_TABLES

TOL = dict(rtol=1e-5, atol=1e-5)
ROTARY = "com.microsoft::RotaryEmbedding"


def rotary_constants(rotary: int) -> dict[str, np.ndarray]:
    """The index constants of a rotary block of ``rotary`` rotated features: its halves'
    and parts' bounds, the axes, the positions' Range."""
    return {
        "zero": np.array([0], np.int64),
        "half": np.array([rotary // 2], np.int64),
        "rdim": np.array([rotary], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "last": np.array([-1], np.int64),
        "axis_1": np.array([1], np.int64),
        "axis_last": np.array([-1], np.int64),
        "start": np.array(0, np.int64),
        "step": np.array(1, np.int64),
        "index_2": np.array(2, np.int64),
    }


def rotary_model(*, partial: bool) -> onnx.ModelProto:
    rotary = 8 if partial else 16
    inits = {
        "inv_freq": 1.0 / (10000 ** (np.arange(0, rotary, 2) / rotary)),
        **rotary_constants(rotary),
    }
    if partial:  # angles from the position ids: [batch, seq, 8]
        angles = ANGLES
        inputs = "float[batch, 4, seq, 16] x, int64[batch, seq] position_ids"
        body = ["xr = Slice (x, zero, rdim, last)", "xp = Slice (x, rdim, end, last)"]
        rotated = "xr"
    else:  # angles from Range(0, S): [1, seq, 16]
        angles = [
            "x_shape = Shape (x)",
            "seq_len = Gather <axis = 0> (x_shape, index_2)",
            "ar = Range (start, seq_len, step)",
            "ar_f = Cast <to = 1> (ar)",
            "ar_u = Unsqueeze (ar_f, axis_last)",
            "freqs2 = Mul (ar_u, inv_freq)",
            "freqs = Unsqueeze (freqs2, zero)",
        ]
        inputs = "float[batch, 4, seq, 16] x"
        body = []
        rotated = "x"
    body = [
        *angles,
        *FREQ_TABLES,
        *body,
        f"lo = Slice ({rotated}, zero, half, last)",
        f"hi = Slice ({rotated}, half, end, last)",
        "neg = Neg (hi)",
        "rot = Concat <axis = -1> (neg, lo)",
        f"c = Mul ({rotated}, cos_u)",
        "s = Mul (rot, sin_u)",
        "sum = Add (c, s)" if partial else "y = Add (c, s)",
    ]
    if partial:
        body.append("y = Concat <axis = -1> (sum, xp)")
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({inputs}) => (float[batch, 4, seq, 16] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


@pytest.mark.parametrize("partial", [True, False], ids=["partial-position-ids", "full-arange"])
def test_rotary_becomes_rotary_embedding(partial):
    model = rotary_model(partial=partial)
    result = optimize_quiet(model, target="onnxruntime")
    pattern = "rotary_embedding"
    assert result.counts == {pattern: 1}
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    ops = op_sequence(fused)
    assert ops.count(ROTARY) == 1 and "Neg" not in ops
    (node,) = [n for n in fused.graph.node if n.op_type == "RotaryEmbedding"]
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs == {"num_heads": 4, "rotary_embedding_dim": 8 if partial else 16}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in fused.graph.initializer}
    if not partial:  # one row per position for every batch: the offset form [0]
        assert inits[node.input[1]].tolist() == [0]
    else:  # rows b * S + s of the batched table, computed in the graph
        assert node.input[1] not in inits
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 5), (3, 2)):
        feeds = {"x": rng.standard_normal((batch, 4, seq, 16)).astype(np.float32)}
        if partial:
            feeds["position_ids"] = rng.integers(0, 100, (batch, seq)).astype(np.int64)
        run_both(model, fused, feeds=feeds, **TOL)


def folded_rotary_model(seq: int, rotary: int, *, halves_equal: bool = True) -> onnx.ModelProto:
    """The rotary of a graph exported for one length: constant folding made the cos and
    sin ``[1, 1, S, r]`` initializers (positions 0 .. S - 1), as torch.export leaves a
    Gated DeltaNet hybrid's prefill; x is ``[batch, 4, S, 16]``, the first ``r`` rotated."""
    inv_freq = 1.0 / (10000 ** (np.arange(0, rotary, 2) / rotary))
    angles = np.arange(seq)[:, None] * inv_freq[None, :]
    second = angles if halves_equal else angles * 1.5
    emb = np.concatenate([angles, second], axis=-1)[None, None].astype(np.float32)
    inits = {
        "cos_t": np.cos(emb),
        "sin_t": np.sin(emb),
        "zero": np.array([0], np.int64),
        "half": np.array([rotary // 2], np.int64),
        "rdim": np.array([rotary], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "last": np.array([-1], np.int64),
    }
    body = [
        "xr = Slice (x, zero, rdim, last)",
        "xp = Slice (x, rdim, end, last)",
        "lo = Slice (xr, zero, half, last)",
        "hi = Slice (xr, half, end, last)",
        "neg = Neg (hi)",
        "rot = Concat <axis = -1> (neg, lo)",
        "c = Mul (xr, cos_t)",
        "s = Mul (rot, sin_t)",
        "sum = Add (c, s)",
        "y = Concat <axis = -1> (sum, xp)",
    ]
    text = f"""<ir_version: 10, opset_import: ["" : 23]>
    g (float[batch, 4, {seq}, 16] x) => (float[batch, 4, {seq}, 16] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


@pytest.mark.parametrize("target", ["onnxruntime", "generic"])
@pytest.mark.parametrize(("seq", "rotary"), [(7, 16), (5, 8), (1, 16)])
def test_a_folded_constant_table_is_the_cache(target, seq, rotary):
    """The table's first half, one row per position, is the cache; the op rotates row s
    of it at position s for every batch (the offset form on onnxruntime, [B, S] position
    ids for ONNX RotaryEmbedding)."""
    model = folded_rotary_model(seq, rotary)
    result = optimize_quiet(model, target=target)
    assert result.counts == {"rotary_embedding": 1}, result.counts
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    assert "Neg" not in op_sequence(fused)
    rng = np.random.default_rng(seq)
    for batch in (1, 3):
        feeds = {"x": rng.standard_normal((batch, 4, seq, 16)).astype(np.float32)}
        run_both(model, fused, feeds=feeds, **TOL)


def test_a_folded_table_with_unequal_halves_is_refused():
    model = folded_rotary_model(7, 16, halves_equal=False)
    result = optimize_quiet(model, target="onnxruntime")
    assert "rotary_embedding" not in result.counts
    reasons = [m.reason for m in result.near_misses if m.pattern == "rotary_embedding"]
    assert any("halves of the constant cos" in r for r in reasons), reasons
