"""``identity_slice`` proves a Slice whole from sizes the graph ties together
(``fusion_core/sizes.py``), never from a symbol a shape inference put on a value.

Kimi-Linear's delta attention pads the sequence to a multiple of its chunk, works per
chunk and cuts the first S rows back; onnxruntime's symbolic inference auto-merged the
padded length with ``sequence``, so the padded rows read ``[batch, H, sequence, D]``,
the Slice's end (the sequence, read from the ids' shape) read as their whole length,
and the Slice was dropped: the fused model returned P rows for S at every length but
the multiples of the chunk. Here the padded values carry that label as value_info (a
model may bring it; the pre-pass inference never overwrites a known dim), which is what
the auto-merge left on Kimi's graph.
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, canonical_twice, optimize_quiet, run_both

EXACT = dict(rtol=0, atol=0)
H, D = 2, 4


def _padded_rows(chunk: int, labelled: bool = True) -> onnx.ModelProto:
    """x [batch, sequence, H*D] -> heads, padded to a multiple of ``chunk`` rows, worked
    on per chunk, back to rows, the first S kept; ``labelled``: the padded values say
    ``sequence`` rows, as the auto-merged inference said of Kimi's."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {H * D}] x) => (float[batch, sequence, {H}, {D}] y) {{
        x4 = Reshape (x, heads)
        xt = Transpose <perm = [0, 2, 1, 3]> (x4)
        xs = Shape (x)
        s1 = Slice (xs, one, two_axis)
        b1 = Slice (xs, zero, one)
        rem = Mod (s1, chunk)
        gap = Sub (chunk, rem)
        pad_n = Mod (gap, chunk)
        pads = ScatterElements <axis = 0> (pads0, pad_at, pad_n)
        padded = Pad (xt, pads)
        t5 = Concat <axis = 0> (b1, hh, minus1, chunk, dd)
        chunks = Reshape (padded, t5)
        work = Mul (chunks, two)
        t4 = Concat <axis = 0> (b1, hh, minus1, dd)
        rows = Reshape (work, t4)
        kept = Slice (rows, zero, s1, two_axis)
        y = Transpose <perm = [0, 2, 1, 3]> (kept)
    }}"""
    ints = {"heads": [0, 0, H, D], "two_axis": [2], "chunk": [chunk], "pads0": [0] * 8,
            "pad_at": [6], "minus1": [-1], "hh": [H], "dd": [D], "one": [1],
            "zero": [0]}  # fmt: skip
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two": np.float32(2.0)}
    model = build_model(text, inits)
    if labelled:
        for name in ("padded", "rows"):
            model.graph.value_info.append(
                onnx.helper.make_tensor_value_info(
                    name, onnx.TensorProto.FLOAT, ["batch", H, "sequence", D]
                )
            )
    return model


def test_the_padded_rows_labelled_sequence_keep_their_slice() -> None:
    canonical, done, _ = canonical_twice(_padded_rows(4))[:3]
    assert "identity_slice" not in done, done
    assert [n.op_type for n in canonical.graph.node].count("Slice") == 3


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk=st.sampled_from([2, 4, 8]), length=st.integers(1, 11))
def test_the_fused_model_of_labelled_padded_rows_is_right_at_every_length(chunk, length) -> None:
    """Right at the multiples of the chunk only, before: the Slice it dropped is a no-op
    there (the check's 16 is one, for every chunk that divides it)."""
    model = _padded_rows(chunk)
    fused = optimize_quiet(model, target="onnxruntime").to_proto()
    for n in (length, chunk * 2):
        x = np.random.default_rng(n).standard_normal((1, n, H * D)).astype(np.float32)
        run_both(model, fused, feeds={"x": x}, **EXACT)


def _cache_mask(end_from: str) -> onnx.ModelProto:
    """optimum's KV-cache mask: ``key <= query`` over past + sequence keys (a Range to
    the cache's plus the ids' length) and the attention mask, then ``mask[..., :end]``
    with ``end`` the length of ``end_from``'s last axis (the attention mask: every key)."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (int64[batch, sequence_length] ids, int64[batch, KEYS] attention_mask,
       float[batch, 2, past_sequence_length, 4] past)
      => (bool[batch, 1, sequence_length, KEYS] y) {{
        past_shape = Shape (past)
        p = Gather <axis = 0> (past_shape, two_s)
        ids_shape = Shape (ids)
        s = Gather <axis = 0> (ids_shape, one_s)
        total = Add (p, s)
        keys = Range (zero_s, total, one_s)
        queries = Range (p, total, one_s)
        k4 = Unsqueeze (keys, first_three)
        q4 = Unsqueeze (queries, q_axes)
        causal = LessOrEqual (k4, q4)
        allowed = Cast <to = 9> (attention_mask)
        a4 = Unsqueeze (allowed, a_axes)
        mask = And (causal, a4)
        end_shape = Shape ({end_from})
        end = Slice (end_shape, one, two)
        m = Slice (mask, zero, end, three)
        y = Not (m)
    }}"""
    ints = {"zero": [0], "one": [1], "two": [2], "three": [3], "first_three": [0, 1, 2],
            "q_axes": [0, 1, 3], "a_axes": [1, 2]}  # fmt: skip
    inits = {k: np.array(v, np.int64) for k, v in ints.items()}
    inits |= {k: np.array(v, np.int64) for k, v in {"zero_s": 0, "one_s": 1, "two_s": 2}.items()}
    model = build_model(text, inits)
    for value in (model.graph.input[1], model.graph.output[0]):  # onnx's parser reads no sums
        value.type.tensor_type.shape.dim[-1].dim_param = "past_sequence_length + sequence_length"
    return model


def test_the_cache_mask_cut_to_every_key_is_whole() -> None:
    """The Slice optimum's eager attention writes (``mask[..., : key_length]``): the
    attention mask's declared ``past_sequence_length + sequence_length`` is the length
    of the Range to the cache's plus the ids' length, so the Slice goes (a fused
    attention then reads the mask's builder)."""
    model = _cache_mask("attention_mask")
    canonical, done, again = canonical_twice(model)[:3]
    assert done.get("identity_slice") == 1 and again == 0, done
    rng = np.random.default_rng(0)
    feeds = {
        "ids": rng.integers(0, 9, (2, 3)),
        "attention_mask": rng.integers(0, 2, (2, 8)),
        "past": rng.standard_normal((2, 2, 5, 4)).astype(np.float32),
    }
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_the_cache_mask_cut_to_the_new_tokens_keeps_its_slice() -> None:
    """An end of ``sequence_length`` keys is not the mask's ``past + sequence``."""
    assert "identity_slice" not in canonical_twice(_cache_mask("ids"))[1]
