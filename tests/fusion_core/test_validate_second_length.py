"""The check's second sequence length (fusion_core.validate._dims, second_length_dims):
a fused model right at 16 tokens and wrong elsewhere fails the check.

A model that pads the sequence to a multiple of a chunk and cuts the first S rows back
computes the same with and without the cut at 16 tokens, for every chunk that divides
16; the check chose 16 alone before, and passed a fused model that had lost the cut
(Kimi-Linear's delta attention, chunk 64, would be caught at 16; a chunk of 16 not).
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model
from autofusion.fusion_core.validate import MISMATCH, compare_models

H, D = 2, 4


def _padded_rows(chunk: int, cut: bool) -> onnx.ModelProto:
    """x [batch, sequence, H*D] -> rows padded to a multiple of ``chunk``, times 2, the
    first S kept where ``cut`` (the original), all of them where not (the wrong fusion)."""
    last = "kept = Slice (rows, zero, s1, two_axis)" if cut else "kept = Identity (rows)"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {H * D}] x) => (float[batch, {H}, rows, {D}] kept) {{
        x4 = Reshape (x, heads)
        xt = Transpose <perm = [0, 2, 1, 3]> (x4)
        xs = Shape (x)
        s1 = Slice (xs, one, two_axis)
        rem = Mod (s1, chunk)
        gap = Sub (chunk, rem)
        pad_n = Mod (gap, chunk)
        pads = ScatterElements <axis = 0> (pads0, pad_at, pad_n)
        padded = Pad (xt, pads)
        rows = Mul (padded, two)
        {last}
    }}"""
    ints = {"heads": [0, 0, H, D], "two_axis": [2], "chunk": [chunk], "pads0": [0] * 8,
            "pad_at": [6], "one": [1], "zero": [0]}  # fmt: skip
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two": np.float32(2.0)}
    return build_model(text, inits)


@settings(max_examples=8, deadline=None)
@given(chunk=st.sampled_from([2, 4, 8, 16]), batch=st.integers(1, 2))
def test_a_fusion_right_at_16_tokens_only_fails_at_the_second_length(chunk, batch) -> None:
    original, wrong = _padded_rows(chunk, cut=True), _padded_rows(chunk, cut=False)
    right = compare_models(original, original, dims={"batch": batch})
    assert right.passed and [p.dims["sequence"] for p in right.profiles] == [16, 7]
    result = compare_models(original, wrong, dims={"batch": batch}, rtol=0.0, atol=0.0)
    first, second = result.profiles
    assert first.passed and first.dims == {"batch": batch, "sequence": 16}
    assert not second.passed and second.dims == {"batch": batch, "sequence": 7}
    assert second.added and not result.passed and result.failure == MISMATCH
    assert "shape" in result.outputs[0].detail


def test_the_sequence_a_caller_gives_is_the_only_one() -> None:
    """Sizes the caller chose are the ones checked: no second length."""
    result = compare_models(_padded_rows(4, True), _padded_rows(4, False), dims={"sequence": 16})
    assert result.passed and [p.dims for p in result.profiles] == [{"batch": 1, "sequence": 16}]


def test_a_second_length_the_original_cannot_run_is_left_out() -> None:
    """A model that takes the tokens in pairs runs at 16 and not at 7: the check passes
    on 16 and says why 7 was left out (the original cannot run: not the fusion's fault)."""
    pairs = build_model(
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[batch, sequence, 4] x) => (float[batch, pairs, 8] y) {
            y = Reshape (x, in_pairs)
        }""",
        {"in_pairs": np.array([0, -1, 8], np.int64)},
    )
    result = compare_models(pairs, pairs)
    assert result.passed and [p.dims["sequence"] for p in result.profiles] == [16]
    (skipped,) = result.skipped
    assert "'sequence': 7" in skipped and "cannot run" in skipped
