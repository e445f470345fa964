"""A causal mask summed with a causal padding mask becomes GroupQueryAttention, exactly.

GPT-Neo's attention fills the scores a causal buffer masks (``Where(causal, scores,
lowest)``, a band of ``W`` keys in its local layers) and adds transformers' 4-D mask,
``Where(causal AND padding, 0, lowest)``; the canonical form sums the two masks
(``one_bias``). A row whose keys are all padding is then neither NaN nor the average of
every key: the keys after the query get ``lowest + lowest = -inf``, so it averages the
keys the causal term allows, what the causal kernel gives it with the sum as its bias
(``group_query_attention/_summed.py`` states the proof). A generator (hypothesis) writes
the block, drawing the heads (grouped or not), the fills (float32's lowest, ``-inf``,
``-1e30``), the causal term as a fill of the scores or an added mask, a band or not, the
order of the padding term's conjuncts and a cache or not; every block must become one
GroupQueryAttention with ``causal = 1`` (``local_window_size = W`` where the band's fill
is far below the padding's, else a near miss saying the window stays in the bias) and
compute what the original computes on batches with left padding and random holes, rows
with no key included. Where the sum is not proven (the keys after a query not far below
its own padded key; a padding fill of ``-inf``, NaN on a row of padding alone; a padding
term that is not causal) the block stays MultiHeadAttention with the reason as a near
miss, and a hand-written GroupQueryAttention shows the proof's condition matters there.
onnxruntime's kernel gives 0 for a row whose largest logit is float32's lowest exactly
(``test_every_row_of_a_fully_padded_batch_matches`` fails without the halving of the
bias that ``_summed`` asks for).

Tolerance: rtol = atol = 1e-5, as in test_group_query_attention.py (the kernel sums in
another order; at these sizes the outputs differ by about 1e-6). The example budget is
``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import optimize_quiet, run_both
from tests.fusion_core.decoder_text import (
    CAUSAL,
    PADDING,
    TEXT_CONSTANTS,
    graph_model,
    kv_cache,
    padded_feeds,
    positions,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, HEADS, SIZE = 32, 4, 8
ORT = dict(target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Block:
    kv_heads: int  # 4: no repeat_kv (GPT-Neo's), else grouped
    band_fill: float  # a: the causal (or banded) term's masked value
    pad_fill: float  # b: the padding term's
    window: int | None  # W of a band, None for the plain causal term
    fill: bool  # Where(band, scores, a) + padding, not scores + Where(band, 0, a) + padding
    padding_first: bool  # Where(padding AND causal, ...), not (causal AND padding)
    cache: bool
    causal_padding: bool = True  # False: the padding term alone, not causal


@st.composite
def blocks(draw) -> Block:
    kv_heads = draw(st.sampled_from([1, 2, 4]))
    return Block(
        kv_heads=kv_heads,
        band_fill=draw(st.sampled_from([LOWEST, -np.inf])),
        pad_fill=draw(st.sampled_from([LOWEST, -1e30])),
        window=draw(st.one_of(st.none(), st.integers(1, 10))),
        fill=draw(st.booleans()),
        padding_first=draw(st.booleans()),
        # without a cache or grouped heads the block is MultiHeadAttention's (tried first)
        cache=True if kv_heads == HEADS else draw(st.booleans()),
    )


def attention_block(b: Block) -> onnx.ModelProto:
    """One attention block whose scores take a causal (or banded) mask and a padding
    mask, one after the other, as ``b`` says."""
    rng = np.random.default_rng(b.kv_heads + (b.window or 0))
    inits = {
        "wq": rng.standard_normal((HIDDEN, HEADS * SIZE)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, b.kv_heads * SIZE)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, b.kv_heads * SIZE)) * 0.3,
        "q_split": np.array([0, 0, HEADS, SIZE], np.int64),
        "kv_split": np.array([0, 0, b.kv_heads, SIZE], np.int64),
        "repeat": np.array([1, 1, HEADS // b.kv_heads, 1, 1], np.int64),
        "kv_merge": np.array([0, HEADS, -1, SIZE], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "axis_2": np.array([2], np.int64),
        **TEXT_CONSTANTS,
        "w": np.array(b.window or 0, np.int64),
        "zero_f": np.array(0.0, np.float32),
        "band_fill": np.array(b.band_fill, np.float32),
        "pad_fill": np.array(b.pad_fill, np.float32),
        "scale": np.array(SIZE**-0.5, np.float32),
    }
    total = "total" if b.cache else "seq"
    inputs = [f"float[batch, seq, {HIDDEN}] x", f"int64[batch, {total}] attention_mask"]
    outputs = [f"float[batch, seq, {HIDDEN}] y"]
    body = [
        line
        for p, split in (("q", "q_split"), ("k", "kv_split"), ("v", "kv_split"))
        for line in (
            f"{p}m = MatMul (x, w{p})",
            f"{p}r = Reshape ({p}m, {split})",
            f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
        )
    ]
    cached = kv_cache(b.cache, b.kv_heads, SIZE, "total", new=("kt", "vt"))
    inputs, outputs, body = inputs + cached.inputs, outputs + cached.outputs, body + cached.body
    heads = {"k": cached.key, "v": cached.value}
    if b.kv_heads != HEADS:  # repeat_kv
        for p, source in (("k", cached.key), ("v", cached.value)):
            body += [
                f"{p}_u = Unsqueeze ({source}, axis_2)",
                f"{p}_e = Expand ({p}_u, repeat)",
                f"{p}_rep = Reshape ({p}_e, kv_merge)",
            ]
            heads[p] = f"{p}_rep"
    body += [*_mask_lines(b), *_scores_lines(b, heads)]
    model = graph_model(inputs, outputs, body, inits)
    # the key length named as optimum names it, which the ONNX text format cannot write
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "total":
                dim.dim_param = "past + seq"
    return model


def _mask_lines(b: Block) -> list[str]:
    """``band`` (the causal term, and the window ``key > query - W``) and ``padded``
    (transformers' 4-D mask: the causal term and the padding)."""
    lines = [*positions(), CAUSAL, *PADDING]
    if b.window is None:
        lines.append("band = Identity (causal)")
    else:
        lines += [
            "q_start = Sub (q_u, w)",
            "in_window = Greater (kv_u, q_start)",
            "band = And (causal, in_window)",
        ]
    if not b.causal_padding:
        return [*lines, "padded = Identity (padding)"]
    both = "padding, causal" if b.padding_first else "causal, padding"
    return [*lines, f"padded = And ({both})"]


def _scores_lines(b: Block, heads: dict[str, str]) -> list[str]:
    """The scores, the band applied (a fill or an added mask), the padding mask added,
    the softmax and the heads merged."""
    lines = [
        f"kT = Transpose <perm = [0, 1, 3, 2]> ({heads['k']})",
        "qk = MatMul (qt, kT)",
        "scores = Mul (qk, scale)",
    ]
    if b.fill:
        lines.append("banded = Where (band, scores, band_fill)")
    else:
        lines += ["band_bias = Where (band, zero_f, band_fill)", "banded = Add (scores, band_bias)"]
    return lines + [
        "pad_bias = Where (padded, zero_f, pad_fill)",
        "biased = Add (banded, pad_bias)",
        "probs = Softmax <axis = -1> (biased)",
        f"context = MatMul (probs, {heads['v']})",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge)",
    ]


