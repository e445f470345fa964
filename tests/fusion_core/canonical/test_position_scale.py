"""Rule ``position_scale`` on small generated graphs: Ministral-3's query heads, rotated
and then scaled by one factor per position,

    y = (T * cos + Concat(-T2, T1) * sin) * c     T = Transpose(Reshape(q, [B, S, N, H]))

become the rotation of ``q * c`` (``c`` as ``[., S, 1]``), which the rotary and attention
patterns read. The product is rounded at another place, so the outputs agree to
rtol = 1e-5, atol = 1e-6 on onnxruntime (its optimizations off). A hypothesis generator
draws the factor's layout, the Mul's operand order, the halves cut by Slices or a Split
and the sizes; the budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``).
A factor per head, one computed from the heads themselves (a norm of each head) and a
slice along the positions are no such scale and stay.

Where no fusion took the rotation, ``undo_unused`` scales the rotated heads again: the
model comes out with the op sequence it went in with and computes the same values bit
for bit (rtol = atol = 0: the same ops on the same inputs). Where the rotary fuses (a
projected query, angles from the position ids), the rule still serves it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import (
    build_model,
    canonical_twice,
    op_sequence,
    optimize_quiet,
    run_both,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

CLOSE = dict(rtol=1e-5, atol=1e-6)
EXACT = dict(rtol=0, atol=0)
HEADS, HALF = 4, 4


def rotated_scaled(
    *,
    factor: str = "[1, 1, seq, 1]",
    swap: bool = False,
    split: bool = False,
    of_heads: bool = False,
    cut_axis: int = -1,
) -> onnx.ModelProto:
    """``q[B, S, N * 2h]`` split into heads, rotated by ``cos, sin[B, S, 2h]``, scaled by
    ``c`` (a graph input laid out as ``factor``, or the heads' own RMS: ``of_heads``);
    ``cut_axis`` the axis rotate_half cuts (the positions' axis is no rotation)."""
    cut = (
        ["t1, t2 = Split <axis = -1, num_outputs = 2> (t)"]
        if split
        else [
            f"t1 = Slice (t, zero, h, axis_{cut_axis % 4})",
            f"t2 = Slice (t, h, end, axis_{cut_axis % 4})",
        ]
    )
    scale = (
        ["sq = Mul (t, t)", "ms = ReduceMean <keepdims = 1> (sq, last)", "c = Sqrt (ms)"]
        if of_heads
        else []
    )
    product = "y = Mul (c, r)" if swap else "y = Mul (r, c)"
    body = [
        "heads = Reshape (q, split_shape)",
        "t = Transpose <perm = [0, 2, 1, 3]> (heads)",
        *cut,
        "neg = Neg (t2)",
        f"turned = Concat <axis = {cut_axis}> (neg, t1)",
        "cu = Unsqueeze (cos, one)",
        "su = Unsqueeze (sin, one)",
        "tc = Mul (t, cu)",
        "ts = Mul (turned, su)",
        "r = Add (tc, ts)",
        *scale,
        product,
    ]
    factor_input = "" if of_heads else f", float{factor} c"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, {HEADS * 2 * HALF}] q, float[batch, seq, {2 * HALF}] cos,
       float[batch, seq, {2 * HALF}] sin{factor_input})
      => (float[batch, {HEADS}, seq, {2 * HALF}] y) {{
        {chr(10).join(body)}
    }}"""
    inits = {
        "split_shape": np.array([0, 0, HEADS, 2 * HALF], np.int64),
        "zero": np.array([0], np.int64),
        "h": np.array([HALF], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "axis_3": np.array([-1], np.int64),
        "axis_2": np.array([2], np.int64),
        "last": np.array([-1], np.int64),
        "one": np.array([1], np.int64),
    }
    return build_model(text, inits)


def _feeds(factor: tuple[int, ...] | None, batch: int, seq: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, 6.3, (batch, seq, HALF)).astype(np.float32)
    angles = np.concatenate([angles, angles], axis=-1)
    feeds = {
        "q": rng.standard_normal((batch, seq, HEADS * 2 * HALF)).astype(np.float32),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
    }
    if factor is not None:
        shape = tuple(batch if d == "batch" else seq if d == "seq" else d for d in factor)
        feeds["c"] = rng.uniform(0.5, 2.0, shape).astype(np.float32)
    return feeds


LAYOUTS = {  # the factor as the model writes it, and its sizes
    "[1, 1, seq, 1]": (1, 1, "seq", 1),
    "[batch, 1, seq, 1]": ("batch", 1, "seq", 1),
    "[seq, 1]": ("seq", 1),
    "[1, seq, 1]": (1, "seq", 1),
}


# the blocks both generated tests draw: the factor's layout, the Mul's operand order, the
# projection split or not, the inputs' seed
_SCALED_BLOCKS = given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    swap=st.booleans(),
    split=st.booleans(),
    seed=st.integers(0, 2**16),
)


@SPELLINGS
@_SCALED_BLOCKS
def test_a_per_position_scale_of_rotated_heads_scales_the_projection(
    layout, swap, split, seed
) -> None:
    model = rotated_scaled(factor=layout, swap=swap, split=split)
    canonical, done, again, _work = canonical_twice(model)
    assert done.get("position_scale") == 1 and again == 0, done
    ops = op_sequence(canonical)
    first_mul, transpose = ops.index("Mul"), ops.index("Transpose")
    assert first_mul < transpose, ops  # the scale comes before the head split now
    for batch, seq in ((1, 1), (2, 5), (1, 9)):
        run_both(model, canonical, feeds=_feeds(LAYOUTS[layout], batch, seq, seed), **CLOSE)


def test_a_scale_per_head_of_the_heads_or_across_positions_stays() -> None:
    for model in (
        rotated_scaled(factor=f"[1, {HEADS}, seq, 1]"),
        rotated_scaled(of_heads=True),
        rotated_scaled(cut_axis=2),
    ):
        _canonical, done, _again, _work = canonical_twice(model)
        assert "position_scale" not in done, done


@SPELLINGS
@_SCALED_BLOCKS
def test_a_scale_no_fusion_took_comes_back_as_it_went_in(layout, swap, split, seed) -> None:
    model = rotated_scaled(factor=layout, swap=swap, split=split)
    _canonical, done, _again, work = canonical_twice(model)
    assert done.get("position_scale") == 1, done
    assert undo_unused(work.graph)["position_scale"] == 1
    undone = ir.to_proto(work)
    assert op_sequence(undone) == op_sequence(model)
    scale = [n for n in undone.graph.node if n.op_type == "Mul"][-1]
    assert list(scale.input) == (["c", "r"] if swap else ["r", "c"]), scale
    feeds = _feeds(LAYOUTS[layout], 2, 5, seed)
    run_both(model, undone, feeds=feeds, **EXACT)
    # through the whole optimizer, the rotary pattern left out: nothing fuses
    result = optimize_quiet(model, target="onnxruntime", patterns=["gelu_tanh"])
    assert op_sequence(result.to_proto()) == op_sequence(model), result.prepasses
    run_both(model, result.to_proto(), feeds=feeds, **EXACT)


def projected_rotation(heads: int = HEADS, half: int = HALF) -> onnx.ModelProto:
    """``rotated_scaled``'s block with the query projected from ``x`` and the angles
    computed from ``position_ids`` as transformers does: the rotary pattern fuses it."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, 16] x, int64[batch, seq] position_ids, float[1, 1, seq, 1] c)
      => (float[batch, {heads}, seq, {2 * half}] y) {{
        q = MatMul (x, wq)
        split = Reshape (q, split_shape)
        t = Transpose <perm = [0, 2, 1, 3]> (split)
        pos = Cast <to = 1> (position_ids)
        pos_u = Unsqueeze (pos, last)
        freqs = Mul (pos_u, inv_freq)
        emb = Concat <axis = -1> (freqs, freqs)
        cos = Cos (emb)
        sin = Sin (emb)
        t1 = Slice (t, zero, h, last)
        t2 = Slice (t, h, end, last)
        neg = Neg (t2)
        turned = Concat <axis = -1> (neg, t1)
        cu = Unsqueeze (cos, one)
        su = Unsqueeze (sin, one)
        tc = Mul (t, cu)
        ts = Mul (turned, su)
        r = Add (tc, ts)
        y = Mul (r, c)
    }}"""
    inits = {
        "wq": np.random.default_rng(0).standard_normal((16, heads * 2 * half)) * 0.3,
        "inv_freq": 1.0 / (10000 ** (np.arange(0, 2 * half, 2) / (2 * half))),
        "split_shape": np.array([0, 0, heads, 2 * half], np.int64),
        "zero": np.array([0], np.int64),
        "h": np.array([half], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "last": np.array([-1], np.int64),
        "one": np.array([1], np.int64),
    }
    return build_model(text, inits)


def test_a_scale_of_a_fused_rotation_stays_on_the_projection() -> None:
    model = projected_rotation()
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {"rotary_embedding": 1}, result.counts
    words = "rotated heads scaled per position made rotations of the scaled projection"
    assert f"canonical form: 1 {words}" in result.prepasses, result.prepasses
    ops = op_sequence(result.to_proto())
    assert ops.index("Mul") < ops.index("com.microsoft::RotaryEmbedding"), ops
    rng = np.random.default_rng(3)
    for batch, seq in ((1, 3), (2, 5)):
        feeds = {
            "x": rng.standard_normal((batch, seq, 16)).astype(np.float32),
            "position_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
            "c": rng.uniform(0.5, 2.0, (1, 1, seq, 1)).astype(np.float32),
        }
        run_both(model, result.to_proto(), feeds=feeds, **CLOSE)
