"""``rotary`` and ``group_query_attention`` on a decoder's attention block, written as
the TorchScript exporter writes a Hugging Face Llama (optimum's decoder export): hidden
32, 4 query heads sharing 2 KV heads of size 8, rotary angles from ``position_ids``,
``repeat_kv``, the mask built from ``attention_mask`` and two Ranges, and (with a
cache) ``present = Concat(past, new)``. Dimensions are symbolic (``batch``, ``seq``,
``past``), so the same model runs a prefill and decode steps.

Tolerance: rtol = atol = 1e-5. GroupQueryAttention and RotaryEmbedding sum and round in
another order than the ops they replace; at these sizes outputs differed by about 1e-6.
Every numerical case runs several shapes (a batch of two, several new tokens with a
cache, an empty cache) and several masks: none padded, left-padded (Hugging Face's
batched generation), right-padded, and random holes (what autofusion's check feeds),
which also leave rows with nothing to attend to.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)
from tests.fusion_core.decoder_text import (
    ANGLES,
    CAUSAL,
    PADDING,
    TEXT_CONSTANTS,
    graph_model,
    kv_cache,
    positions,
)

TOL = dict(rtol=1e-5, atol=1e-5)
# torch.export indexes the padding mask by the key positions (its length is the mask's own
# symbol, so only this index ties the padding term to the keys)
DYNAMO_PADDING = [
    "mask_b = Cast <to = 9> (attention_mask)",
    "mask_kv = Gather <axis = 1> (mask_b, kv_pos)",
    "padding = Unsqueeze (mask_kv, axes_pad)",
]
HIDDEN, HEADS, KV_HEADS, SIZE = 32, 4, 2, 8
GQA = "com.microsoft::GroupQueryAttention"
MHA = "com.microsoft::MultiHeadAttention"
ROTARY = "com.microsoft::RotaryEmbedding"
TOTAL = "past + seq"  # the key length, named as optimum names it
# The Q/K/V merge is left out: it would split the projections of every case differently.
ORT = dict(target="onnxruntime", exclude=["qkv_merge", "kv_merge"])


def decoder_attention(
    *,
    cache: bool = True,
    eager: bool = False,
    causal: bool = True,
    lowest: float = -np.inf,
    kv_heads: int = KV_HEADS,
    halves_equal: bool = True,
    opset: int = 18,
    dynamo: bool = False,
    window: int | None = None,
    gathered_padding: bool = False,
) -> onnx.ModelProto:
    """One attention block of a decoder. ``eager``: the scale on the scores and no NaN
    guard (the eager attention of both exporters) instead of TorchScript's SDPA;
    ``causal=False`` makes the mask's order term anti-causal (a query sees the keys at
    and after its position), not causal; ``lowest``
    is the masked value (-inf: TorchScript; float32's lowest: dynamo and eager);
    ``halves_equal=False`` builds the angles from ``Concat(f, 2 f)``, not a rotation;
    ``dynamo``: the dynamo exporter's spellings, the query positions as
    ``Range(0, S) + P`` and K^T as a 3-D Reshape, Transpose and Reshape whose shapes are
    sliced from a ``Shape`` of the repeated key (outside the match, feeding only it);
    ``window``: Mistral's sliding window, a term of the mask that varies with the query
    (a query sees the last ``window`` keys); ``gathered_padding``: the padding term as
    transformers' ``sdpa_mask`` exports through TorchScript, ``attention_mask[b, j]``
    gathered from the flattened mask at ``j + b * L``."""
    rng = np.random.default_rng(0)
    groups = HEADS // kv_heads
    inits = {
        "wq": rng.standard_normal((HIDDEN, HEADS * SIZE)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, kv_heads * SIZE)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, kv_heads * SIZE)) * 0.3,
        "inv_freq": 1.0 / (10000 ** (np.arange(0, SIZE, 2) / SIZE)),
        "twice": np.array(2.0, np.float32),
        "q_split": np.array([0, 0, HEADS, SIZE], np.int64),
        "kv_split": np.array([0, 0, kv_heads, SIZE], np.int64),
        "repeat": np.array([1, 1, groups, 1, 1], np.int64),
        "kv_merge": np.array([0, HEADS, -1, SIZE], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "zero": np.array([0], np.int64),
        "half": np.array([SIZE // 2], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "last": np.array([-1], np.int64),
        "axis_1": np.array([1], np.int64),
        "axis_2": np.array([2], np.int64),
        "axis_last": np.array([-1], np.int64),
        "three": np.array([3], np.int64),
        "four": np.array([4], np.int64),
        "minus_one": np.array([-1], np.int64),
        "window": np.array(window or 0, np.int64),
        "axes_batch": np.array([1, 2, 3], np.int64),
        "ones_2": np.array([1, 1], np.int64),
        **TEXT_CONSTANTS,
        "zero_f": np.array(0.0, np.float32),
        "masked": np.array(lowest, np.float32),
        "root_scale": np.array(SIZE**-0.25, np.float32),
        "scale": np.array(SIZE**-0.5, np.float32),
    }
    inputs = ["float[batch, seq, 32] x", "int64[batch, seq] position_ids"]
    # dynamo names the mask's length on its own, so no shape read can trade it for K's
    inputs.append(f"int64[batch, {'total_sequence_length' if dynamo else 'total'}] attention_mask")
    outputs = ["float[batch, seq, 32] y"]
    body = [
        *ANGLES,
        "other = Mul (freqs, twice)" if not halves_equal else "other = Identity (freqs)",
        "emb = Concat <axis = -1> (freqs, other)"
        if not halves_equal
        else "emb = Concat <axis = -1> (freqs, freqs)",
        "cos = Cos (emb)",
        "sin = Sin (emb)",
        "cos_u = Unsqueeze (cos, axis_1)",
        "sin_u = Unsqueeze (sin, axis_1)",
    ]
    for p, split in (("q", "q_split"), ("k", "kv_split"), ("v", "kv_split")):
        body += [
            f"{p}m = MatMul (x, w{p})",
            f"{p}r = Reshape ({p}m, {split})",
            f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
        ]
    for p in "qk":
        body += [
            f"{p}_lo = Slice ({p}t, zero, half, last)",
            f"{p}_hi = Slice ({p}t, half, end, last)",
            f"{p}_neg = Neg ({p}_hi)",
            f"{p}_rot = Concat <axis = -1> ({p}_neg, {p}_lo)",
            f"{p}_c = Mul ({p}t, cos_u)",
            f"{p}_s = Mul ({p}_rot, sin_u)",
            f"{p}_emb = Add ({p}_c, {p}_s)",
        ]
    cached = kv_cache(cache, kv_heads, 8, "total")
    inputs, outputs, body = inputs + cached.inputs, outputs + cached.outputs, body + cached.body
    key, value = cached.key, cached.value
    for p, source in (("k", key), ("v", value)):
        if groups == 1:
            body.append(f"{p}_rep = Identity ({source})")
            continue
        body += [
            f"{p}_u = Unsqueeze ({source}, axis_2)",
            f"{p}_e = Expand ({p}_u, repeat)",
            f"{p}_rep = Reshape ({p}_e, kv_merge)",
        ]
    body += [
        *(
            positions(("q_count = Range (start, seq_len, step)", "q_pos = Add (q_count, past_len)"))
            if dynamo
            else positions()
        ),
        CAUSAL if causal else "causal = LessOrEqual (q_u, kv_u)",
        *(
            [
                "q_start = Sub (q_u, window)",
                "in_window = Greater (kv_u, q_start)",
                "ordered = And (causal, in_window)",
            ]
            if window
            else ["ordered = Identity (causal)"]
        ),
        *(
            [  # transformers' sdpa_mask through TorchScript: m[b, j] gathered per (b, j)
                "mask_b = Cast <to = 9> (attention_mask)",
                "flat = Flatten <axis = 2> (mask_b)",
                "mask_shape = Shape (attention_mask)",
                "batch_n = Gather <axis = 0> (mask_shape, start)",
                "width = Gather <axis = 0> (mask_shape, index_1)",
                "b_pos = Range (start, batch_n, step)",
                "b_u = Unsqueeze (b_pos, axes_batch)",
                "row_start = Mul (b_u, width)",
                "flat_index = Add (kv_u, row_start)",
                "gathered = Gather <axis = 0> (flat, flat_index)",
                "batch_1 = Unsqueeze (batch_n, zero)",
                "width_1 = Unsqueeze (width, zero)",
                "padding_shape = Concat <axis = 0> (batch_1, ones_2, width_1)",
                "padding = Reshape (gathered, padding_shape)",
            ]
            if gathered_padding
            else DYNAMO_PADDING
            if dynamo
            else PADDING
        ),
        "allowed = And (ordered, padding)",
        "bias = Where (allowed, zero_f, masked)",
    ]
    if dynamo:
        body += [
            "k_shape = Shape (k_rep)",
            "k_lead = Slice (k_shape, zero, axis_2)",
            "k_len = Slice (k_shape, axis_2, three)",
            "k_dim = Slice (k_shape, three, four)",
            "k_flat_shape = Concat <axis = 0> (minus_one, k_len, k_dim)",
            "k_flat = Reshape (k_rep, k_flat_shape)",
            "k_swap = Transpose <perm = [0, 2, 1]> (k_flat)",
            "k_unflat_shape = Concat <axis = 0> (k_lead, k_dim, k_len)",
            "kT = Reshape (k_swap, k_unflat_shape)",
        ]
    else:
        body.append("kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)")
    if eager:
        body += [
            "qk = MatMul (q_emb, kT)",
            "scores = Mul (qk, scale)",
            "biased = Add (scores, bias)",
            "probs = Softmax <axis = -1> (biased)",
        ]
    else:
        body += [
            "qs = Mul (q_emb, root_scale)",
            "ks = Mul (kT, root_scale)",
            "scores = MatMul (qs, ks)",
            "biased = Add (scores, bias)",
            "p = Softmax <axis = -1> (biased)",
            "nan = IsNaN (p)",
            "probs = Where (nan, zero_f, p)",
        ]
    body += [
        "context = MatMul (probs, v_rep)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge)",
    ]
    model = graph_model(inputs, outputs, body, inits, opset)
    if dynamo:  # its exporter writes every value's shape, the repeated heads' too
        shapes = {
            "k_rep": ["batch", HEADS, TOTAL, SIZE],
            "v_rep": ["batch", HEADS, TOTAL, SIZE],
            "k_flat": [f"{HEADS}*batch", TOTAL, SIZE],
            "kT": ["batch", HEADS, SIZE, TOTAL],
            "allowed": ["batch", 1, "seq", TOTAL],
            "padding": ["batch", 1, 1, TOTAL],
            "bias": ["batch", 1, "seq", TOTAL],
        }
        for name, shape in shapes.items():
            boolean = name in ("allowed", "padding")
            dtype = onnx.TensorProto.BOOL if boolean else onnx.TensorProto.FLOAT
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, dtype, shape))
    if gathered_padding:  # as optimum's export has them (inference leaves them unknown)
        shapes = {"gathered": ["batch", 1, 1, TOTAL, 1], "padding": ["batch", 1, 1, TOTAL]}
        for name, shape in shapes.items():
            value = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, shape)
            model.graph.value_info.append(value)
    return _rename_dim(model, "total", TOTAL if cache else "seq")


def _rename_dim(model: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    """Name the key length as the exporters do ("past + seq" with a cache, "seq"
    without), which the ONNX text format cannot write."""
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == old:
                dim.dim_param = new
    return model


def feeds(batch: int, seq: int, past: int, mask: str, *, cache: bool = True, kv: int = KV_HEADS):
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    total = past + seq if cache else seq
    attention_mask = np.ones((batch, total), np.int64)
    if mask == "left":  # the last batch padded on the left
        attention_mask[-1, : min(2, total - 1)] = 0
    elif mask == "right":
        attention_mask[-1, -1:] = 0
    elif mask == "random":  # holes anywhere, rows that attend to nothing
        attention_mask = rng.integers(0, 2, (batch, total)).astype(np.int64)
    found = {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
        "attention_mask": attention_mask,
    }
    if cache:
        for name in ("past_key", "past_value"):
            found[name] = rng.standard_normal((batch, kv, past, SIZE)).astype(np.float32)
    return found


SHAPES = [(1, 1, 5), (2, 1, 7), (2, 3, 4), (1, 4, 0), (3, 1, 1)]  # (batch, seq, past)
MASKS = ["none", "left", "right", "random"]


def decode_ops() -> list[str]:
    """The fused block with a cache: the rotary cache and positions built once, the
    graph's mask as the bias with the keep-rows factor of the NaN guard, the lengths
    GroupQueryAttention needs; no head split or repeat of Q, K or V is left."""
    rotary = ["Slice", "Reshape", "Slice", "Reshape", "Shape", "ReduceProd", "Range", "Reshape"]
    # the mask's padding term alone, broadcast over the queries (the kernel is causal)
    mask = ["Unsqueeze", "Cast", "Where", "Shape", "Concat", "Expand"]
    keep_rows = ["Cast", "CumSum", "Shape", "Slice", "Min", "Reshape"]
    lengths = [
        "Shape",
        "Shape",
        "Add",
        "Shape",
        "Sub",
        "Cast",
        "Expand",
        "Reshape",
        "Cast",
        "Cast",
        "Expand",
    ]
    return [
        "Cast", "Unsqueeze", "Mul", "Concat", "Cos", "Sin", "MatMul", "MatMul", "MatMul",
        *rotary, ROTARY, ROTARY, *mask, *keep_rows, *lengths, GQA, "Mul",
    ]  # fmt: skip


@pytest.mark.parametrize("opset", [18, 17])
def test_decode_step_with_cache_becomes_group_query_attention(opset):
    model = decoder_attention(opset=opset)
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"rotary_embedding": 2, "attention": 1}
    fused = result.to_proto()
    assert op_sequence(fused) == decode_ops()
    onnx.checker.check_model(fused, full_check=True)
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["num_heads"] == HEADS and attrs["kv_num_heads"] == KV_HEADS
    assert attrs["causal"] == 1
    assert attrs["scale"] == pytest.approx(SIZE**-0.5, rel=1e-6)
    assert list(gqa.input[3:5]) == ["past_key", "past_value"]
    assert list(gqa.output[1:]) == ["present_key", "present_value"]
    for batch, seq, past in SHAPES:
        for mask in MASKS:
            run_both(model, fused, feeds=feeds(batch, seq, past, mask), **TOL)


def fuse_exactly(model: onnx.ModelProto, pattern: str) -> tuple[onnx.ModelProto, list[str]]:
    """The block fused into two rotary embeddings and ``pattern``, valid, and equal to
    the original on every shape and mask; the fused model and its op sequence."""
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"rotary_embedding": 2, pattern: 1}
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    for batch, seq, past in SHAPES:
        for mask in MASKS:
            run_both(model, fused, feeds=feeds(batch, seq, past, mask), **TOL)
    return fused, op_sequence(fused)


def test_dynamo_spelling_with_cache_becomes_group_query_attention():
    """dynamo's K^T (a Reshape, Transpose, Reshape whose targets read a Shape of the
    repeated key) is one Transpose in the canonical form (``kt_by_reshape``), so the
    TorchScript spelling's pattern takes it; its query positions ``Range(0, S) + P``
    prove the mask causal as ``Range(P, P + S)`` does."""
    _, ops = fuse_exactly(decoder_attention(dynamo=True), "attention")
    # the rotary's two Slices and the rows' one: none of K^T's shape arithmetic is left
    assert "Softmax" not in ops and ops.count("Slice") == 3 and "Concat" in ops, ops
    # the bias's, the rows', the lengths', and the key positions' that index the padding
    assert ops.count("Shape") == 8, ops


def _one_new_token(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decode graph torch.export writes for one new token: S fixed to 1, the mask
    ``past + 1`` long, and the query positions' ``Range(0, S)`` folded to ``[0]``."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "seq":
                dim.dim_value = 1
            elif dim.dim_param == "total_sequence_length":
                dim.dim_param = "past + 1"
            elif "seq" in dim.dim_param:
                dim.dim_param = dim.dim_param.replace("seq", "1")
    index = next(i for i, n in enumerate(model.graph.node) if n.output[0] == "q_count")
    zero = onnx.numpy_helper.from_array(np.array([0], np.int64))
    model.graph.node[index].CopyFrom(onnx.helper.make_node("Constant", [], ["q_count"], value=zero))
    return model


def test_a_decode_step_exported_for_one_token_becomes_group_query_attention():
    """Its query positions ``[0] + P`` (a constant where the Range was) still prove the
    mask causal."""
    model = _one_new_token(decoder_attention(dynamo=True, lowest=float(np.finfo(np.float32).min)))
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    reasons = [m.reason for m in result.near_misses if m.pattern == "attention"]
    assert "com.microsoft::GroupQueryAttention" in op_sequence(fused), reasons
    for batch, past in ((1, 3), (2, 5)):
        for mask in ("none", "left", "right"):
            run_both(model, fused, feeds=feeds(batch, 1, past, mask), **TOL)


def test_dynamo_spelling_with_a_finite_mask_becomes_group_query_attention():
    """The dynamo exporter's mask is finite (float32's lowest): the padding term is the
    bias, and a row with nothing to attend to (left padding) gets the cache's mean
    value, as the graph's uniform softmax gives it."""
    model = decoder_attention(dynamo=True, lowest=float(np.finfo(np.float32).min))
    _, ops = fuse_exactly(model, "attention")
    # the mean is read only when some row is empty: inside the If (test_empty_rows_guarded.py)
    assert ops.count("If") == 1 and "LessOrEqual" not in ops, ops