def feeds(b: Block, shape: tuple[int, int, int], padding: str, seed: int = 0) -> dict:
    """Inputs for ``batch, seq, past`` (``padded_feeds``: left padding or holes)."""
    cache = (b.kv_heads, SIZE) if b.cache else None
    return padded_feeds(shape, padding, hidden=HIDDEN, cache=cache, seed=seed)


def fused_block(b: Block) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str], dict | None]:
    """The original block, the fused one, the near misses about the attention and the
    GroupQueryAttention's attributes (None without one); exactly one fusion."""
    model = attention_block(b)
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"attention": 1}, (b, result.counts)
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    found = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(found) <= 1, b
    attrs = (
        {a.name: onnx.helper.get_attribute_value(a) for a in found[0].attribute} if found else None
    )
    misses = [m.reason for m in result.near_misses if m.pattern == "attention"]
    return model, fused, misses, attrs


def _some_shapes(b: Block, data) -> list[tuple[tuple[int, int, int], str]]:
    """A prefill and a step with a past (with a cache), each with a drawn batch,
    sequence and padding."""
    pasts = [0, data.draw(st.integers(1, 10), label="past")] if b.cache else [0]
    return [
        (
            (
                data.draw(st.integers(1, 3), label="batch"),
                data.draw(st.integers(1, 6), label="seq"),
                past,
            ),
            data.draw(st.sampled_from(["left", "holes"]), label="padding"),
        )
        for past in pasts
    ]


@SPELLINGS
@given(b=blocks(), data=st.data())
def test_a_causal_mask_summed_with_a_causal_padding_mask_becomes_gqa_exactly(b, data) -> None:
    model, fused, misses, attrs = fused_block(b)
    assert attrs is not None, (b, misses)
    assert attrs["causal"] == 1 and attrs["kv_num_heads"] == b.kv_heads, attrs
    # the keys before the window far below a query's own padded key: -inf, or lowest
    # beside -1e30 (both lowest: a row of padding spreads over them too, so not)
    below = np.isneginf(b.band_fill) or b.band_fill - b.pad_fill <= -1e30
    kernel_window = b.window is not None and below
    assert attrs.get("local_window_size") == (b.window if kernel_window else None), (b, attrs)
    if b.window is not None and not kernel_window:
        assert any("stays in the attention bias" in m for m in misses), misses
    else:
        assert not misses, misses
    for shape, padding in _some_shapes(b, data):
        inputs = feeds(b, shape, padding, seed=sum(shape))
        run_both(model, fused, feeds=inputs, **TOL)


