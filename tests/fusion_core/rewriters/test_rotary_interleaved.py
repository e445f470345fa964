"""``rotary`` on GPT-J's interleaved spelling (``rotate_every_two``), written as the
TorchScript exporter writes transformers' GPT-J attention: heads ``[batch, seq, 4, 16]``
split from a ``[batch, seq, 64]`` projection, the first 8 features rotated in pairs
``(x_2i, x_2i+1)`` (``rotary_dim = 8``) or all 16, sin and cos gathered from one constant
table by ``position_ids`` and split, or computed from the position ids; each repeated
per pair by ``Tile`` (``repeat_interleave``).

Tolerance: rtol = atol = 1e-5; the outputs differed by about 1e-7.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    build_model,
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)
from tests.fusion_core.decoder_text import ANGLES

TOL = dict(rtol=1e-5, atol=1e-5)
ROTARY = "com.microsoft::RotaryEmbedding"
POSITIONS = 32


def gptj_block(
    *, partial: bool, gathered: bool, swapped: bool = False, expand: bool = False
) -> onnx.ModelProto:
    """One projection's rotation; ``swapped`` pairs ``(-even, odd)``, not a rotation;
    ``expand``: the dynamo exporter's repeat_interleave (one Unsqueeze to [2, 4], an
    Expand) and Split by ``num_outputs``."""
    rotary = 8 if partial else 16
    half = rotary // 2
    inv_freq = 1.0 / (10000 ** (np.arange(0, rotary, 2) / rotary))
    angles = np.arange(POSITIONS)[:, None] * inv_freq[None]
    inits = {
        "w": np.random.default_rng(0).standard_normal((64, 64)) * 0.3,
        "heads": np.array([0, 0, 4, 16], np.int64),
        "table": np.concatenate([np.sin(angles), np.cos(angles)], axis=1),
        "halves": np.array([half, half], np.int64),
        "inv_freq": inv_freq,
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "rdim": np.array([rotary], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "last": np.array([3], np.int64),
        "two": np.array([2], np.int64),
        "axis_2": np.array([2], np.int64),
        "axis_4": np.array([4], np.int64),
        "axes_2_4": np.array([2, 4], np.int64),
        "axis_last": np.array([-1], np.int64),
        "repeat": np.array([1, 1, 1, 1, 2], np.int64),
        "angle_shape": np.array([0, 0, 1, rotary], np.int64),
        "pair_shape": np.array([0, 0, 4, rotary], np.int64),
    }
    if gathered:
        angle_lines = [
            "sincos = Gather <axis = 0> (table, position_ids)",
            "sin_h, cos_h = Split <axis = -1, num_outputs = 2> (sincos)"
            if expand
            else "sin_h, cos_h = Split <axis = -1> (sincos, halves)",
        ]
    else:
        angle_lines = [
            *ANGLES,
            "sin_h = Sin (freqs)",
            "cos_h = Cos (freqs)",
        ]
    for name in ("sin", "cos"):
        if expand:
            angle_lines += [
                f"{name}_4 = Unsqueeze ({name}_h, axes_2_4)",
                f"{name}_t = Expand ({name}_4, repeat)",
            ]
        else:
            angle_lines += [
                f"{name}_2 = Unsqueeze ({name}_h, axis_2)",
                f"{name}_4 = Unsqueeze ({name}_2, axis_4)",
                f"{name}_t = Tile ({name}_4, repeat)",
            ]
        angle_lines.append(f"{name}_r = Reshape ({name}_t, angle_shape)")
    source = "x" if not partial else "xr"
    negated, kept = ("even", "odd") if swapped else ("odd", "even")
    body = [
        "q = MatMul (h, w)",
        "x = Reshape (q, heads)",
        *(
            ["xr = Slice (x, zero, rdim, last)", "xp = Slice (x, rdim, end, last)"]
            if partial
            else []
        ),
        f"even = Slice ({source}, zero, end, last, two)",
        f"odd = Slice ({source}, one, end, last, two)",
        f"neg = Neg ({negated})",
        "neg_u = Unsqueeze (neg, axis_last)",
        f"even_u = Unsqueeze ({kept}, axis_last)",
        "pairs = Concat <axis = -1> (neg_u, even_u)",
        "rot = Reshape (pairs, pair_shape)",
        f"cos_mul = Mul ({source}, cos_r)",
        "sin_mul = Mul (rot, sin_r)",
        "y_rot = Add (cos_mul, sin_mul)" if partial else "y = Add (cos_mul, sin_mul)",
        *(["y = Concat <axis = -1> (y_rot, xp)"] if partial else []),
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 64] h, int64[batch, seq] position_ids) => (float[batch, seq, 4, 16] y) {{
        {chr(10).join(angle_lines + body)}
    }}"""
    return build_model(text, inits)


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "h": rng.standard_normal((batch, seq, 64)).astype(np.float32),
        "position_ids": rng.integers(0, POSITIONS, (batch, seq)).astype(np.int64),
    }


@pytest.mark.parametrize("expand", [False, True], ids=["tile", "expand"])
@pytest.mark.parametrize("gathered", [True, False], ids=["gathered-table", "computed"])
@pytest.mark.parametrize("partial", [True, False], ids=["partial", "full"])
def test_interleaved_rotary_becomes_an_interleaved_rotary_embedding(partial, gathered, expand):
    model = gptj_block(partial=partial, gathered=gathered, expand=expand)
    result = optimize_quiet(model, target="onnxruntime")
    name = "rotary_embedding_interleaved"
    assert result.counts == {name: 1}, result.counts
    fused = result.to_proto()
    ops = op_sequence(fused)
    assert ops.count(ROTARY) == 1 and "Tile" not in ops and "Neg" not in ops, ops
    assert "Expand" not in ops and "Split" not in ops, ops
    (rotary,) = [n for n in fused.graph.node if n.op_type == "RotaryEmbedding"]
    attrs = {a.name: a.i for a in rotary.attribute}
    assert attrs == {"num_heads": 4, "rotary_embedding_dim": 8 if partial else 16, "interleaved": 1}
    assert (rotary.input[1] == "position_ids") == gathered  # the table's own ids
    for batch, seq in ((1, 1), (2, 5), (3, 7)):
        run_both(model, fused, feeds=feeds(batch, seq), **TOL)


def test_pairs_in_the_other_order_are_no_rotation_and_stay():
    model = gptj_block(partial=True, gathered=True, swapped=True)
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {}, result.counts
    reasons = misses(result, "rotary_embedding_interleaved")
    assert any("are not the even and odd features" in r for r in reasons), reasons
    run_both(model, result.to_proto(), feeds=feeds(2, 5), **TOL)