def test_a_padding_term_gathered_per_batch_and_key_reads_the_mask_itself():
    """The TorchScript export of transformers' padding term (a gather from the
    flattened mask) is shown to be ``attention_mask[b, j]``: the bias reads the mask
    input, and none of the gather is left."""
    model = decoder_attention(gathered_padding=True)
    _, ops = fuse_exactly(model, "attention")
    assert "Flatten" not in ops and "LessOrEqual" not in ops, ops
    assert ops.count("Gather") == 0 and ops.count("Range") == 1, ops  # the rotary's


@pytest.mark.parametrize("opset", [18, 17])
def test_a_sliding_window_becomes_local_window_size(opset):
    """Mistral's window (``key > query - W``) is the kernel's ``local_window_size = W``:
    the bias is the padding term alone, and a row keeps its output where the padding
    leaves it a key inside the window (the running count less the count ``W`` keys
    earlier). A window the proof does not reach keeps the whole mask:
    tests/fusion_core/rewriters/test_group_query_attention_window.py."""
    model = decoder_attention(window=3, opset=opset)
    fused, ops = fuse_exactly(model, "attention")
    assert "LessOrEqual" not in ops and "Greater" not in ops and "ReduceMax" not in ops, ops
    assert ops.count("CumSum") == 1 and ops.count("Pad") == 1, ops
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: a.i for a in gqa.attribute if a.type == onnx.AttributeProto.INT}
    assert attrs["causal"] == 1 and attrs["local_window_size"] == 3, attrs