def test_every_row_of_a_fully_padded_batch_matches() -> None:
    """Rows with no key at all (a batch entry entirely padding, and the first queries of
    a left-padded one) take the average of the keys the causal term allows, in both."""
    b = Block(2, LOWEST, LOWEST, None, fill=True, padding_first=False, cache=True)
    model, fused, _, attrs = fused_block(b)
    assert attrs is not None
    inputs = feeds(b, (2, 4, 3), "left")
    inputs["attention_mask"][0] = 0
    inputs["attention_mask"][1] = [0, 0, 0, 0, 0, 1, 1]
    run_both(model, fused, feeds=inputs, **TOL)


UNPROVEN = {
    # the keys after a query get fl(-1e30 + lowest) = lowest, as high as its padded own key
    "not-swamped": (
        Block(2, -1e30, LOWEST, None, fill=False, padding_first=False, cache=True),
        "not far enough below",
    ),
    # -inf beside a padded own key: a row of padding alone is -inf everywhere, NaN
    "padding-minus-inf": (
        Block(2, LOWEST, -np.inf, None, fill=False, padding_first=False, cache=True),
        "NaN in the graph",
    ),
    # the padding alone: the keys after a query get -1e30 + 0 where they are not padding
    "padding-not-causal": (
        Block(2, -1e30, -1e30, None, fill=False, padding_first=False, cache=True,
              causal_padding=False),
        "is not proven causal",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(UNPROVEN), ids=list(UNPROVEN))
def test_an_unproven_sum_stays_multi_head_attention_and_says_why(case) -> None:
    """The block is MultiHeadAttention over the repeated heads (exact for any mask), with
    the reason beside it; and a GroupQueryAttention given the sum as its bias, causal as
    it must be with a cache, computes something else on a row of padding alone."""
    b, why = UNPROVEN[case]
    model, fused, misses, attrs = fused_block(b)
    assert attrs is None
    assert "MultiHeadAttention" in {n.op_type for n in fused.graph.node}
    assert any(why in m for m in misses), misses
    inputs = feeds(b, (2, 3, 4), "left")
    inputs["attention_mask"][0, :5] = 0  # the first two queries of entry 0: padding alone
    run_both(model, fused, feeds=inputs, **TOL)
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(["y"], inputs)[0]
    got = _hand_written_gqa(b, model, inputs)
    assert not np.allclose(got, want, **TOL), "the condition would not matter"


def _hand_written_gqa(b: Block, model: onnx.ModelProto, inputs: dict) -> np.ndarray:
    """``y`` of one GroupQueryAttention (causal, the graph's summed mask as its bias) on
    the block's own projections: what the fusion would be without the proof."""
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    x, mask = inputs["x"], inputs["attention_mask"]
    q, k, v = (x @ weights[f"w{p}"] for p in "qkv")
    batch, seq, past = x.shape[0], x.shape[1], inputs["past_key"].shape[2]
    total = past + seq
    key, query = np.arange(total)[None], np.arange(past, total)[:, None]
    causal = key <= query
    padded = causal & (mask[:, None, None, :] != 0) if b.causal_padding else mask[:, None, None]
    bias = np.where(causal, 0, np.float32(b.band_fill)) + np.where(
        padded != 0, 0, np.float32(b.pad_fill)
    )
    node = onnx.helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total", "", "", "", "bias"]
        + ["", "", "", "", "", "query_seqlens"],
        ["y", "present_key", "present_value"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=b.kv_heads,
        scale=SIZE**-0.5, causal=1,
    )  # fmt: skip
    int32 = ("seqlens_k", "total", "query_seqlens")
    names = [n for n in node.input if n]
    graph = onnx.helper.make_graph(
        [node],
        "kernel",
        [
            onnx.helper.make_tensor_value_info(
                n, onnx.TensorProto.INT32 if n in int32 else onnx.TensorProto.FLOAT, None
            )
            for n in names
        ],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in node.output],
    )
    opsets = [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("com.microsoft", 1)]
    kernel = onnx.helper.make_model(graph, opset_imports=opsets)
    feed = {
        "q": q.astype(np.float32),
        "k": k.astype(np.float32),
        "v": v.astype(np.float32),
        "past_key": inputs["past_key"],
        "past_value": inputs["past_value"],
        "seqlens_k": np.full(batch, total - 1, np.int32),
        "total": np.array(total, np.int32),
        "bias": bias.astype(np.float32),
        "query_seqlens": np.full(batch, seq, np.int32),
    }
    session = onnxruntime.InferenceSession(kernel.SerializeToString())
    return session.run(["y"], feed)[0]
