"""Rule ``one_bias`` on Funnel's attention in miniature: pooled queries (AveragePool
and Gather of the normed input, its first row concatenated back, a per-head bias added
as the relative attention's ``q + r_w_bias``), a sinusoid positional score (Sin, Cos,
Concat, a projection, a ScatterND of its rows), a token-type score (Split and Where of a product
with a constant) times the ``cls`` mask (ConstantOfShape and Pad), TorchScript's
``attn_score.float()`` and the mask subtracted, ``s - 1e6 * (1 - m)``.

Every bias is bounded by ``value_bound`` and the scores by ``score_bound``, so the
-1e6 mask absorbs them and the chain of three folds into one bias: the scores take one
Add, within a few units in the last place of the logits (logits below 100 here:
``REGROUPED``, 2 * 8 * 2**-24 * 100 < 1e-4). With the ``cls`` mask a graph input
nothing bounds the token-type score: the two general biases fold, the mask stays apart.
"""

from __future__ import annotations

import numpy as np
import onnx

from autofusion.fusion_core.testing import build_model, canonical_twice, run_both
from tests.fusion_core import encoder_text as text

REGROUPED = dict(rtol=0, atol=1e-4)
S, D, HEADS, SIZE = 4, 8, 2, 4  # keys, hidden, heads, head size; queries pooled to S / 2