def test_four_greedy_steps_with_the_cache_match():
    """A prefill with an empty cache, then three decode steps that feed the presents
    back, left-padded batch: every step's output and cache match the original's."""
    model = decoder_attention()
    fused = optimize_quiet(model, **ORT).to_proto()
    import onnxruntime

    sessions = [
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for m in (model, fused)
    ]
    step = feeds(2, 5, 0, "left")
    states = [dict(step), dict(step)]
    rng = np.random.default_rng(1)
    for _ in range(4):
        outs = [s.run(None, f) for s, f in zip(sessions, states, strict=True)]
        for want, got in zip(*outs, strict=True):
            np.testing.assert_allclose(got, want, **TOL)
        x = rng.standard_normal((2, 1, HIDDEN)).astype(np.float32)
        for state, (_, key, value) in zip(states, outs, strict=True):
            total = key.shape[2] + 1
            state.update(
                x=x,
                position_ids=np.full((2, 1), total - 1, np.int64),
                attention_mask=np.concatenate(
                    [state["attention_mask"], np.ones((2, 1), np.int64)], 1
                ),
                past_key=key,
                past_value=value,
            )
            assert state["attention_mask"].shape[1] == total


def test_prefill_without_cache_finite_mask_is_not_causal():
    """Eager attention without a cache: a finite mask gives a row with nothing to attend
    to the average of every key, so GroupQueryAttention runs with causal = 0 and the
    graph's mask as its bias."""
    model = decoder_attention(cache=False, eager=True, lowest=float(np.finfo(np.float32).min))
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"rotary_embedding": 2, "attention": 1}
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert {a.name: a.i for a in gqa.attribute}["causal"] == 0
    assert list(gqa.input[3:5]) == ["", ""]  # no past
    for batch, seq in ((1, 6), (2, 4)):
        for mask in MASKS:
            run_both(model, fused, feeds=feeds(batch, seq, 0, mask, cache=False), **TOL)


