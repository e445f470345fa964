"""``attention`` (attention, attention, attention): the
scaled-dot-product core of multi-head attention, after ``qkv_bias_merge``, as
com.microsoft MultiHeadAttention (the SDPA form is at the end of this file). On the
onnxruntime target these tests stop there: the packing of the merged projection and
the MultiHeadAttention into one Attention that follows by default is
test_packed_attention.py's.

The block is B = 2, S = 5, hidden 16, 4 heads of size 4, written as the BERT family
exports it: Reshape -> Transpose(0, 2, 1, 3) per head split (K straight to
Transpose(0, 2, 3, 1)), MatMul, Mul by the scale, Add of the mask built as
``Where(keep, 0, -3.4e38)``, Softmax, MatMul, Transpose, Reshape.

Tolerance: rtol = atol = 1e-5. MultiHeadAttention sums in another order than the
MatMuls it replaces; at these sizes the outputs differed by about 1e-7.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    build_model,
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)

TOL = dict(rtol=1e-5, atol=1e-5)
# The later step that packs a merged projection and its MultiHeadAttention into one
# com.microsoft.Attention (tests/fusion_core/rewriters/test_packed_attention.py).
PACKED = ["attention_packed", "attention_packed_merged"]
B, S, HIDDEN, HEADS = 2, 5, 16, 4
MHA = "com.microsoft::MultiHeadAttention"


def attention_model(
    *,
    mask: str | None = "[2, 1, 5, 5]",
    scale: str | None = "Mul",
    scale_value: float = 0.5,
    split_target=(0, 0, HEADS, HIDDEN // HEADS),
    merge_target=(0, 0, HIDDEN),
    target_input: bool = False,
    scale_input: bool = False,
    scale_first: bool = False,
    seed: int = 0,
    out_shape: str = f"[{B}, {S}, {HIDDEN}]",
    opset: int = 17,
    k_two_transposes: bool = False,
    extra_step: str | None = None,
    prescale_q: bool = False,
) -> onnx.ModelProto:
    """Q/K/V projections (MatMul + bias Add) and eager attention over ``x[2, 5, 16]``;
    ``mask`` is the shape of the boolean ``keep`` input (None: no mask);
    ``k_two_transposes`` writes K^T as dynamo without its optimizer does, and
    ``extra_step`` (an elementwise op) is applied to the scaled scores with a constant 0;
    ``scale=None`` leaves the scores unscaled (T5), and ``prescale_q`` multiplies the query
    projection by ``c`` before its heads are split (Whisper, as dynamo exports it)."""
    rng = np.random.default_rng(seed)
    inits = {f"w{p}": rng.standard_normal((HIDDEN, HIDDEN)) * 0.25 for p in "qkv"} | {
        f"b{p}": rng.standard_normal(HIDDEN) * 0.1 for p in "qkv"
    }
    inits["merge_shape"] = np.array(merge_target, np.int64)
    inputs = [f"float[{B}, {S}, {HIDDEN}] x"]
    if target_input:
        inputs.append("int64[4] split_shape")
    else:
        inits["split_shape"] = np.array(split_target, np.int64)
    if scale_input:
        inputs.append("float c")
    else:
        inits["c"] = np.array(scale_value, np.float32)
    body = []
    scores = "scaled"
    if mask is not None:
        inputs.append(f"bool{mask} keep")
        inits["zero"] = np.array(0.0, np.float32)
        inits["lowest"] = np.array(np.finfo(np.float32).min, np.float32)
        body.append("bias = Where (keep, zero, lowest)")
    for p in "qkv":
        body += [f"{p}m = MatMul (x, w{p})", f"{p}a = Add ({p}m, b{p})"]
        if p == "q" and prescale_q:
            body += ["qs = Mul (qa, c)", "qr = Reshape (qs, split_shape)"]
            continue
        body.append(f"{p}r = Reshape ({p}a, split_shape)")
    body.append("qt = Transpose <perm = [0, 2, 1, 3]> (qr)")
    if k_two_transposes:
        body.append("kh = Transpose <perm = [0, 2, 1, 3]> (kr)")
        body.append("kt = Transpose <perm = [0, 1, 3, 2]> (kh)")
    else:
        body.append("kt = Transpose <perm = [0, 2, 3, 1]> (kr)")
    body += [
        "vt = Transpose <perm = [0, 2, 1, 3]> (vr)",
        "qk = MatMul (qt, kt)",
        "scaled = Identity (qk)"
        if scale is None
        else (f"scaled = {scale} (c, qk)" if scale_first else f"scaled = {scale} (qk, c)"),
    ]
    if extra_step is not None:
        inits["nothing"] = np.array(0.0, np.float32)
        body += ["scaled_more = " + extra_step + " (scaled, nothing)"]
        scores = "scaled_more"
    if mask is not None:
        body.append(f"masked = Add ({scores}, bias)")
        scores = "masked"
    body += [
        f"probs = Softmax <axis = -1> ({scores})",
        "context = MatMul (probs, vt)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge_shape)",
    ]
    ir_version = 8 if opset < 21 else 10
    text = f"""<ir_version: {ir_version}, opset_import: ["" : {opset}]>
    g ({", ".join(inputs)}) => (float{out_shape} y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def optimize_mha(model: onnx.ModelProto):
    """The onnxruntime target up to MultiHeadAttention: without the packing after it."""
    return optimize_quiet(model, target="onnxruntime", exclude=PACKED)


def merged_ops(mask: bool) -> list[str]:
    return (["Where"] if mask else []) + ["MatMul", "Add", "Split", MHA]


def the_attention(model: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    return node


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


CASES = {
    "mask-mul": dict(mask="[2, 1, 5, 5]"),
    "mask-per-batch-and-head": dict(mask="[2, 4, 5, 5]"),
    "mask-shared": dict(mask="[1, 1, 5, 5]"),
    "no-mask-div": dict(mask=None, scale="Div", scale_value=2.0),
    "scale-written-first": dict(scale_first=True),
    # 0.3 is not 1 / sqrt(4): the graph's scale is passed explicitly, not the default.
    "scale-not-the-default": dict(scale_value=0.3),
    "targets-with-minus-one": dict(split_target=(B, S, -1, 4), merge_target=(B, S, -1)),
    "heads-minus-one": dict(split_target=(0, 0, HEADS, -1), merge_target=(0, 0, -1)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_attention_becomes_multi_head_attention(case):
    model = attention_model(**case)
    result = optimize_mha(model)
    mask = case.get("mask", "") is not None
    pattern = "attention" if mask else "attention"
    fused = assert_fusion(
        model,
        result,
        counts={"qkv_bias_merge": 1, pattern: 1},
        ops=merged_ops(mask),
        **TOL,
    )
    node = the_attention(fused)
    value = case.get("scale_value", 0.5)
    expected_scale = 1 / value if case.get("scale") == "Div" else value
    assert attrs(node)["num_heads"] == HEADS
    assert attrs(node)["scale"] == pytest.approx(expected_scale, rel=1e-7)
    split = [n for n in fused.graph.node if n.op_type == "Split"][0]
    assert list(node.input[:3]) == list(split.output)
    assert list(node.input[3:]) == (["", "", "bias"] if mask else [])


def test_generic_target_keeps_the_block_and_folds_the_scale():
    """Below opset 23 the generic target has no attention op: the block stays, with its
    scale (0.5 = 1 / sqrt(head size 4)) folded into the Q projection, then merged."""
    model = attention_model()
    result = optimize_quiet(model, target="generic")
    assert result.counts == {"attention_scale_fold": 1, "qkv_bias_merge": 1}
    fused = result.to_proto()
    assert "Mul" not in op_sequence(fused)
    run_both(model, fused, **TOL)
    reasons = misses(result, "attention")
    assert any("needs opset 23" in r for r in reasons), reasons


@pytest.mark.parametrize("mask", ["[2, 1, 5, 5]", None], ids=["mask", "no-mask"])
def test_generic_target_at_opset_23_emits_onnx_attention(mask):
    model = attention_model(mask=mask, scale_value=0.3, opset=23)
    result = optimize_quiet(model, target="generic")
    pattern = "attention" if mask else "attention"
    assert result.counts == {"qkv_bias_merge": 1, pattern: 1}
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    # with a mask, the rows it masks everywhere take the values' mean (onnxruntime's ONNX
    # Attention gives 0 there, the graph the mean: test_attention_empty_rows.py), read only
    # when the mask has such a row: an If on whether every row attends (_empty_rows_guard)
    empty_rows = ["ReduceMax", "ReduceMin", "Greater", "If"] if mask else []
    ops = op_sequence(fused)
    assert ops[: ops.index("Attention") + 1] == merged_ops(mask is not None)[:-1] + ["Attention"]
    assert sorted(ops[ops.index("Attention") + 1 :]) == sorted(empty_rows)
    if mask:
        (guard,) = [n for n in fused.graph.node if n.op_type == "If"]
        fix = sorted(n.op_type for n in onnx.helper.get_node_attr_value(guard, "else_branch").node)
        assert fix == sorted(
            ["ReduceMean", "ReduceMax", "LessOrEqual", "Transpose", "Reshape", "Reshape"]
            + ["Where", "Reshape"]
        ), fix
    (node,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    assert node.domain == ""
    assert attrs(node)["q_num_heads"] == attrs(node)["kv_num_heads"] == HEADS
    assert attrs(node)["scale"] == pytest.approx(0.3, rel=1e-7)
    assert len(node.input) == (4 if mask else 3)
    run_both(model, fused, **TOL)
    # The scale fold is for models that cannot take the whole block; alone, it says so.
    alone = optimize_quiet(model, target="generic", patterns=["attention_scale_fold"])
    assert alone.counts == {}
    reasons = misses(alone, "attention_scale_fold")
    assert reasons == ["the model's opset for 'ai.onnx' is 23, expected lt 23"]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (dict(scale_value=0.3), "expected 1 / sqrt(dim(q_t.out0, -1)) = 0.5"),
        (dict(scale="Div", scale_value=3.0), "expected sqrt(dim(q_t.out0, -1)) = 2"),
    ],
    ids=["mul-not-1-over-sqrt", "div-not-sqrt"],
)
def test_scale_that_is_not_the_attention_scale_stays(case, reason):
    model = attention_model(**case)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {"qkv_bias_merge": 1}
    # The near miss, alone: with the merge, the last round no longer sees the fold's path.
    pattern = "attention_scale_fold_div" if case.get("scale") == "Div" else "attention_scale_fold"
    alone = optimize_quiet(model, target="generic", patterns=[pattern])
    assert alone.counts == {}
    reasons = misses(alone, pattern)
    assert any(reason in r for r in reasons), reasons


@pytest.mark.parametrize("sdpa_lowest", [float(np.finfo(np.float32).min), -np.inf])
def test_sdpa_generic_folds_both_scales(sdpa_lowest):
    """SDPA's scale on Q and on K^T goes onto the scores (canonical form), and from there
    into the Q projection, as the eager attention's."""
    model = sdpa_model(lowest=sdpa_lowest, scale=(HIDDEN // HEADS) ** -0.25)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {"attention_scale_fold": 1, "qkv_bias_merge": 1}
    fused = result.to_proto()
    assert "Mul" not in op_sequence(fused)
    run_both(model, fused, feeds=sdpa_feeds(), **TOL)


# ---------------------------------------------------------------------------------------
# Negative cases: the block stays (after the Q/K/V merge) and a near miss says why.

UNFUSED = [
    "Where", "MatMul", "Add", "Split", "Reshape", "Reshape", "Reshape", "Transpose",
    "Transpose", "Transpose", "MatMul", "Mul", "Add", "Softmax", "MatMul", "Transpose",
    "Reshape",
]  # fmt: skip
# Without a mask there is no Where and no Add between the Mul and the Softmax.
UNFUSED_NO_MASK = UNFUSED[1:12] + UNFUSED[13:]


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        # [10, 1, 4, 4] splits heads but attends over each token alone: another attention.
        (
            dict(split_target=(10, 1, HEADS, 4), merge_target=(B, S, HIDDEN), mask=None),
            "keeps the batch and sequence dimensions",
        ),
        (dict(scale_input=True), "scale.in1 ('c') is not a constant initializer"),
    ],
    ids=["reshape-mixes-batch", "scale-input"],
)
def test_no_fusion(case, reason):
    model = attention_model(**case)
    result = optimize_mha(model)
    masked = case.get("mask", "") is not None
    pattern = "attention" if masked else "attention"
    ops = UNFUSED if masked else UNFUSED_NO_MASK
    assert_no_fusion(model, result, pattern=pattern, reason=reason, ops=ops, **TOL)


def test_a_mask_with_one_row_for_every_query_is_expanded_to_each():
    """onnxruntime's CPU kernel rejects a [B, 1, 1, L] attention_bias at run time (it
    takes a row per query), so the rewrite expands the key padding mask nn.MultiheadAttention
    writes to [B, 1, S, L] by S read from the query's shape (here a known size, which the
    rewrite's typed values let the clean-up fold)."""
    model = attention_model(mask="[2, 1, 1, 5]")
    result = optimize_mha(model)
    fused = assert_fusion(
        model,
        result,
        counts={"qkv_bias_merge": 1, "attention": 1},
        ops=["Where", "MatMul", "Add", "Split", "Expand", MHA],  # S known: its Shape read folds
        **TOL,
    )
    expand = next(n for n in fused.graph.node if n.op_type == "Expand")
    assert expand.input[0] == "bias" and the_attention(fused).input[5] == expand.output[0]


def test_no_fusion_when_the_target_is_computed():
    """The heads cannot be read from a Reshape target the model computes at run time."""
    model = attention_model(target_input=True)
    result = optimize_mha(model)
    assert "attention" not in result.counts
    reasons = misses(result, "attention")
    assert any("is neither a constant nor a Concat" in r for r in reasons), reasons
    fused = result.to_proto()
    assert op_sequence(fused) == UNFUSED
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((B, S, HIDDEN)).astype(np.float32),
        "split_shape": np.array([B, S, HEADS, HIDDEN // HEADS], np.int64),
        "keep": rng.random((B, 1, S, S)) < 0.7,
    }
    run_both(model, fused, feeds=feeds, **TOL)


# ---------------------------------------------------------------------------------------
# attention: the same block as dynamo exports scaled_dot_product_attention
# (its K^T by a 3-D Reshape/Transpose/Reshape is one Transpose after kt_by_reshape).


def sdpa_model(
    *, lowest: float = float(np.finfo(np.float32).min), keep_heads: int = 1, scale: float = 0.7
) -> onnx.ModelProto:
    """Symbolic batch and sequence (as dynamo writes them, so the Shape(K) chain stays);
    the scale 0.7 is split over Q and K^T, K^T is a 3-D Reshape/Transpose/Reshape, the
    mask is ``Where(keep, 0, lowest)`` and ``Where(IsNaN(P), 0, P)`` follows the Softmax."""
    rng = np.random.default_rng(0)
    inits = {f"w{p}": rng.standard_normal((HIDDEN, HIDDEN)) * 0.25 for p in "qkv"} | {
        f"b{p}": rng.standard_normal(HIDDEN) * 0.1 for p in "qkv"
    }
    inits |= {
        "split_shape": np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64),
        "merge_shape": np.array([0, 0, HIDDEN], np.int64),
        "s": np.array(scale, np.float32),
        "zero": np.array(0.0, np.float32),
        "lowest": np.array(lowest, np.float32),
        "minus1": np.array([-1], np.int64),
        "minus2": np.array([-2], np.int64),
        "big": np.array([np.iinfo(np.int64).max], np.int64),
        "small": np.array([np.iinfo(np.int64).min], np.int64),
    }
    body = ["bias = Where (keep, zero, lowest)"]
    for p in "qkv":
        body += [f"{p}m = MatMul (x, w{p})", f"{p}a = Add ({p}m, b{p})"]
        body.append(f"{p}r = Reshape ({p}a, split_shape)")
        body.append(f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)")
    body += [
        "kshape = Shape (kt)",
        "last = Slice (kshape, minus1, big)",
        "len = Slice (kshape, minus2, minus1)",
        "lead = Slice (kshape, small, minus2)",
        "flat_target = Concat <axis = 0> (minus1, len, last)",
        "kflat = Reshape (kt, flat_target)",
        "kswap = Transpose <perm = [0, 2, 1]> (kflat)",
        "unflat_target = Concat <axis = 0> (lead, last, len)",
        "ktt = Reshape (kswap, unflat_target)",
        "qs = Mul (qt, s)",
        "ks = Mul (ktt, s)",
        "qk = MatMul (qs, ks)",
        "masked = Add (qk, bias)",
        "probs = Softmax <axis = -1> (masked)",
        "nan = IsNaN (probs)",
        "guarded = Where (nan, zero, probs)",
        "context = MatMul (guarded, vt)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge_shape)",
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[batch, seq, {HIDDEN}] x, bool[batch, {keep_heads}, seq, seq] keep)
        => (float[batch, seq, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def sdpa_feeds() -> dict[str, np.ndarray]:
    """Batch 1 is fully masked, row by row: the case the NaN guard is there for."""
    rng = np.random.default_rng(1)
    keep = rng.random((B, 1, S, S)) < 0.7
    keep[1] = False
    return {"x": rng.standard_normal((B, S, HIDDEN)).astype(np.float32), "keep": keep}


def test_sdpa_attention_becomes_multi_head_attention():
    model = sdpa_model()
    result = optimize_mha(model)
    # dynamo's K^T (Reshape, Transpose, Reshape) is one Transpose by then (kt_by_reshape)
    assert result.counts == {"qkv_bias_merge": 1, "attention": 1}
    fused = result.to_proto()
    assert op_sequence(fused) == merged_ops(mask=True)
    onnx.checker.check_model(fused, full_check=True)
    node = the_attention(fused)
    assert attrs(node)["num_heads"] == HEADS
    assert attrs(node)["scale"] == pytest.approx(0.7 * 0.7, rel=1e-6)
    assert list(node.input[3:]) == ["", "", "bias"]
    # With a finite mask a fully masked row is uniform in both graphs (no NaN to guard).
    run_both(model, fused, feeds=sdpa_feeds(), **TOL)


def test_sdpa_infinite_mask_keeps_the_guard():
    """With -inf a fully masked row is NaN, which the guard turns into 0; MultiHeadAttention
    has no guard, so the mask becomes finite and such rows are multiplied by 0."""
    model = sdpa_model(lowest=-np.inf)
    result = optimize_mha(model)
    assert result.counts == {"qkv_bias_merge": 1, "attention": 1}
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    assert op_sequence(fused)[-6:] == ["Where", "Cast", "ReduceMax", "Transpose", MHA, "Mul"]
    feeds = sdpa_feeds()
    run_both(model, fused, feeds=feeds, **TOL)
    # The multiply is what keeps batch 1 (fully masked) at 0: without it, the finite mask
    # gives those rows a uniform softmax, the mean of V.
    (mul,) = [n for n in fused.graph.node if n.op_type == "Mul"]
    ablated = onnx.ModelProto()
    ablated.CopyFrom(fused)
    ablated.graph.node.remove(next(n for n in ablated.graph.node if n.op_type == "Mul"))
    for node in ablated.graph.node:
        if node.op_type == "MultiHeadAttention":
            node.output[0] = mul.output[0]
    session = onnxruntime.InferenceSession(
        ablated.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(None, feeds)
    (expected,) = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    assert np.all(expected[1] == 0)
    assert np.abs(y[1]).max() > 0.1
    np.testing.assert_allclose(y[0], expected[0], **TOL)


def test_sdpa_infinite_mask_per_head_is_refused():
    """A row may be fully masked for one head only: a per-row factor cannot express it."""
    model = sdpa_model(lowest=-np.inf, keep_heads=HEADS)
    result = optimize_mha(model)
    assert "attention" not in result.counts
    reasons = misses(result, "attention")
    assert any("is not known to be [B or 1, 1, S, L]" in r for r in reasons), reasons
    keep = np.random.default_rng(1).random((B, HEADS, S, S)) < 0.7
    keep[1, 2] = False
    feeds = {"x": sdpa_feeds()["x"], "keep": keep}
    run_both(model, result.to_proto(), feeds=feeds, **TOL)


def test_two_dimensional_merge_keeps_a_reshape():
    """GPT-2 merges the heads straight into [B * S, hidden] for its Gemm: the Reshape
    stays, reading MultiHeadAttention's output."""
    model = attention_model(merge_target=(-1, HIDDEN), out_shape=f"[{B * S}, {HIDDEN}]")
    result = optimize_mha(model)
    assert_fusion(
        model,
        result,
        counts={"qkv_bias_merge": 1, "attention": 1},
        ops=merged_ops(mask=True) + ["Reshape"],
        **TOL,
    )


def test_merge_that_copies_a_head_dimension_is_refused():
    """A 0 past the second entry copies the heads (4) from out_t, but would copy the
    hidden size (16) from MultiHeadAttention's output."""
    model = attention_model(merge_target=(0, 0, 0, -1), out_shape=f"[{B}, {S}, {HEADS}, 4]")
    result = optimize_mha(model)
    assert "attention" not in result.counts
    reasons = misses(result, "attention")
    assert any("may copy a dimension past the second" in r for r in reasons), reasons
    run_both(model, result.to_proto(), **TOL)


# ---------------------------------------------------------------------------------------
# K^T as two Transposes (dynamo without its optimizer), and near misses where no
# binding of any attention pattern completes (the attention probe).


@pytest.mark.parametrize("mask", ["[2, 1, 5, 5]", None], ids=["mask", "no-mask"])
def test_k_transposed_twice_becomes_multi_head_attention(mask):
    model = attention_model(mask=mask, k_two_transposes=True)
    result = optimize_mha(model)
    # one spelling of K^T, two Transposes, for this and the one-Transpose form (kt_of_heads)
    pattern = "attention" if mask else "attention"
    fused = assert_fusion(
        model,
        result,
        counts={"qkv_bias_merge": 1, pattern: 1},
        ops=merged_ops(mask is not None),
        **TOL,
    )
    assert attrs(the_attention(fused))["num_heads"] == HEADS


def test_k_transposed_twice_in_another_order_stays():
    """[0, 1, 3, 2] then [0, 2, 1, 3] is not K^T: the perm constraint says so."""
    model = attention_model(k_two_transposes=True)
    k_heads, k_t = [n for n in model.graph.node if n.output[0] in ("kh", "kt")]
    k_heads.attribute[0].ints[:] = [0, 1, 3, 2]
    k_t.attribute[0].ints[:] = [0, 2, 1, 3]
    result = optimize_mha(model)
    assert "attention" not in result.counts
    reasons = misses(result, "attention")
    assert any("k_t.perm" in r and "expected eq [0, 1, 3, 2]" in r for r in reasons), reasons


def test_attention_softmax_no_pattern_reaches_is_explained():
    """A Sub between the scale and the mask: no attention pattern binds past it, and the
    near miss names the closest pattern, the step (its node id and op) and what is there."""
    model = attention_model(extra_step="Sub")
    result = optimize_mha(model)
    assert not any(p.startswith("attention") for p in result.counts), result.counts
    fused = result.to_proto()
    assert op_sequence(fused).count("Softmax") == 1
    (miss,) = [m for m in result.near_misses if m.pattern.startswith("attention")]
    assert miss.pattern == "attention"
    assert miss.nodes == ("<Add>", "<Softmax>")  # the partial binding: mask, softmax
    assert miss.reason == (
        "expected Mul or Div 'scale' computing input 0 of mask (an unnamed Add); "
        "found an unnamed Sub"
    )
    run_both(model, fused, **TOL)


def test_softmax_that_is_not_attention_is_not_explained():
    """A classifier's Softmax over a projection (MatMul by a constant weight) is not
    attention: no attention near miss is made up for it."""
    w = np.random.default_rng(0).standard_normal((HIDDEN, 3)).astype(np.float32)
    model = build_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 16] x) => (float[2, 3] y) {
            logits = MatMul (x, w)
            y = Softmax <axis = -1> (logits)
        }""",
        {"w": w},
    )
    result = optimize_mha(model)
    assert not [m for m in result.near_misses if m.pattern.startswith("attention")]


@pytest.mark.parametrize(
    ("case", "pattern", "scale"),
    [
        (dict(scale=None), "attention", 1.0),
        (dict(scale=None, mask=None), "attention", 1.0),
        (dict(scale=None, mask=None, prescale_q=True), "attention", 1.0),
    ],
    ids=["t5-unscaled-with-bias", "unscaled-no-mask", "whisper-query-scaled-first"],
)
def test_unscaled_scores_become_attention_with_scale_one(case, pattern, scale):
    model = attention_model(**case)
    result = optimize_mha(model)
    assert result.counts.get(pattern) == 1, result.counts
    fused = result.to_proto()
    assert attrs(the_attention(fused))["scale"] == pytest.approx(scale, rel=1e-7)
    run_both(model, fused, **TOL)