def _funnel(cls_input: bool) -> onnx.ModelProto:
    more = f", float[{S // 2}, {S}] cls" if cls_input else ""
    cls = [] if cls_input else ["ones = ConstantOfShape <value = float[1] {1.0}> (cls_shape)"]
    cls += [] if cls_input else ["cls = Pad (ones, cls_pads)"]
    body = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[2, {S}, {D}] x, int64[2, {S}] attention_mask, bool[2, 1, {S // 2}, {S}] same{more})
        => (float[2, {S // 2}, {D}] y) {{
        normed = LayerNormalization <axis = -1> (x, gamma, beta)
        cls_row = Slice (normed, zero_1, one_1, one_axis)
        rest = Slice (normed, one_1, length_1, one_axis)
        rejoined = Concat <axis = 1> (cls_row, rest)
        wide = Unsqueeze (rejoined, one_axis)
        pooled4 = AveragePool <kernel_shape = [2, 1], strides = [2, 1]> (wide)
        pooled = Gather <axis = 1> (pooled4, zero_i)
        q = MatMul (pooled, wq)
        k = MatMul (normed, wk)
        v = MatMul (normed, wv)
        qh = Reshape (q, q_split)
        qs = Mul (qh, scale)
        qm = Add (qs, head_bias)
        merged_q = Reshape (qm, q_merge)
        split_q = Reshape (merged_q, q_split)
        qt = Transpose <perm = [0, 2, 1, 3]> (split_q)
        kh = Reshape (k, kv_split)
        kt = Transpose <perm = [0, 2, 3, 1]> (kh)
        vh = Reshape (v, kv_split)
        vt = Transpose <perm = [0, 2, 1, 3]> (vh)
        content = MatMul (qt, kt)
        positions = Range (zero_f, length_f, one_f)
        column = Unsqueeze (positions, one_axis)
        phase = Mul (column, frequencies)
        sin = Sin (phase)
        cos = Cos (phase)
        embedded = Concat <axis = -1> (sin, cos)
        r = MatMul (embedded, wr)
        rh = Reshape (r, r_split)
        rt = Transpose <perm = [1, 2, 0]> (rh)
        relative = MatMul (qt, rt)
        first = Slice (relative, zero_1, one_1, zero_1)
        positional = ScatterND (relative, first_row, first)
        typed = MatMul (qt, segments)
        same_type, other_type = Split <axis = 3, num_outputs = 2> (typed)
        chosen = Where (same, same_type, other_type)
        {chr(10).join(cls)}
        token_type = Mul (chosen, cls)
        summed = Add (content, positional)
        scores = Add (summed, token_type)
        as_float = Cast <to = 1> (scores)
        mask_u = Unsqueeze (attention_mask, mask_axes)
        mask_f = Cast <to = 1> (mask_u)
        inverted = Sub (one_f, mask_f)
        masking = Mul (inverted, million)
        masked = Sub (as_float, masking)
        probs = Softmax <axis = -1> (masked)
        {text.lines(text.CONTEXT)}
    }}"""
    rng = np.random.default_rng(0)
    weights = {w: rng.standard_normal((D, D)) / np.sqrt(D) for w in ("wq", "wk", "wv", "wo", "wr")}
    constants = {
        **weights,
        "gamma": rng.uniform(0.5, 1.0, D),
        "beta": 0.1 * rng.standard_normal(D),
        "segments": rng.standard_normal((HEADS, SIZE, 2)) / 2,
        "frequencies": 1.0 / 10000.0 ** (np.arange(D // 2) / (D // 2)),
        "scale": np.array(SIZE**-0.5, np.float32),
        "million": np.array(1e6, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "one_f": np.array(1.0, np.float32),
        "length_f": np.array(float(S), np.float32),
        "zero_i": np.array(0, np.int64),
        "one_axis": np.array([1], np.int64),
        "zero_1": np.array([0], np.int64),
        "one_1": np.array([1], np.int64),
        "length_1": np.array([S], np.int64),
        "first_row": np.array([[0]], np.int64),
        "mask_axes": np.array([1, 2], np.int64),
        "q_split": np.array([2, S // 2, HEADS, SIZE], np.int64),
        "kv_split": np.array([2, S, HEADS, SIZE], np.int64),
        "r_split": np.array([S, HEADS, SIZE], np.int64),
        "merge": np.array([2, S // 2, D], np.int64),
        "q_merge": np.array([2, S // 2, D], np.int64),
        "head_bias": 0.1 * rng.standard_normal((HEADS, SIZE)),
        "cls_shape": np.array([S // 2 - 1, S - 1], np.int64),
        "cls_pads": np.array([1, 1, 0, 0], np.int64),
    }
    return build_model(body, constants, only_read=True)


def _feeds(cls_input: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    mask = np.ones((2, S), np.int64)
    mask[1, -1] = 0  # the second row's last key padded
    out = {
        "x": rng.standard_normal((2, S, D)).astype(np.float32),
        "attention_mask": mask,
        "same": rng.integers(0, 2, (2, 1, S // 2, S)).astype(bool),
    }
    if cls_input:
        out["cls"] = np.pad(np.ones((S // 2 - 1, S - 1), np.float32), ((1, 0), (1, 0)))
    return out


def _softmax_add(model: onnx.ModelProto) -> tuple[onnx.NodeProto, dict[str, onnx.NodeProto]]:
    producers = {o: n for n in model.graph.node for o in n.output}
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    return producers[softmax.input[0]], producers


def test_funnel_scores_take_one_bias() -> None:
    model = _funnel(cls_input=False)
    canonical, done, again, _ = canonical_twice(model)
    assert done.get("one_bias") == 1 and again == 0, done
    add, producers = _softmax_add(canonical)
    assert add.op_type == "Add" and producers[add.input[0]].op_type == "Mul", add  # the scale
    summed = producers[add.input[1]]
    assert summed.op_type == "Add" and producers[summed.input[1]].op_type == "Mul"  # the mask
    run_both(model, canonical, feeds=_feeds(False), **REGROUPED)


def test_funnel_mask_of_an_unbounded_bias_stays_apart() -> None:
    model = _funnel(cls_input=True)
    canonical, done, again, _ = canonical_twice(model)
    assert done.get("one_bias") == 1 and again == 0, done  # the two general biases only
    add, producers = _softmax_add(canonical)
    assert producers[add.input[1]].op_type == "Mul", add  # the mask, -1e6 * (1 - m), apart
    run_both(model, canonical, feeds=_feeds(True), **REGROUPED)
