"""A sliding window in a decoder's mask becomes GroupQueryAttention's ``local_window_size``.

transformers' sliding window (Mistral, Gemma-2's local layers, Qwen2 with
``use_sliding_window``) lets the query at position ``p`` see the keys ``p - W < j <= p``
(``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``);
onnxruntime's CPU GroupQueryAttention with ``causal = 1`` and ``local_window_size = W``
lets it see the same keys (``test_the_kernel_window_is_the_last_w_keys`` measures it
against numpy). A generator (hypothesis) writes one attention block whose mask is
``causal AND window AND padding``, drawing the window size, how its comparison is
spelled (either orientation, the constant on the query or on the key, strict or not, or
the difference of the two indices), whether the mask is added to the scores or fills
them (``Where(allowed, scores, lowest)``), ``-inf`` (TorchScript's SDPA, with its NaN
guard) or float32's lowest (eager), and with or without a cache. Every block must fuse
into one GroupQueryAttention with ``causal = 1`` and ``local_window_size = W``, a bias
computed from the padding alone (no Range or comparison of positions left, one row
broadcast over the queries), and compute what the original computes on batches with
left padding or random holes (rows with nothing to attend to included), with and
without a past.

Tolerance: rtol = atol = 1e-5, as in tests/fusion_core/rewriters/
test_group_query_attention.py (the kernel sums in another order; at these sizes the
outputs differ by about 1e-6). The example budget is ``AUTOFUSION_SPELLING_EXAMPLES``
(25 in ``make test``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import op_sequence, optimize_quiet, run_both
from tests.fusion_core.decoder_text import (
    CAUSAL,
    PADDING,
    TEXT_CONSTANTS,
    graph_model,
    kv_cache,
    padded_feeds,
    positions,
)

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, HEADS, KV_HEADS, SIZE = 32, 4, 2, 8
EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "25"))
ORT = dict(target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
LOWEST = float(np.finfo(np.float32).min)
# ``in_window`` (key > query - W) as exporters and people write it; ``w`` is W, ``w1`` W - 1
SPELLINGS = {
    "key_greater": ["q_start = Sub (q_u, w)", "in_window = Greater (kv_u, q_start)"],
    "query_less": ["q_start = Sub (q_u, w)", "in_window = Less (q_start, kv_u)"],
    "key_plus_greater_equal": [
        "kv_end = Add (kv_u, w1)",
        "in_window = GreaterOrEqual (kv_end, q_u)",
    ],
    "query_less_equal": ["kv_end = Add (w1, kv_u)", "in_window = LessOrEqual (q_u, kv_end)"],
    "difference": ["distance = Sub (q_u, kv_u)", "in_window = Less (distance, w)"],
    # not provable: W is read from a graph input
    "from_input": ["q_start = Sub (q_u, window)", "in_window = Greater (kv_u, q_start)"],
    # not a window: key < query - W keeps the keys far from the query
    "far_keys": ["q_start = Sub (q_u, w)", "in_window = Less (kv_u, q_start)"],
    "none": [],
}


@dataclass(frozen=True)
class Block:
    window: int  # W
    spelling: str  # a key of SPELLINGS
    fill: bool  # Where(allowed, scores, masked), not scores + Where(allowed, 0, masked)
    infinite: bool  # -inf with SDPA's NaN guard, else float32's lowest (eager)
    cache: bool


@st.composite
def blocks(draw) -> Block:
    infinite = draw(st.booleans())
    provable = ["key_greater", "query_less", "key_plus_greater_equal", "query_less_equal"]
    return Block(
        window=draw(st.integers(1, 12)),
        spelling=draw(st.sampled_from([*provable, "difference"])),
        fill=draw(st.booleans()),
        infinite=infinite,
        # a finite mask without a cache keeps the whole mask (causal = 0): by design
        cache=draw(st.booleans()) if infinite else True,
    )


def attention_block(b: Block, *, opset: int = 18) -> onnx.ModelProto:
    """One causal attention block, 4 query heads sharing 2 KV heads of size 8, whose
    mask is ``causal AND window AND padding``, spelled as ``b`` says."""
    rng = np.random.default_rng(b.window)
    inits = {
        "wq": rng.standard_normal((HIDDEN, HEADS * SIZE)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, KV_HEADS * SIZE)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, KV_HEADS * SIZE)) * 0.3,
        "q_split": np.array([0, 0, HEADS, SIZE], np.int64),
        "kv_split": np.array([0, 0, KV_HEADS, SIZE], np.int64),
        "repeat": np.array([1, 1, HEADS // KV_HEADS, 1, 1], np.int64),
        "kv_merge": np.array([0, HEADS, -1, SIZE], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "axis_2": np.array([2], np.int64),
        **TEXT_CONSTANTS,
        "w": np.array(b.window, np.int64),
        "w1": np.array(b.window - 1, np.int64),
        "zero_f": np.array(0.0, np.float32),
        "masked": np.array(-np.inf if b.infinite else LOWEST, np.float32),
        "root_scale": np.array(SIZE**-0.25, np.float32),
        "scale": np.array(SIZE**-0.5, np.float32),
    }
    total = "total" if b.cache else "seq"
    inputs = ["float[batch, seq, 32] x", f"int64[batch, {total}] attention_mask"]
    outputs = ["float[batch, seq, 32] y"]
    if b.spelling == "from_input":
        inputs.append("int64 window")
    body = [
        line
        for p, split in (("q", "q_split"), ("k", "kv_split"), ("v", "kv_split"))
        for line in (
            f"{p}m = MatMul (x, w{p})",
            f"{p}r = Reshape ({p}m, {split})",
            f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
        )
    ]
    cached = kv_cache(b.cache, 2, 8, "total", new=("kt", "vt"))
    inputs, outputs, body = inputs + cached.inputs, outputs + cached.outputs, body + cached.body
    for p, source in (("k", cached.key), ("v", cached.value)):
        body += [
            f"{p}_u = Unsqueeze ({source}, axis_2)",
            f"{p}_e = Expand ({p}_u, repeat)",
            f"{p}_rep = Reshape ({p}_e, kv_merge)",
        ]
    body += [*_mask_lines(b), *_scores_lines(b)]
    model = graph_model(inputs, outputs, body, inits, opset)
    # the key length named as optimum names it, which the ONNX text format cannot write
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "total":
                dim.dim_param = "past + seq"
    return model


def _mask_lines(b: Block) -> list[str]:
    """``allowed``: the causal term, the window (as ``b.spelling``) and the padding."""
    window = SPELLINGS[b.spelling]
    return [
        *positions(),
        CAUSAL,
        *window,
        "ordered = And (causal, in_window)" if window else "ordered = Identity (causal)",
        *PADDING,
        "allowed = And (ordered, padding)",
    ]


def _scores_lines(b: Block) -> list[str]:
    """The scores (SDPA's split scale with -inf, eager's scale on the scores with the
    lowest float), the mask applied, the softmax and the merge of the heads."""
    if b.infinite:
        lines = [
            "qs = Mul (qt, root_scale)",
            "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
            "ks = Mul (kT, root_scale)",
            "scores = MatMul (qs, ks)",
        ]
    else:
        lines = [
            "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
            "qk = MatMul (qt, kT)",
            "scores = Mul (qk, scale)",
        ]
    if b.fill:
        lines.append("biased = Where (allowed, scores, masked)")
    else:
        lines += ["bias = Where (allowed, zero_f, masked)", "biased = Add (scores, bias)"]
    probs = "p" if b.infinite else "probs"
    lines.append(f"{probs} = Softmax <axis = -1> (biased)")
    if b.infinite:
        lines += ["nan = IsNaN (p)", "probs = Where (nan, zero_f, p)"]
    return lines + [
        "context = MatMul (probs, v_rep)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge)",
    ]


def feeds(b: Block, shape: tuple[int, int, int], padding: str, seed: int = 0) -> dict:
    """Inputs for ``batch, seq, past`` (``padded_feeds``: left padding or holes), and
    the window where the block reads it from an input."""
    cache = (KV_HEADS, SIZE) if b.cache else None
    found = padded_feeds(shape, padding, hidden=HIDDEN, cache=cache, seed=seed)
    if b.spelling == "from_input":
        found["window"] = np.array(b.window, np.int64)
    return found


def fused_attention(b: Block, **kwargs) -> tuple[onnx.ModelProto, onnx.ModelProto, list, dict]:
    """The original block, the fused one, its near misses and the GroupQueryAttention's
    attributes; exactly one fusion, the attention."""
    model = attention_block(b, **kwargs)
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"attention": 1}, (b, result.counts)
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    return model, fused, result.near_misses, attrs


def bias_rows(fused: onnx.ModelProto) -> list:
    """The dimensions of what GroupQueryAttention's bias broadcasts over the queries:
    ``Expand(Where(t, 0, lowest), [1, 1, S, 1])``, the shape of the Where."""
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    producers = {o: n for n in fused.graph.node for o in n.output}
    expand = producers[gqa.input[10]]
    assert expand.op_type == "Expand", expand.op_type
    inferred = onnx.shape_inference.infer_shapes(fused)
    shapes = {v.name: v.type.tensor_type.shape for v in inferred.graph.value_info}
    return [d.dim_value or d.dim_param for d in shapes[expand.input[0]].dim]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # make test draws the same examples each run
)
@given(b=blocks(), data=st.data())
def test_every_provable_window_becomes_local_window_size_exactly(b: Block, data) -> None:
    model, fused, near_misses, attrs = fused_attention(b)
    assert attrs["causal"] == 1 and attrs["local_window_size"] == b.window, (b, attrs)
    ops = op_sequence(fused)
    assert not {"Range", "LessOrEqual", "Less", "GreaterOrEqual"} & set(ops), (b, ops)
    assert bias_rows(fused)[1:3] == [1, 1], b  # the padding: no query axis
    assert not [m for m in near_misses if m.pattern == "attention"], near_misses
    pasts = [0, data.draw(st.integers(1, 10), label="past")] if b.cache else [0, 0]
    for past in pasts:
        batch = data.draw(st.integers(1, 3), label="batch")
        seq = data.draw(st.integers(1, 6), label="seq")
        padding = data.draw(st.sampled_from(["left", "holes"]), label="padding")
        inputs = feeds(b, (batch, seq, past), padding, seed=past + seq)
        run_both(model, fused, feeds=inputs, **TOL)


@pytest.mark.parametrize("window", [2, 64], ids=["shorter", "longer-than-the-sequence"])
def test_a_window_shorter_than_the_keys_changes_them_a_longer_one_does_not(window) -> None:
    """The window matters where it is shorter than the keys (the fused block still equals
    the original, and differs from the block without the window) and changes nothing
    where it is longer (both equal the block without it)."""
    b = Block(window, "key_greater", fill=False, infinite=True, cache=True)
    model, fused, _, attrs = fused_attention(b)
    assert attrs["local_window_size"] == window
    without = attention_block(Block(window, "none", fill=False, infinite=True, cache=True))
    inputs = feeds(b, (2, 3, 6), "left", seed=3)
    run_both(model, fused, feeds=inputs, **TOL)
    sessions = [_session(m) for m in (fused, without)]
    got, unwindowed = (s.run(["y"], inputs)[0] for s in sessions)
    if window < 6 + 3:
        assert np.abs(got - unwindowed).max() > 1e-2  # the window drops some keys
    else:
        np.testing.assert_allclose(got, unwindowed, **TOL)


@pytest.mark.parametrize("opset", [18, 17], ids=["opset18", "opset17-reduce-axes-attribute"])
@pytest.mark.parametrize("spelling", ["from_input", "far_keys"])
def test_an_unproven_window_keeps_the_whole_mask_and_says_why(spelling, opset) -> None:
    """A window read from an input, or a term that keeps the keys far from the query
    (key < query - W), is not a window the kernel applies: the graph's own [B, 1, S, L]
    mask is the bias (its rows to keep a ReduceMax over it), no local_window_size, and a
    near miss at the fused block says the window stays in the bias and why."""
    b = Block(3, spelling, fill=False, infinite=True, cache=True)
    model, fused, near_misses, attrs = fused_attention(b, opset=opset)
    assert "local_window_size" not in attrs and attrs["causal"] == 1, attrs
    ops = op_sequence(fused)
    assert "Range" in ops and "LessOrEqual" in ops and "ReduceMax" in ops, ops
    (reduce,) = [n for n in fused.graph.node if n.op_type == "ReduceMax"]
    assert len(reduce.input) == (2 if opset >= 18 else 1)
    notes = [m for m in near_misses if m.pattern == "attention"]
    assert [m.kind for m in notes] == ["rewriter"], near_misses
    assert "the sliding window" in notes[0].reason and "stays in the attention bias" in (
        notes[0].reason
    ), notes[0].reason
    why = "neither a key or query index" if spelling == "from_input" else "not key > query - W"
    assert why in notes[0].reason, notes[0].reason
    for shape, padding in (((2, 3, 6), "left"), ((3, 1, 9), "holes"), ((1, 5, 0), "left")):
        run_both(model, fused, feeds=feeds(b, shape, padding, seed=shape[2]), **TOL)


def test_greedy_steps_past_the_window_match() -> None:
    """A left-padded prefill of 5 tokens, then decode steps that feed the presents back
    until the keys are twice the window: every step's output and cache match."""
    b = Block(4, "key_greater", fill=False, infinite=True, cache=True)
    model, fused, _, _ = fused_attention(b)
    sessions = [_session(m) for m in (model, fused)]
    step = feeds(b, (2, 5, 0), "left", seed=1)
    step["attention_mask"][0] = 1
    step["attention_mask"][1, :2] = 0
    states = [dict(step), dict(step)]
    rng = np.random.default_rng(1)
    for _ in range(4):
        outs = [s.run(None, f) for s, f in zip(sessions, states, strict=True)]
        for want, got in zip(*outs, strict=True):
            np.testing.assert_allclose(got, want, **TOL)
        x = rng.standard_normal((2, 1, HIDDEN)).astype(np.float32)
        for state, (_, key, value) in zip(states, outs, strict=True):
            ones = np.ones((2, 1), np.int64)
            state.update(
                x=x,
                attention_mask=np.concatenate([state["attention_mask"], ones], 1),
                past_key=key,
                past_value=value,
            )
    assert states[0]["past_key"].shape[2] == 8  # twice the window