def test_mask_without_causal_term_with_cache_becomes_multi_head_attention():
    """With a cache GroupQueryAttention must be causal; a mask that lets a query see
    later keys is not, so the grouped heads go to MultiHeadAttention over the repeated
    key and value heads, where the mask is the bias (exact for any mask). Why not
    GroupQueryAttention stays beside the fusion as a near miss."""
    model = decoder_attention(causal=False)
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"rotary_embedding": 2, "attention": 1}, result.counts
    ops = op_sequence(result.to_proto())
    assert MHA in ops and GQA not in ops, ops
    (reason,) = misses(result, "attention")
    assert reason.startswith("not GroupQueryAttention: with a KV cache GroupQueryAttention"), reason
    assert "must be causal" in reason, reason
    for batch, seq, past in SHAPES:
        for mask in MASKS:
            run_both(model, result.to_proto(), feeds=feeds(batch, seq, past, mask), **TOL)


def test_infinite_mask_without_nan_guard_becomes_multi_head_attention():
    """Eager attention over a -inf mask: a row with nothing to attend to is NaN in the
    graph. GroupQueryAttention cannot give NaN there (no NaN guard follows the Softmax),
    MultiHeadAttention with the mask as its bias does (probed: the softmax of a row of
    -inf is NaN in its kernel as in the graph), so the grouped heads go there."""
    model = decoder_attention(eager=True)
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"rotary_embedding": 2, "attention": 1}, result.counts
    ops = op_sequence(result.to_proto())
    assert MHA in ops and GQA not in ops, ops
    (reason,) = misses(result, "attention")  # why not GroupQueryAttention, beside the fusion
    assert reason.startswith("not GroupQueryAttention: the mask") and "NaN" in reason, reason
    empty = feeds(2, 3, 4, "left")
    empty["attention_mask"][-1, :] = 0  # every row of the last batch attends to nothing
    for case in (empty, feeds(2, 3, 4, "random"), feeds(1, 1, 5, "left")):
        run_both(model, result.to_proto(), feeds=case, **TOL)  # NaN where the graph's is


