"""gpt-oss's attention sinks become GroupQueryAttention's ``head_sink``.

gpt-oss's eager attention (transformers' ``GptOssAttention``) appends a learned logit per
head as one more column of the masked scores, subtracts each row's max, takes the
Softmax and drops the column again before the product with V. onnxruntime's CPU
GroupQueryAttention computes the same from its input 11 ``head_sink``: one more logit
per query head in the softmax's denominator (``test_the_kernel_head_sink_is_one_more_
logit_per_head`` measures it against numpy: causal or not, with a bias, rows with no key
included). The block here is gpt-oss's layer as transformers writes it, with its rotary
embedding of two halves (two Slices as TorchScript writes ``chunk``, or one Split as
dynamo does), repeat_kv, the mask ``causal AND padding`` (and the sliding window of its
even layers, ``key > query - W``), with or without a KV cache. Each must fuse into one
GroupQueryAttention with the sinks as ``head_sink`` (and ``local_window_size = W``) and
two RotaryEmbeddings, and compute what the original computes on a padded batch of two
(``attention_mask`` with zeros, on the left and on the right, rows with nothing to attend
to included) at prefill and at decode: rtol = atol = 1e-5, as in
tests/fusion_core/rewriters/test_group_query_attention.py (the kernel sums in another
order; at these sizes the outputs differ by about 1e-6). Targets without sinks (ONNX
Attention on the generic target, MultiHeadAttention) leave a near miss that says so.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto
from onnx import helper as oh

from autofusion.fusion_core.testing import misses, optimize_quiet, run_both
from tests.fusion_core.decoder_text import (
    ANGLES,
    CAUSAL,
    MERGE,
    PADDING,
    SINK_SOFTMAX,
    TEXT_CONSTANTS,
    graph_model,
    kv_cache,
    positions,
)

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, HEADS, KV_HEADS, SIZE = 32, 4, 2, 8
LOWEST = float(np.finfo(np.float32).min)
ORT = dict(target="onnxruntime", exclude=["qkv_merge", "kv_merge"])


def _reference(q, k, v, sink, bias, causal):
    """numpy: softmax over the keys and one sink logit per head, the sink dropped."""
    batch, seq = q.shape[:2]
    heads = q.reshape(batch, seq, HEADS, SIZE).transpose(0, 2, 1, 3)
    keys, values = (
        np.repeat(t.reshape(batch, seq, KV_HEADS, SIZE).transpose(0, 2, 1, 3), 2, axis=1)
        for t in (k, v)
    )
    scores = heads @ keys.transpose(0, 1, 3, 2) / np.sqrt(SIZE) + bias
    if causal:
        scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    column = np.broadcast_to(sink.reshape(1, HEADS, 1, 1), (batch, HEADS, seq, 1))
    both = np.concatenate([scores, column], -1)
    both = np.exp(both - both.max(-1, keepdims=True))
    probs = (both / both.sum(-1, keepdims=True))[..., :-1]
    return (probs @ values).transpose(0, 2, 1, 3).reshape(batch, seq, HEADS * SIZE)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("masked", [LOWEST, -np.inf])
def test_the_kernel_head_sink_is_one_more_logit_per_head(causal, masked) -> None:
    batch, seq = 2, 5
    rng = np.random.default_rng(7)
    q = rng.standard_normal((batch, seq, HEADS * SIZE)).astype(np.float32)
    k, v = (rng.standard_normal((batch, seq, KV_HEADS * SIZE)).astype(np.float32) for _ in "kv")
    sink = (rng.standard_normal(HEADS) * 2).astype(np.float32)
    bias = np.zeros((batch, 1, seq, seq), np.float32)
    bias[1, :, :, :2] = masked  # left padding: with causal, rows 0 and 1 see no key
    bias[0, :, 3, :] = masked  # a row with nothing to attend to
    names = ["q", "k", "v", "", "", "seqlens", "total", "", "", "", "bias", "sink"]
    node = oh.make_node(
        "GroupQueryAttention", names, ["y", "pk", "pv"], domain="com.microsoft",
        num_heads=HEADS, kv_num_heads=KV_HEADS, scale=SIZE**-0.5, causal=causal,
    )  # fmt: skip
    inputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "qkv"]
    inputs += [
        oh.make_tensor_value_info("seqlens", TensorProto.INT32, [batch]),
        oh.make_tensor_value_info("total", TensorProto.INT32, []),
        oh.make_tensor_value_info("bias", TensorProto.FLOAT, None),
        oh.make_tensor_value_info("sink", TensorProto.FLOAT, [HEADS]),
    ]
    outputs = [oh.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "pk", "pv")]
    model = oh.make_model(
        oh.make_graph([node], "g", inputs, outputs),
        opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid("com.microsoft", 1)],
    )
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = dict(q=q, k=k, v=v, bias=bias, sink=sink)
    feeds |= dict(seqlens=np.full(batch, seq - 1, np.int32), total=np.array(seq, np.int32))
    (got,) = session.run(["y"], feeds)
    np.testing.assert_allclose(got, _reference(q, k, v, sink, bias, causal), **TOL)
    assert not np.any(got[0, 3])  # no key: the sink takes the whole weight, the row is 0
    if causal:
        assert not np.any(got[1, :2])


def gpt_oss_block(
    *, window: int | None, split: bool, cache: bool, infinite: bool = False, scaled: bool = False
):
    """gpt-oss's attention layer, eager, as transformers 5 writes it (``scaled``: its
    value heads times a constant, as MiMo-V2-Flash's sliding layers write them)."""
    rng = np.random.default_rng(3)
    half = SIZE // 2
    inits = {
        "inv_freq": 1.0 / (150000 ** (np.arange(0, SIZE, 2) / SIZE)),
        "scaling": np.array(1.35, np.float32),
        "sinks": rng.standard_normal((1, HEADS, 1, 1)) * 2,
        "scale": np.array(SIZE**-0.5, np.float32),
        "masked": np.array(-np.inf if infinite else LOWEST, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "w": np.array(window or 0, np.int64),
        "wo": rng.standard_normal((HEADS * SIZE, HIDDEN)) * 0.3,
        "merge": np.array([0, 0, HEADS * SIZE], np.int64),
        "kv_merge": np.array([0, HEADS, -1, SIZE], np.int64),
        "repeat": np.array([1, 1, HEADS // KV_HEADS, 1, 1], np.int64),
        "sink_heads": np.array([HEADS], np.int64),
        **{
            name: np.array(value, np.int64)
            for name, value in {
                "zero": [0], "one": [1], "axis_1": [1], "axis_2": [2], "axis_last": [-1],
                "half": [half], "end": [SIZE], "minus_one": [-1],
            }.items()
        },
        **TEXT_CONSTANTS,
    }  # fmt: skip
    body = [
        *ANGLES,
        "cos_f = Cos (freqs)",
        "sin_f = Sin (freqs)",
        "cos = Mul (cos_f, scaling)",
        "sin = Mul (sin_f, scaling)",
        "cos_u = Unsqueeze (cos, axis_1)",
        "sin_u = Unsqueeze (sin, axis_1)",
    ]
    for p, count in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
        inits[f"w{p}"] = rng.standard_normal((HIDDEN, count * SIZE)) * 0.3
        inits[f"b{p}"] = rng.standard_normal(count * SIZE) * 0.1
        inits[f"{p}_split"] = np.array([0, 0, count, SIZE], np.int64)
        body += [
            f"{p}m = MatMul (x, w{p})",
            f"{p}b = Add ({p}m, b{p})",
            f"{p}r = Reshape ({p}b, {p}_split)",
            f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
        ]
    for p in "qk":  # _apply_rotary_emb: chunk, then each half rotated by one angle per pair
        if split:
            body.append(f"{p}1, {p}2 = Split <axis = -1, num_outputs = 2> ({p}t)")
        else:
            body += [
                f"{p}1 = Slice ({p}t, zero, half, axis_last)",
                f"{p}2 = Slice ({p}t, half, end, axis_last)",
            ]
        body += [
            f"{p}1c = Mul ({p}1, cos_u)",
            f"{p}2s = Mul ({p}2, sin_u)",
            f"{p}a = Sub ({p}1c, {p}2s)",
            f"{p}2c = Mul ({p}2, cos_u)",
            f"{p}1s = Mul ({p}1, sin_u)",
            f"{p}b2 = Add ({p}2c, {p}1s)",
            f"{p}_emb = Concat <axis = -1> ({p}a, {p}b2)",
        ]
    inputs = ["float[batch, seq, 32] x", "int64[batch, seq] position_ids"]
    total = '"past + seq"' if cache else "seq"
    inputs.append(f"int64[batch, {total}] attention_mask")
    outputs = ["float[batch, seq, 32] y"]
    cached = kv_cache(cache, KV_HEADS, SIZE, total)
    inputs, outputs, body = inputs + cached.inputs, outputs + cached.outputs, body + cached.body
    key, value = cached.key, cached.value
    if scaled:
        inits["value_scale"] = np.array(0.707, np.float32)
        body.append(f"v_scaled = Mul ({value}, value_scale)")
        value = "v_scaled"
    for p, source in (("k", key), ("v", value)):  # repeat_kv
        body += [
            f"{p}_u = Unsqueeze ({source}, axis_2)",
            f"{p}_e = Expand ({p}_u, repeat)",
            f"{p}_rep = Reshape ({p}_e, kv_merge)",
        ]
    body += [
        *positions(),
        CAUSAL,
        *PADDING,
        "causal_padding = And (causal, padding)",
    ]
    if window:  # sliding_window_overlay: kv_idx > q_idx - W
        body += [
            "q_start = Sub (q_u, w)",
            "in_window = Greater (kv_u, q_start)",
            "allowed = And (causal_padding, in_window)",
        ]
    else:
        body.append("allowed = Identity (causal_padding)")
    body += [
        "bias = Where (allowed, zero_f, masked)",
        "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
        "qk = MatMul (q_emb, kT)",
        "scaled = Mul (qk, scale)",
        "biased = Add (scaled, bias)",
        *SINK_SOFTMAX,
        *MERGE,
    ]
    return graph_model(inputs, outputs, body, inits)


def _feeds(batch: int, seq: int, past: int, cache: bool) -> dict:
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    total = past + seq if cache else seq
    mask = np.ones((batch, total), np.int64)
    mask[-1, : min(2, total - 1)] = 0  # the last batch padded on the left
    if batch > 1 and total > 2:
        mask[0, -1] = 0  # and the first on the right
    feeds = {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": np.tile(np.arange(past, past + seq), (batch, 1)).astype(np.int64),
        "attention_mask": mask,
    }
    if cache:
        for name in ("past_key", "past_value"):
            feeds[name] = rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32)
    return feeds


CASES = [  # (window, split, cache, infinite): gpt-oss's two kinds of layer, both exports
    (None, False, False, False),
    (3, True, False, False),
    (None, True, True, False),
    (3, False, True, False),
    (4, True, False, True),
]


@pytest.mark.parametrize(("window", "split", "cache", "infinite"), CASES)
def test_the_sinks_become_the_head_sink_exactly(window, split, cache, infinite) -> None:
    model = gpt_oss_block(window=window, split=split, cache=cache, infinite=infinite)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert ops.count("RotaryEmbedding") == 2 and "Softmax" not in ops, ops
    attrs = {a.name: oh.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["causal"] == 1 and attrs.get("local_window_size") == window, attrs
    (sink,) = [t for t in fused.graph.initializer if t.name == gqa.input[11]]
    sinks = [t for t in model.graph.initializer if t.name == "sinks"][0]
    np.testing.assert_array_equal(
        onnx.numpy_helper.to_array(sink), onnx.numpy_helper.to_array(sinks).reshape(-1)
    )
    shapes = [(2, 1, 5), (1, 3, 2)] if cache else [(2, 6, 0), (1, 4, 0)]
    for batch, seq, past in shapes:
        run_both(model, fused, feeds=_feeds(batch, seq, past, cache), **TOL)


def test_onnx_attention_and_multi_head_attention_say_they_have_no_sinks() -> None:
    model = gpt_oss_block(window=None, split=False, cache=False)
    result = optimize_quiet(model, target="generic", upgrade_opset=23)
    ops = [n.op_type for n in result.to_proto().graph.node]
    assert "Softmax" in ops and "Attention" not in ops
    reasons = misses(result, "attention")
    assert any("ONNX Attention has no input for attention sinks" in r for r in reasons), reasons
    assert any("not MultiHeadAttention: it has no input for attention sinks" in r for r in reasons)


def test_a_sink_block_the_recognizer_cannot_read_gets_a_near_miss() -> None:
    """Without the rotary fusion the query is no head split: the attention says where."""
    model = gpt_oss_block(window=None, split=True, cache=False)
    result = optimize_quiet(model, target="onnxruntime", exclude=["rotary_embedding"])
    reasons = misses(result, "attention")
    assert any("expected Transpose 'q_t'" in r for r in reasons), reasons


def test_sinks_over_values_scaled_after_the_head_split_fuse() -> None:
    """Issue 24 (MiMo-V2-Flash): ``value_scale`` moves the constant onto the value
    projection, exactly, and GroupQueryAttention takes the sinks over it (with a KV cache
    too: tests/fusion_core/canonical/test_value_scale.py)."""
    model = gpt_oss_block(window=3, split=False, cache=False, scaled=True)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("GroupQueryAttention") == 1 and "Softmax" not in ops, ops
    for batch, seq in ((2, 6), (1, 4)):
        run_both(model, fused, feeds=_feeds(batch, seq, 0, False), **TOL)


def test_sinks_over_a_scale_of_the_whole_cache_get_a_near_miss() -> None:
    """Here the scale is applied after the cache's Concat, to the past values too (MiMo
    scales the new values before ``cache.update`` stores them, which fuses, above):
    moving it onto the projection would leave the past unscaled, so ``value_scale`` does
    not, and the near miss names the value GroupQueryAttention cannot read."""
    model = gpt_oss_block(window=None, split=False, cache=True, scaled=True)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    assert "Softmax" in [n.op_type for n in fused.graph.node]
    reasons = misses(result, "attention")
    assert any("the value 'v_scaled' is not a head split" in r for r in reasons), reasons
    run_both(model, fused, feeds=_feeds(2, 1, 5, True), **TOL)