@pytest.mark.parametrize("past", [0, 7])
@pytest.mark.parametrize("window", [1, 2, 3, 5, 8, 20])
def test_the_kernel_window_is_the_last_w_keys(window, past) -> None:
    """onnxruntime's GroupQueryAttention with causal = 1 and local_window_size = W (and
    a random attention_bias) against numpy's softmax over the keys p - W < j <= p of the
    query at position p: what transformers' sliding window of W keeps."""
    rng = np.random.default_rng(window * 10 + past)
    batch, seq, total = 2, 4, past + 4
    q = rng.standard_normal((batch, seq, HEADS * SIZE)).astype(np.float32)
    k, v = (rng.standard_normal((batch, seq, KV_HEADS * SIZE)).astype(np.float32) for _ in "kv")
    caches = [rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32) for _ in "kv"]
    bias = rng.standard_normal((batch, 1, seq, total)).astype(np.float32)
    got = _session(_kernel_model(window)).run(
        ["y"],
        {
            "q": q,
            "k": k,
            "v": v,
            "past_key": caches[0],
            "past_value": caches[1],
            "seqlens_k": np.full(batch, total - 1, np.int32),
            "total_sequence_length": np.array(total, np.int32),
            "bias": bias,
            "query_seqlens": np.full(batch, seq, np.int32),
        },  # fmt: skip
    )[0]
    keys, values = (
        np.repeat(np.concatenate([c, _heads(n, KV_HEADS)], 2), HEADS // KV_HEADS, 1)
        for c, n in zip(caches, (k, v), strict=True)
    )
    scores = _heads(q, HEADS) @ keys.transpose(0, 1, 3, 2) * SIZE**-0.5 + bias
    position, key = np.arange(past, total)[:, None], np.arange(total)[None]
    scores = np.where((key <= position) & (key > position - window), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = probs / probs.sum(-1, keepdims=True) @ values
    want = want.transpose(0, 2, 1, 3).reshape(batch, seq, HEADS * SIZE)
    np.testing.assert_allclose(got, want, **TOL)


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    return x.reshape(x.shape[0], x.shape[1], heads, SIZE).transpose(0, 2, 1, 3)


def _kernel_model(window: int) -> onnx.ModelProto:
    """One GroupQueryAttention with a cache, a bias and ``local_window_size = window``."""
    names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    names += ["", "", "", "bias", "", "", "", "", "", "query_seqlens"]
    node = onnx.helper.make_node(
        "GroupQueryAttention", names, ["y", "present_key", "present_value"],
        domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS,
        scale=SIZE**-0.5, causal=1, local_window_size=window,
    )  # fmt: skip
    int32 = ("seqlens_k", "total_sequence_length", "query_seqlens")
    inputs = [
        onnx.helper.make_tensor_value_info(
            n, onnx.TensorProto.INT32 if n in int32 else onnx.TensorProto.FLOAT, None
        )
        for n in names
        if n
    ]
    outputs = [
        onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in node.output
    ]
    graph = onnx.helper.make_graph([node], "kernel", inputs, outputs)
    opsets = [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid("com.microsoft", 1)]
    return onnx.helper.make_model(graph, opset_imports=opsets)


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