def test_finite_mask_with_cache_averages_the_rows_with_nothing_to_attend_to():
    """A finite mask averages every key in a row with nothing to attend to, where the
    causal kernel a cache needs would average only the earlier ones: those rows are
    picked from the mean of the cache's values instead (exact on every padding)."""
    model = decoder_attention(eager=True, lowest=float(np.finfo(np.float32).min))
    fused, ops = fuse_exactly(model, "attention")
    gqa_at = ops.index(GQA)
    # the mean only when a row is empty (If's else_branch): test_empty_rows_guarded.py
    assert ops[gqa_at:] == [GQA, "Cast", "ReduceMin", "Cast", "If"], ops
    (guard,) = [n for n in fused.graph.node if n.op_type == "If"]
    fix = [n.op_type for n in onnx.helper.get_node_attr_value(guard, "else_branch").node]
    assert fix == ["ReduceMean", "Unsqueeze", "Expand", "Reshape", "Where"], fix
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert {a.name: a.i for a in gqa.attribute}["causal"] == 1


def test_finite_mask_with_a_sliding_window_and_a_cache_takes_the_window():
    """The window goes to the kernel (``local_window_size``) with a finite mask too; the
    rows with nothing to attend to inside it take the cache's mean value all the same."""
    model = decoder_attention(eager=True, lowest=float(np.finfo(np.float32).min), window=3)
    fused, ops = fuse_exactly(model, "attention")
    assert "LessOrEqual" not in ops and "ReduceMax" not in ops and "If" in ops, ops
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert {a.name: a.i for a in gqa.attribute}["local_window_size"] == 3


