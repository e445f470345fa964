"""The two canonical rules gpt-oss's attention needs, on small generated graphs.

* ``rotary_halves``: ``Concat(x1 * c - x2 * s, x2 * c + x1 * s)`` of the two halves of
  each head (cut by two Slices or one Split, each product's operands in either order,
  the Add's too) becomes ``x * Concat(c, c) + Concat(-x2, x1) * Concat(s, s)``;
* ``softmax_shift``: ``Softmax(x - ReduceMax(x))`` becomes ``Softmax(x)``.

Both are exact bit for bit (the rules' docstrings say why), so the outputs are compared
with rtol = atol = 0 on onnxruntime (its optimizations off). A hypothesis generator
draws the shapes and the spelling; the example budget is ``AUTOFUSION_SPELLING_EXAMPLES``
(25 in ``make test``). What no fusion took is put back by ``undo_unused``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import build_model, canonical_twice, run_both
from tests.fusion_core.spelling_settings import EXAMPLES, SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

EXACT = dict(rtol=0, atol=0)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def rotation(half: int, *, split: bool, swap: tuple[bool, bool], wrong_sign: bool = False):
    """gpt-oss's ``_apply_rotary_emb`` on ``x[B, N, S, 2h]`` with ``c, s[B, 1, S, h]``:
    ``swap`` puts the angle first in the products and the sine product first in the
    second half's Add; ``wrong_sign`` adds where it subtracts."""
    mul_first, add_order = swap

    def mul(a: str, b: str, out: str) -> str:
        return f"{out} = Mul ({b}, {a})" if mul_first else f"{out} = Mul ({a}, {b})"

    cut = (
        ["x1, x2 = Split <axis = -1, num_outputs = 2> (x)"]
        if split
        else ["x1 = Slice (x, zero, h, last)", "x2 = Slice (x, h, end, last)"]
    )
    second = "o2 = Add (x1s, x2c)" if add_order else "o2 = Add (x2c, x1s)"
    body = [
        *cut,
        "cu = Unsqueeze (c, one)",
        "su = Unsqueeze (s, one)",
        mul("x1", "cu", "x1c"),
        mul("x2", "su", "x2s"),
        "o1 = Add (x1c, x2s)" if wrong_sign else "o1 = Sub (x1c, x2s)",
        mul("x2", "cu", "x2c"),
        mul("x1", "su", "x1s"),
        second,
        "rotated = Concat <axis = -1> (o1, o2)",
        "y = Identity (rotated)",  # a graph output is left as it is
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 4, seq, {2 * half}] x, float[batch, seq, {half}] c,
       float[batch, seq, {half}] s) => (float[batch, 4, seq, {2 * half}] y) {{
        {chr(10).join(body)}
    }}"""
    inits = {
        "zero": np.array([0], np.int64),
        "h": np.array([half], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "last": np.array([-1], np.int64),
        "one": np.array([1], np.int64),
    }
    return build_model(text, inits)


def _feeds(half: int, batch: int, seq: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0, 6.3, (batch, seq, half)).astype(np.float32)
    return {
        "x": rng.standard_normal((batch, 4, seq, 2 * half)).astype(np.float32),
        "c": np.cos(angles),
        "s": np.sin(angles),
    }


@SPELLINGS
@given(
    half=st.sampled_from([2, 4, 8]),
    split=st.booleans(),
    swap=st.tuples(st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
def test_a_rotation_of_two_halves_is_written_with_rotate_half_exactly(half, split, swap, seed):
    model = rotation(half, split=split, swap=swap)
    canonical, done, again, work = canonical_twice(model)
    assert done.get("rotary_halves") == 1 and again == 0, done
    ops = _ops(canonical)
    assert ops.count("Neg") == 1 and "Sub" not in ops and "Split" not in ops, ops
    for batch, seq in ((1, 3), (2, 5)):
        run_both(model, canonical, feeds=_feeds(half, batch, seq, seed), **EXACT)
    # no fusion took it: the two-halves spelling comes back, with the same values
    assert undo_unused(work.graph)["rotary_halves"] == 1
    undone = ir.to_proto(work)
    assert "Neg" not in _ops(undone) and "Sub" in _ops(undone), _ops(undone)
    run_both(model, undone, feeds=_feeds(half, 2, 5, seed), **EXACT)


def test_a_rotation_with_another_sign_is_left_alone() -> None:
    model = rotation(4, split=False, swap=(False, False), wrong_sign=True)
    canonical, done, _again, _work = canonical_twice(model)
    assert "rotary_halves" not in done and "Neg" not in _ops(canonical)


def sink_softmax(*, reduced: int = -1, axis: int = -1) -> onnx.ModelProto:
    """gpt-oss's ``softmax(c - c.max(-1, keepdim=True))`` of ``c = cat(s, sinks)``."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, seq, seq] s, float[1, 2, 1, 1] sinks) => (float[batch, 2, seq, seq] p) {{
        shape = Shape <end = 3> (s)
        rows = Concat <axis = 0> (shape, one)
        column = Expand (sinks, rows)
        c = Concat <axis = -1> (s, column)
        peak = ReduceMax <keepdims = 1> (c, axes)
        shifted = Sub (c, peak)
        both = Softmax <axis = {axis}> (shifted)
        p = Slice (both, zero, minus_one, last)
    }}"""
    inits = {
        "one": np.array([1], np.int64),
        "axes": np.array([reduced], np.int64),
        "zero": np.array([0], np.int64),
        "minus_one": np.array([-1], np.int64),
        "last": np.array([-1], np.int64),
    }
    return build_model(text, inits)


@settings(max_examples=EXAMPLES, deadline=None)
@given(seq=st.integers(1, 9), spread=st.sampled_from([1.0, 30.0, 1e4]), seed=st.integers(0, 99))
def test_the_max_subtracted_before_the_softmax_goes_exactly(seq, spread, seed) -> None:
    model = sink_softmax()
    canonical, done, again, _work = canonical_twice(model)
    assert done.get("softmax_shift") == 1 and again == 0, done
    assert "ReduceMax" not in _ops(canonical) and "Sub" not in _ops(canonical)
    rng = np.random.default_rng(seed)
    scores = (rng.standard_normal((2, 2, seq, seq)) * spread).astype(np.float32)
    scores[0, :, 0, : seq // 2] = np.finfo(np.float32).min  # masked keys, as eager masks
    feeds = {"s": scores, "sinks": rng.standard_normal((1, 2, 1, 1)).astype(np.float32)}
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_a_max_or_a_softmax_over_another_axis_stays() -> None:
    for model in (sink_softmax(reduced=2), sink_softmax(axis=2)):
        _canonical, done, _again, _work = canonical_twice(model)
        assert "softmax_shift" not in done
