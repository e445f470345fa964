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
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, canonical_twice, op_sequence, run_both

CLOSE = dict(rtol=1e-5, atol=1e-6)
EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "25"))
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


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    swap=st.booleans(),
    split=st.booleans(),
    seed=st.integers(0, 2**16),
)
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