def test_rotary_with_unequal_halves_is_refused():
    """Concat(f, 2 f) is not a rotation of the pairs (x_i, x_{i+h}): nothing fuses."""
    model = decoder_attention(halves_equal=False)
    result = optimize_quiet(model, **ORT)
    assert "rotary_embedding" not in result.counts
    reasons = misses(result, "rotary_embedding")
    assert any("cannot show that the halves" in r for r in reasons), reasons
    assert ROTARY not in op_sequence(result.to_proto())
    run_both(model, result.to_proto(), feeds=feeds(2, 1, 3, "left"), **TOL)


def test_generic_target_below_opset_23_leaves_rotary():
    model = decoder_attention()
    result = optimize_quiet(model, target="generic")
    assert "rotary_embedding" not in result.counts
    assert any("opset 23" in r for r in misses(result, "rotary_embedding"))


def test_generic_target_at_opset_23_becomes_onnx_attention():
    """Upgraded to opset 23, the generic target emits ONNX RotaryEmbedding and ONNX
    Attention (not causal: the mask says everything; the cache appended by the op)."""
    model = decoder_attention()
    result = optimize_quiet(model, target="generic", upgrade_opset=23, exclude=ORT["exclude"])
    assert result.counts == {"rotary_embedding": 2, "attention": 1}
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    ops = op_sequence(fused)
    assert ops.count("RotaryEmbedding") == 2 and ops.count("Attention") == 1
    assert not any(op.startswith("com.microsoft") for op in ops)
    (attention,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert list(attention.input[4:]) == ["past_key", "past_value"]
    assert list(attention.output[1:]) == ["present_key", "present_value"]
    for batch, seq, past in SHAPES:
        for mask in MASKS:
            run_both(model, fused, feeds=feeds(batch, seq, past, mask), **TOL)
