"""The rules ``mask_as_bias``, ``mask_clamp``, ``unit_scale``, ``one_bias``, ``repeat_kv``,
``packed_heads``, ``kt_of_heads`` and ``heads_in_batch`` on small graphs: what each
rewrites into the one spelling the attention rewriters read, what it leaves alone (a
look-alike that computes something else), that it changes no value (onnxruntime,
optimizations off, rtol = atol = 0) and that a second run changes nothing. The
generated attention blocks of test_attention_spellings.py combine them with the rest."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import (
    build_model,
    canonical_twice,
    op_sequence,
    optimize_quiet,
    run_both,
)

EXACT = dict(rtol=0, atol=0)
LOWEST = np.finfo(np.float32).min
# q positions 2..4 (a past of 2) against key positions 0..4, and a padding mask
MASK_INPUTS = "float[2, 3, 4] q, float[2, 4, 5] kt, int64[2, 5] attention_mask"
INDICES = [
    "qk = MatMul (q, kt)",
    "kv_pos = Range (start, total, step)",
    "q_pos = Range (past, total, step)",
    "kv_u = Unsqueeze (kv_pos, axis_0)",
    "q_u = Unsqueeze (q_pos, axis_1)",
]
INTS = {
    "start": np.array(0, np.int64),
    "past": np.array(2, np.int64),
    "total": np.array(5, np.int64),
    "step": np.array(1, np.int64),
    "axis_0": np.array([0], np.int64),
    "axis_1": np.array([1], np.int64),
    "axis_2": np.array([2], np.int64),
    "pad_axes": np.array([1], np.int64),
    "zero_i": np.array(0, np.int64),
    "zero_f": np.array(0.0, np.float32),
    "one_f": np.array(1.0, np.float32),
    "lowest": np.array(LOWEST, np.float32),
    "minus_inf": np.array(-np.inf, np.float32),
    "finite": np.array(-10000.0, np.float32),
}


_canonical = canonical_twice  # (model, rules applied, second run's count, onnx-ir graph)


def _masked(body: list[str], inputs: str = MASK_INPUTS) -> onnx.ModelProto:
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({inputs}) => (float[2, 3, 5] y) {{
        {chr(10).join([*INDICES, *body, "y = Softmax <axis = -1> (masked)"])}
    }}"""
    return build_model(text, INTS)


def _feeds(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = np.ones((2, 5), np.int64)
    mask[1, :2] = 0  # left padding
    return {
        "q": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "kt": rng.standard_normal((2, 4, 5)).astype(np.float32),
        "attention_mask": mask,
    }


CAUSAL_BLOCKED = "blocked = Greater (kv_u, q_u)"  # key after the query: not allowed
PADDING = ["pad_u = Unsqueeze (attention_mask, pad_axes)", "pad = Cast <to = 9> (pad_u)"]


def _ops(model: onnx.ModelProto) -> list[str]:
    return op_sequence(model)


@pytest.mark.parametrize("fill", ["lowest", "minus_inf", "finite"])
def test_a_blocked_condition_becomes_an_allowed_one_without_a_not(fill) -> None:
    model = _masked(
        [
            CAUSAL_BLOCKED,
            "pad_u = Unsqueeze (attention_mask, pad_axes)",
            "unpadded = Equal (pad_u, zero_i)",
            "either = Or (blocked, unpadded)",
            f"bias = Where (either, {fill}, zero_f)",
            "masked = Add (qk, bias)",
        ]
    )
    canonical, done, again, _ = _canonical(model)
    assert done == {"mask_as_bias": 1} and again == 0
    ops = _ops(canonical)
    # Greater flipped to LessOrEqual, x == 0 to Cast(x, bool), Or to And by De Morgan
    assert "Not" not in ops and "Or" not in ops and "Equal" not in ops, ops
    assert {"LessOrEqual", "And", "Cast"} <= set(ops), ops
    run_both(model, canonical, feeds=_feeds(), **EXACT)


def test_a_blocked_float_comparison_is_negated_by_a_not() -> None:
    """``not (a > b)`` is not ``a <= b`` where a is NaN: floats keep a Not."""
    model = _masked(
        [
            "kv_f = Cast <to = 1> (kv_u)",
            "q_f = Cast <to = 1> (q_u)",
            "blocked = Greater (kv_f, q_f)",
            "bias = Where (blocked, lowest, zero_f)",
            "masked = Add (qk, bias)",
        ]
    )
    canonical, done, again, _ = _canonical(model)
    assert done == {"mask_as_bias": 1} and again == 0
    assert "Not" in _ops(canonical) and "Greater" in _ops(canonical)
    run_both(model, canonical, feeds=_feeds(), **EXACT)


@pytest.mark.parametrize("fill", ["lowest", "minus_inf"])
@pytest.mark.parametrize("blocked_first", [False, True])
def test_masked_fill_of_the_scores_becomes_an_added_bias(fill, blocked_first) -> None:
    body = [CAUSAL_BLOCKED]
    if blocked_first:  # Where(blocked, fill, scores)
        body.append(f"masked = Where (blocked, {fill}, qk)")
    else:  # Where(allowed, scores, fill)
        body += ["allowed = Not (blocked)", f"masked = Where (allowed, qk, {fill})"]
    model = _masked(body)
    canonical, done, again, _ = _canonical(model)
    assert done == {"mask_as_bias": 1} and again == 0
    ops = _ops(canonical)
    assert ops.count("Where") == 1 and "Add" in ops and "Not" not in ops, ops
    run_both(model, canonical, feeds=_feeds(), **EXACT)


def test_masked_fill_with_a_finite_value_stays() -> None:
    """``scores - 10000`` is not ``-10000``: a fully masked row would differ."""
    model = _masked(["allowed = LessOrEqual (kv_u, q_u)", "masked = Where (allowed, qk, finite)"])
    assert _canonical(model)[1] == {}


@pytest.mark.parametrize("older", [False, True], ids=["one-minus-times-lowest", "masked-fill"])
def test_the_float_mask_one_minus_m_times_lowest_becomes_where(older) -> None:
    body = [
        "allowed = LessOrEqual (kv_u, q_u)",
        "allowed_f = Cast <to = 1> (allowed)",
        "inverted = Sub (one_f, allowed_f)",
    ]
    if older:  # transformers' _expand_mask: inverted.masked_fill(inverted.bool(), lowest)
        body += [
            "inverted_b = Cast <to = 9> (inverted)",
            "bias = Where (inverted_b, lowest, inverted)",
        ]
    else:
        body.append("bias = Mul (inverted, lowest)")
    model = _masked([*body, "masked = Add (qk, bias)"])
    canonical, done, again, _ = _canonical(model)
    assert done == {"mask_as_bias": 1} and again == 0
    ops = _ops(canonical)
    assert "Sub" not in ops and "Mul" not in ops and ops.count("Where") == 1, ops
    run_both(model, canonical, feeds=_feeds(), **EXACT)


def test_the_float_mask_times_minus_inf_stays() -> None:
    """``(1 - 1) * -inf`` is NaN, not 0: no Where computes that."""
    model = _masked(
        [
            "allowed = LessOrEqual (kv_u, q_u)",
            "allowed_f = Cast <to = 1> (allowed)",
            "inverted = Sub (one_f, allowed_f)",
            "bias = Mul (inverted, minus_inf)",
            "masked = Add (qk, bias)",
        ]
    )
    assert "mask_as_bias" not in _canonical(model)[1]


def test_a_where_no_softmax_reads_stays() -> None:
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (bool[4] c, float[4] x) => (float[4] y) {
        y = Where (c, lowest, zero_f)
    }"""
    model = build_model(text, INTS)
    assert _canonical(model)[1] == {}


ATTENTION = """<ir_version: 8, opset_import: ["" : 18]>
g (float[2, 2, 3, 4] q, float[2, 2, 4, 3] kt, float[2, 2, 3, 4] v) => (float[2, 2, 3, 4] y) {{
    {body}
    p = Softmax <axis = -1> (scores)
    y = MatMul (p, v)
}}"""


def _attention(body: list[str], inits: dict | None = None) -> onnx.ModelProto:
    return build_model(ATTENTION.format(body="\n".join(body)), {**INTS, **(inits or {})})


def _attention_feeds() -> dict:
    rng = np.random.default_rng(1)
    shapes = {"q": (2, 2, 3, 4), "kt": (2, 2, 4, 3), "v": (2, 2, 3, 4)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_unscaled_scores_are_multiplied_by_one_and_the_one_taken_out_again() -> None:
    model = _attention(["scores = MatMul (q, kt)"])
    canonical, done, again, work = _canonical(model)
    assert done == {"unit_scale": 1} and again == 0
    assert _ops(canonical) == ["MatMul", "Mul", "Softmax", "MatMul"]
    run_both(model, canonical, feeds=_attention_feeds(), **EXACT)
    assert undo_unused(work.graph)["unit_scale"] == 1
    assert op_sequence(ir.to_proto(work)) == ["MatMul", "Softmax", "MatMul"]


@pytest.mark.parametrize(
    "body",
    [
        ["qk = MatMul (q, kt)", "scores = Div (qk, root)"],
        ["qk = MatMul (q, kt)", "scores = Mul (half, qk)"],
    ],
    ids=["div", "mul-first"],
)
def test_scaled_scores_get_no_second_scale(body) -> None:
    model = _attention(body, {"root": np.array(2.0, np.float32), "half": np.array(0.5, np.float32)})
    assert "unit_scale" not in _canonical(model)[1]


@pytest.mark.parametrize("outer", ["Mul (qk, eighth)", "Div (qk, eight)"])
def test_a_scale_on_q_and_one_on_the_scores_are_one_scale_and_both_come_back(outer) -> None:
    """``MatMul(Q * a, K^T) * c`` is ``MatMul(Q, K^T) * (a * c)``: one scale for the pattern,
    and both written back where no fusion took it."""
    inits = {k: np.array(v, np.float32) for k, v in [("a", 0.5), ("eighth", 0.125), ("eight", 8.0)]}
    model = _attention(["qa = Mul (q, a)", "qk = MatMul (qa, kt)", f"scores = {outer}"], inits)
    canonical, done, again, work = _canonical(model)
    assert done == {"scale_to_scores": 1} and again == 0
    assert _ops(canonical) == ["MatMul", "Mul", "Softmax", "MatMul"]
    (scale,) = [n for n in canonical.graph.node if n.op_type == "Mul"]
    factor = {i.name: i for i in canonical.graph.initializer}[scale.input[1]]
    assert float(onnx.numpy_helper.to_array(factor)) == 0.0625
    run_both(model, canonical, feeds=_attention_feeds(), rtol=1e-6, atol=1e-7)
    assert undo_unused(work.graph)["scale_to_scores"] == 1
    back = ir.to_proto(work)
    assert op_sequence(back) == ["Mul", "MatMul", outer.split()[0], "Softmax", "MatMul"]
    run_both(model, back, feeds=_attention_feeds(), **EXACT)


def test_a_scale_on_q_leaves_a_soft_caps_division_alone() -> None:
    model = _attention(
        ["qa = Mul (q, a)", "qk = MatMul (qa, kt)", "into = Div (qk, cap)", "capped = Tanh (into)",
         "scores = Mul (capped, cap)"],
        {"a": np.array(0.5, np.float32), "cap": np.array(5.0, np.float32)},
    )  # fmt: skip
    canonical, done, _, _ = _canonical(model)
    assert done == {"scale_to_scores": 1}
    assert _ops(canonical)[:4] == ["MatMul", "Mul", "Div", "Tanh"]


def test_a_soft_caps_division_is_not_a_scale() -> None:
    """Gemma-2 unscaled: ``c * tanh(s / c)``; the Div by c is the cap's, not a scale."""
    model = _attention(
        [
            "qk = MatMul (q, kt)",
            "into = Div (qk, cap)",
            "capped = Tanh (into)",
            "scores = Mul (capped, cap)",
        ],
        {"cap": np.array(5.0, np.float32)},
    )
    canonical, done, _, _ = _canonical(model)
    assert done == {"unit_scale": 1}
    assert _ops(canonical)[:3] == ["MatMul", "Mul", "Div"]
    run_both(model, canonical, feeds=_attention_feeds(), **EXACT)


REPEAT = """<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, 2, seq, 4] kv) => (float[batch, 6, seq, 4] y) {{
    {body}
}}"""
REPEAT_INTS = {
    "axis_2": np.array([2], np.int64),
    "merge": np.array([0, 6, -1, 4], np.int64),
    "repeats": np.array([1, 1, 3, 1, 1], np.int64),
}


def _repeat(body: list[str], inits: dict | None = None) -> onnx.ModelProto:
    return build_model(REPEAT.format(body="\n".join(body)), {**REPEAT_INTS, **(inits or {})})


def _repeat_feeds() -> dict:
    kv = np.random.default_rng(2).standard_normal((2, 2, 5, 4)).astype(np.float32)
    return {"kv": kv}


@pytest.mark.parametrize("by", ["Tile", "Concat"])
def test_kv_heads_repeated_by_tile_or_concat_are_repeated_by_expand(by) -> None:
    repeated = "e = Tile (u, repeats)" if by == "Tile" else "e = Concat <axis = 2> (u, u, u)"
    model = _repeat(["u = Unsqueeze (kv, axis_2)", repeated, "y = Reshape (e, merge)"])
    canonical, done, again, _ = _canonical(model)
    assert done == {"repeat_kv": 1} and again == 0
    assert _ops(canonical) == ["Unsqueeze", "Expand", "Reshape"]
    run_both(model, canonical, feeds=_repeat_feeds(), **EXACT)


def test_a_tile_of_an_axis_longer_than_one_stays() -> None:
    """Tiling heads [h0, h1] gives [h0, h1, h0, h1, ...]: no Expand does that."""
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, seq, 4] kv) => (float[batch, 6, seq, 4] y) {
        y = Tile (kv, repeats)
    }"""
    model = build_model(text, {"repeats": np.array([1, 3, 1, 1], np.int64)})
    assert _canonical(model)[1] == {}


def test_a_gather_of_each_query_heads_kv_head_is_repeat_kv_and_put_back_unused() -> None:
    model = _repeat(
        ["g = Gather <axis = 1> (kv, heads)", "y = Identity (g)"],
        {"heads": np.array([0, 0, 0, 1, 1, 1])},
    )
    canonical, done, again, work = _canonical(model)
    assert done == {"repeat_kv": 1} and again == 0
    assert _ops(canonical) == ["Unsqueeze", "Expand", "Reshape", "Identity"]
    run_both(model, canonical, feeds=_repeat_feeds(), **EXACT)
    assert undo_unused(work.graph)["repeat_kv"] == 1
    restored = ir.to_proto(work)
    assert op_sequence(restored) == ["Gather", "Identity"]
    run_both(model, restored, feeds=_repeat_feeds(), **EXACT)


@pytest.mark.parametrize("heads", [[0, 1, 0, 1, 0, 1], [0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
def test_a_gather_of_heads_in_another_order_stays(heads) -> None:
    model = _repeat(
        ["g = Gather <axis = 1> (kv, heads)", "y = Identity (g)"], {"heads": np.array(heads)}
    )
    assert _canonical(model)[1] == {}


def test_a_gather_of_heads_below_opset_13_stays() -> None:
    """Below opset 13 Unsqueeze takes its axes as an attribute: the rule, which writes
    them as an input, leaves the Gather (an Unsqueeze it wrote would not load)."""
    text = REPEAT.format(body="g = Gather <axis = 1> (kv, heads)\n    y = Identity (g)")
    text = text.replace('opset_import: ["" : 18]', 'opset_import: ["" : 12]')
    model = build_model(text, {"heads": np.array([0, 0, 0, 1, 1, 1])})
    canonical, done, _, _ = _canonical(model)
    assert done == {} and _ops(canonical) == ["Gather", "Identity"]
    onnx.checker.check_model(canonical, full_check=True)


def test_a_masked_fill_no_fusion_took_is_put_back() -> None:
    model = _masked([CAUSAL_BLOCKED, "masked = Where (blocked, lowest, qk)"])
    canonical, done, _, work = _canonical(model)
    assert done == {"mask_as_bias": 1}
    assert undo_unused(work.graph)["mask_as_bias"] == 1
    restored = ir.to_proto(work)
    ops = op_sequence(restored)
    assert ops.count("Where") == 1 and "Add" not in ops and "Greater" not in ops, ops
    run_both(model, restored, feeds=_feeds(), **EXACT)


def _biased(body: list[str], more: str = "", constants: dict | None = None) -> onnx.ModelProto:
    """Rank-4 scores (two heads), a causal mask and a position bias per head (``more``
    inputs and ``constants`` where a case needs them)."""
    inputs = "float[2, 2, 3, 4] q, float[2, 2, 4, 5] kt, float[1, 2, 3, 5] position" + more
    lines = [*INDICES[1:], "scores = MatMul (q, kt)", *body, "y = Softmax <axis = -1> (masked)"]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({inputs}) => (float[2, 2, 3, 5] y) {{
        {chr(10).join(lines)}
    }}"""
    return build_model(text, {**INTS, **(constants or {})})


def _biased_feeds() -> dict:
    rng = np.random.default_rng(3)
    shapes = {"q": (2, 2, 3, 4), "kt": (2, 2, 4, 5), "position": (1, 2, 3, 5)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.mark.parametrize("mask_first", [False, True])
def test_a_position_bias_and_a_mask_added_in_turn_are_summed_first(mask_first) -> None:
    """T5: ``(scores + position) + mask``; the scores take one bias, exactly."""
    first, second = ("bias", "position") if mask_first else ("position", "bias")
    model = _biased(
        [
            "allowed = LessOrEqual (kv_u, q_u)",
            "bias = Where (allowed, zero_f, lowest)",
            f"positioned = Add (scores, {first})",
            f"masked = Add (positioned, {second})",
        ]
    )
    canonical, done, again, _ = _canonical(model)
    assert done == {"one_bias": 1, "unit_scale": 1} and again == 0
    graph = canonical.graph
    (softmax,) = [n for n in graph.node if n.op_type == "Softmax"]
    (last_add,) = [n for n in graph.node if n.output[0] == softmax.input[0]]
    producers = {o: n for n in graph.node for o in n.output}
    assert last_add.op_type == "Add" and producers[last_add.input[1]].op_type == "Add"
    assert producers[last_add.input[0]].op_type == "Mul"  # the unit scale on the scores
    run_both(model, canonical, feeds=_biased_feeds(), **EXACT)


# ``(s + a) + b`` and ``s + (a + b)`` round differently for general a and b: a few units
# in the last place of the logits (here below 8: at most 8 * 2**-24 * 8 = 4e-6 per
# logit, twice that per probability)
REGROUPED = dict(rtol=0, atol=1e-5)


def test_two_biases_neither_a_mask_are_summed_first() -> None:
    """Funnel's ``(scores + positional) + token_type``: one bias, rounding as the fused
    op does (``REGROUPED``); no fusion takes it, so ``undo_unused`` writes the chain
    back exactly as it was (rtol = atol = 0)."""
    model = _biased(
        ["type_bias = Mul (position, one_f)", "positioned = Add (scores, position)"]
        + ["masked = Add (positioned, type_bias)"]
    )
    canonical, done, again, work = _canonical(model)
    assert done == {"one_bias": 1, "unit_scale": 1} and again == 0
    ops = _ops(canonical)
    assert ops.count("Add") == 2 and ops.index("Mul") < ops.index("Add"), ops
    run_both(model, canonical, feeds=_biased_feeds(), **REGROUPED)
    assert undo_unused(work.graph)["one_bias"] == 1
    run_both(model, ir.to_proto(work), feeds=_biased_feeds(), **EXACT)


def test_three_biases_fold_into_one() -> None:
    """``((s + a) + b) + mask``: one Add on the scores, the three biases summed in the
    graph's order."""
    model = _biased(
        [
            "allowed = LessOrEqual (kv_u, q_u)",
            "bias = Where (allowed, zero_f, lowest)",
            "type_bias = Mul (position, one_f)",
            "positioned = Add (scores, position)",
            "typed = Add (positioned, type_bias)",
            "masked = Add (typed, bias)",
        ]
    )
    canonical, done, again, _ = _canonical(model)
    assert done == {"one_bias": 1, "unit_scale": 1} and again == 0
    graph = canonical.graph
    (softmax,) = [n for n in graph.node if n.op_type == "Softmax"]
    producers = {o: n for n in graph.node for o in n.output}
    last_add = producers[softmax.input[0]]
    assert producers[last_add.input[0]].op_type == "Mul"  # the unit scale on the scores
    summed = producers[last_add.input[1]]
    assert summed.input[1] == "bias" and producers[summed.input[0]].input == [
        "position",
        "type_bias",
    ]
    run_both(model, canonical, feeds=_biased_feeds(), **REGROUPED)


def test_a_sum_read_elsewhere_stays() -> None:
    """``s + a`` is also a graph output: it cannot go, so nothing is regrouped."""
    model = _biased(["positioned = Add (scores, position)", "masked = Add (positioned, position)"])
    model.graph.output.append(onnx.helper.make_tensor_value_info("positioned", 1, None))
    assert _canonical(model)[1] == {"unit_scale": 1}


def test_a_constant_bias_holding_an_infinity_stays() -> None:
    """A constant of -inf and 0 that is no mask form: ``inf - inf`` where a general sum
    and it meet could differ, so no finite bias is proven."""
    wall = np.zeros((1, 1, 3, 5), np.float32)
    wall[..., -1] = -np.inf
    model = _biased(
        ["positioned = Add (scores, position)", "masked = Add (positioned, wall)"],
        constants={"wall": wall},
    )
    assert _canonical(model)[1] == {"unit_scale": 1}


@pytest.mark.parametrize("fill", [-1e6, -1e4])
def test_a_finite_mask_of_unbounded_scores_stays(fill) -> None:
    """Scores of graph inputs have no proven bound: Funnel's ``-1e6 * (1 - m)`` beside a
    bias is not proven to absorb them, so it stays apart."""
    model = _biased(
        [
            "pad_u = Unsqueeze (attention_mask, pad_axes)",
            "pad = Cast <to = 1> (pad_u)",
            "inverted = Sub (one_f, pad)",
            "bias = Mul (inverted, finite)",
            "positioned = Add (scores, position)",
            "masked = Add (positioned, bias)",
        ],
        more=", int64[2, 5] attention_mask",
        constants={"finite": np.array(fill, np.float32)},
    )
    assert _canonical(model)[1] == {"unit_scale": 1}


PACKED = """<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, seq, 8] x) => (float[batch, 2, seq, 4] y) {{
    p = MatMul (x, w)
    r = Reshape (p, view)
    {pick}
    y = Transpose <perm = [0, 2, 1, 3]> (part)
}}"""
PACKED_INTS = {
    "view": np.array([0, 0, 3, 2, 4], np.int64),
    "parts_axis": np.array([2], np.int64),
    "index": np.array(1, np.int64),
    "from_1": np.array([1], np.int64),
    "to_2": np.array([2], np.int64),
    "w": np.random.default_rng(4).standard_normal((8, 24)).astype(np.float32),
}


@pytest.mark.parametrize(
    "pick",
    [
        "q, k, v = Split <axis = -3, num_outputs = 3> (r)\n    part = Squeeze (k, parts_axis)",
        "part = Gather <axis = 2> (r, index)",
        "k = Slice (r, from_1, to_2, parts_axis)\n    part = Squeeze (k, parts_axis)",
    ],
    ids=["split", "gather", "slice"],
)
def test_a_part_of_a_packed_projection_viewed_by_parts_is_a_head_split(pick) -> None:
    """ModernBERT: ``Wqkv(x).view(B, S, 3, N, H)``, part 1 (the key) picked."""
    model = build_model(PACKED.format(pick=pick), PACKED_INTS)
    canonical, done, again, _ = _canonical(model)
    assert done == {"packed_heads": 1} and again == 0
    assert _ops(canonical) == ["MatMul", "Slice", "Reshape", "Transpose"]
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 3, 8)).astype(np.float32)}
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_a_pick_on_another_axis_of_the_view_stays() -> None:
    """Picking a head (axis 3) of ``[B, S, 3, N, H]`` is no part of the projection."""
    text = PACKED.format(pick="part = Gather <axis = 3> (r, index)").replace(
        "float[batch, 2, seq, 4] y", "float[batch, seq, 3, 4] y"
    )
    model = build_model(text, PACKED_INTS)
    assert "packed_heads" not in _canonical(model)[1]


def test_a_kt_by_one_transpose_is_the_swap_of_the_key_heads_and_composed_back() -> None:
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 2, 3, 4] q, float[2, 3, 2, 4] k) => (float[2, 2, 3, 3] y) {
        kt = Transpose <perm = [0, 2, 3, 1]> (k)
        qk = MatMul (q, kt)
        scores = Mul (qk, half)
        y = Softmax <axis = -1> (scores)
    }"""
    model = build_model(text, {"half": np.array(0.5, np.float32)})
    canonical, done, again, work = _canonical(model)
    assert done == {"kt_of_heads": 1} and again == 0
    perms = [list(n.attribute[0].ints) for n in canonical.graph.node if n.op_type == "Transpose"]
    assert perms == [[0, 2, 1, 3], [0, 1, 3, 2]]
    rng = np.random.default_rng(6)
    feeds = {
        "q": rng.standard_normal((2, 2, 3, 4)).astype(np.float32),
        "k": rng.standard_normal((2, 3, 2, 4)).astype(np.float32),
    }
    run_both(model, canonical, feeds=feeds, **EXACT)
    assert undo_unused(work.graph)["kt_of_heads"] == 1
    restored = ir.to_proto(work)
    assert op_sequence(restored) == ["Transpose", "MatMul", "Mul", "Softmax"]
    run_both(model, restored, feeds=feeds, **EXACT)


def test_a_transpose_no_attention_reads_stays() -> None:
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 3, 2, 4] k) => (float[2, 2, 4, 3] y) {
        y = Transpose <perm = [0, 2, 3, 1]> (k)
    }"""
    assert _canonical(build_model(text, {}))[1] == {}


IN_BATCH = """<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, 2, 5, 4] q, float[batch, 2, 5, 4] k, float[batch, 2, 5, 4] v,
   bool[batch, 1, 5, 5] keep) => (float[batch, 2, 5, 4] y) {{
    q3 = Reshape (q, fold)
    k3 = Reshape (k, fold)
    v3 = Reshape (v, fold)
    kT3 = Transpose <perm = [0, 2, 1]> (k3)
    scores3 = MatMul (q3, kT3)
    shape = Shape (q)
    batch = Slice (shape, zero, one)
    unfold = Concat <axis = 0> (batch, scores_tail)
    scores = Reshape (scores3, unfold)
    bias = Where (keep, zero_f, {fill})
    masked = Add (scores, bias)
    clamped = Max (masked, lowest)
    masked3 = Reshape (clamped, fold_scores)
    probs3 = Softmax <axis = -1> (masked3)
    context3 = MatMul (probs3, v3)
    unfold_context = Concat <axis = 0> (batch, context_tail)
    context = Reshape (context3, unfold_context)
    y = Neg (context)
}}"""
IN_BATCH_INTS = {
    "fold": np.array([-1, 5, 4], np.int64),
    "fold_scores": np.array([-1, 5, 5], np.int64),
    "scores_tail": np.array([2, 5, 5], np.int64),
    "context_tail": np.array([2, 5, 4], np.int64),
    "zero": np.array([0], np.int64),
    "one": np.array([1], np.int64),
    "zero_f": np.array(0.0, np.float32),
    "lowest": np.array(LOWEST, np.float32),
    "minus_inf": np.array(-np.inf, np.float32),
}


def _in_batch_feeds() -> dict:
    rng = np.random.default_rng(7)
    keep = rng.random((3, 1, 5, 5)) < 0.7
    keep[2, :, 1] = False  # a row with nothing to attend to
    shapes = {"q": (3, 2, 5, 4), "k": (3, 2, 5, 4), "v": (3, 2, 5, 4)}
    return {
        **{n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()},
        "keep": keep,
    }


def _in_batch_canonical(fill: str):
    """The graph through the pre-passes' shape inference (ORT's symbolic one names the
    folded batch ``2*batch``), then the canonical form."""
    model = build_model(IN_BATCH.format(fill=fill), IN_BATCH_INTS)
    result = optimize_quiet(model, target="onnxruntime", patterns=[])
    return model, result


def test_attention_over_heads_folded_into_the_batch_is_computed_per_head() -> None:
    """XGLM: bmm over [B * N, S, H], the mask on the unfolded scores, clamped at lowest."""
    model, result = _in_batch_canonical("lowest")
    canonical = result.to_proto()
    ops = _ops(canonical)
    # both products and the Softmax 4-D; the folds gone with them; the clamp gone
    assert ops.count("Reshape") == 0 and "Max" not in ops, ops
    assert [
        list(n.attribute[0].ints) for n in canonical.graph.node if n.op_type == "Transpose"
    ] == [[0, 1, 3, 2]]
    run_both(model, canonical, feeds=_in_batch_feeds(), **EXACT)


def test_a_clamp_of_a_mask_that_may_be_minus_inf_stays() -> None:
    """``Max(s + -inf, lowest)`` is lowest, not -inf: a fully masked row softmaxes to a
    uniform row with the clamp and to NaN without it."""
    model, result = _in_batch_canonical("minus_inf")
    canonical = result.to_proto()
    assert "Max" in _ops(canonical)
    run_both(model, canonical, feeds=_in_batch_feeds(), **EXACT)


def test_a_split_that_is_a_graph_output_stays() -> None:
    """The graph's output keeps its producer: the rule rewrites only inner values."""
    text = IN_BATCH.format(fill="lowest").replace(
        "context = Reshape (context3, unfold_context)\n    y = Neg (context)",
        "y = Reshape (context3, unfold_context)",
    )
    model = build_model(text, IN_BATCH_INTS)
    fused = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    assert fused.graph.node[-1].op_type == "Reshape"
    run_both(model, fused, feeds=_in_batch_feeds(), **EXACT)


def test_a_fold_and_its_unfold_in_a_row_are_no_op() -> None:
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, 5, 4] x) => (float[batch, 2, 5, 4] y) {
        folded = Reshape (x, fold)
        shape = Shape (x)
        unfolded = Reshape (folded, shape)
        y = Neg (unfolded)
    }"""
    model = build_model(text, {"fold": np.array([-1, 5, 4], np.int64)})
    fused = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    assert _ops(fused) == ["Neg"]
    run_both(model, fused, feeds={"x": _in_batch_feeds()["q"]}, **EXACT)


def test_two_reshapes_that_end_in_another_shape_stay() -> None:
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, 5, 4] x) => (float[batch, 5, 2, 4] y) {
        folded = Reshape (x, fold)
        unfolded = Reshape (folded, other)
        y = Neg (unfolded)
    }"""
    inits = {"fold": np.array([-1, 5, 4], np.int64), "other": np.array([-1, 5, 2, 4], np.int64)}
    model = build_model(text, inits)
    fused = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    assert _ops(fused).count("Reshape") >= 1


ALIBI = """    scaled3 = Mul (scores3, alpha)
    alibi_shape = Concat <axis = 0> (batch, heads_keys)
    alibi_b = Expand (slopes, alibi_shape)
    alibi3 = Reshape (alibi_b, alibi_fold)
    biased3 = Add (scaled3, alibi3)
    scores = Reshape (biased3, unfold)"""
ALIBI_INTS = {
    **IN_BATCH_INTS,
    "alpha": np.array(0.5, np.float32),
    "heads_keys": np.array([2, 5], np.int64),
    "alibi_fold": np.array([-1, 1, 5], np.int64),
    # ALiBi: each head's slope times the key position
    "slopes": (np.array([[0.5], [0.25]]) * np.arange(5)).astype(np.float32),
}


def test_a_scale_and_a_folded_bias_between_the_product_and_the_unfold_move_after_it() -> None:
    """BLOOM: ``baddbmm(alibi, Q, K^T, alpha)`` on the folded heads, ALiBi ``[B * N, 1,
    L]``: the scale and the bias (unfolded the same way) come after the unfold, exactly
    (the unseen-families survey fuses BLOOM's whole block: docs/benchmarks.md)."""
    text = IN_BATCH.format(fill="lowest").replace("    scores = Reshape (scores3, unfold)", ALIBI)
    model = build_model(text, ALIBI_INTS)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    ops = _ops(canonical)
    # the products and the Softmax 4-D; the Reshapes left fold the ALiBi bias (the
    # model's) and unfold it for the scores (the rule's)
    assert ops.count("Reshape") == 2 and ops.count("MatMul") == 2, ops
    producer = {o: n for n in canonical.graph.node for o in n.output}
    softmax = next(n for n in canonical.graph.node if n.op_type == "Softmax")
    chain, node = [], producer[softmax.input[0]]
    while node.op_type != "MatMul":
        chain.append(node.op_type)
        node = producer[node.input[0]]
    # the scale and then one bias on the 4-D scores: ALiBi and the mask summed (one_bias)
    assert chain == ["Add", "Mul"], chain
    assert producer[producer[softmax.input[0]].input[1]].op_type == "Add"
    run_both(model, canonical, feeds=_in_batch_feeds(), **EXACT)


def test_a_folded_bias_whose_rows_are_not_proven_the_scores_stays() -> None:
    """A bias read from an input of unknown leading size may hold one row for all: the
    unfold would not be the scores' (the Add stays between the product and the unfold)."""
    text = (
        IN_BATCH.format(fill="lowest")
        .replace(
            "bool[batch, 1, 5, 5] keep)", "bool[batch, 1, 5, 5] keep, float[rows, 1, 5] alibi3)"
        )
        .replace(
            "    scores = Reshape (scores3, unfold)",
            "    biased3 = Add (scores3, alibi3)\n    scores = Reshape (biased3, unfold)",
        )
    )
    model = build_model(text, IN_BATCH_INTS)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    add = next(n for n in canonical.graph.node if "alibi3" in n.input)
    assert add.op_type == "Add"
    producer = {o: n for n in canonical.graph.node for o in n.output}[add.input[0]]
    assert producer.op_type == "MatMul"
    feeds = {**_in_batch_feeds(), "alibi3": np.ones((6, 1, 5), np.float32)}
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_a_scale_of_the_folded_key_moves_with_the_product_and_onto_the_scores() -> None:
    """DeBERTa: ``bmm(q3, Transpose(k3) / sqrt(H * f))`` over folded heads. The Div of
    the folded K^T is the same Div of the unfolded one (``heads_in_batch``), and a Div
    by ``c`` is a Mul of the scores by ``1 / c`` (``scale_to_scores``, which rounds the
    factor once: rtol 1e-6); with no fusion to take it, the Div comes back as written."""
    text = IN_BATCH.format(fill="lowest").replace(
        "    scores3 = MatMul (q3, kT3)",
        "    kT3s = Div (kT3, root)\n    scores3 = MatMul (q3, kT3s)",
    )
    model = build_model(text, {**IN_BATCH_INTS, "root": np.array(2.5, np.float32)})
    canonical, done, again, work = _canonical(model)
    assert done.get("heads_in_batch", 0) >= 2 and done.get("scale_to_scores") == 1, done
    assert again == 0
    ops = _ops(canonical)
    assert "Div" not in ops and ops.count("MatMul") == 2, ops
    mul = next(n for n in canonical.graph.node if n.op_type == "Mul")
    factor = next(i for i in canonical.graph.initializer if i.name == mul.input[1])
    assert onnx.numpy_helper.to_array(factor) == np.float32(1 / np.float32(2.5))
    run_both(model, canonical, feeds=_in_batch_feeds(), rtol=1e-6, atol=1e-6)
    assert undo_unused(work.graph)["scale_to_scores"] == 1
    back = ir.to_proto(work)
    assert "Div" in _ops(back), _ops(back)
    run_both(model, back, feeds=_in_batch_feeds(), **EXACT)


def test_shape_reads_of_the_folded_context_read_the_unfolded_one() -> None:
    """TorchScript's BLOOM: the context product ``[B * N, S, H]`` is also read by Shape
    nodes that build its unfold's target and another Reshape's. They read the shape of
    the unfolded product folded back (``[B * N, S, H]`` from ``[B, N, S, H]``), and the
    product is computed per head: no fold is left on the context."""
    text = (
        IN_BATCH.format(fill="lowest")
        .replace(
            "    unfold_context = Concat <axis = 0> (batch, context_tail)\n",
            "    context_shape = Shape (context3)\n"
            "    rows = Gather <axis = 0> (context_shape, zero_i)\n"
            "    heads_n = Div (rows, batch_scalar)\n"
            "    heads_u = Unsqueeze (heads_n, zero)\n"
            "    unfold_context = Concat <axis = 0> (batch, heads_u, tail)\n"
            "    other_shape = Shape (context3)\n",
        )
        .replace(
            "    y = Neg (context)",
            "    y = Neg (context)\n    other_f = Cast <to = 1> (other_shape)\n"
            "    z = Mul (other_f, two_f)",
        )
        .replace("=> (float[batch, 2, 5, 4] y)", "=> (float[batch, 2, 5, 4] y, float[3] z)")
        .replace(
            "    batch = Slice (shape, zero, one)",
            "    batch = Slice (shape, zero, one)\n    batch_scalar = Squeeze (batch, zero)",
        )
    )
    ints = {
        **IN_BATCH_INTS,
        "zero_i": np.array(0, np.int64),
        "tail": np.array([5, 4], np.int64),
        "two_f": np.array(2.0, np.float32),
    }
    model = build_model(text, ints)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    producer = {o: n for n in canonical.graph.node for o in n.output}
    context = producer[producer["y"].input[0]]
    assert context.op_type == "MatMul", context.op_type  # per head, no unfold after it
    run_both(model, canonical, feeds=_in_batch_feeds(), **EXACT)


def test_a_folded_bias_scaled_by_a_scalar_is_still_a_fold() -> None:
    """TorchScript writes baddbmm's ``beta * alibi``: a scalar scale of the fold keeps
    its rows the fold's."""
    text = IN_BATCH.format(fill="lowest").replace(
        "    scores = Reshape (scores3, unfold)",
        ALIBI.replace(
            "    biased3 = Add (scaled3, alibi3)",
            "    beta3 = Mul (alibi3, beta)\n    biased3 = Add (scaled3, beta3)",
        ),
    )
    model = build_model(text, {**ALIBI_INTS, "beta": np.array(1.0, np.float32)})
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    assert _ops(canonical).count("MatMul") == 2
    producer = {o: n for n in canonical.graph.node for o in n.output}
    softmax = next(n for n in canonical.graph.node if n.op_type == "Softmax")
    assert producer[softmax.input[0]].op_type == "Add"  # 4-D scores, no unfold before it
    run_both(model, canonical, feeds=_in_batch_feeds(), **EXACT)


BIGCODE = """<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, seq, 8] x) => ({q_out} q, float[batch, 2, seq, 4] k) {{
    p = MatMul (x, w)
    pu = Unsqueeze (p, axis_1)
    qp, kp, vp = Split <axis = 3> (pu, parts)
    shape = Shape (x)
    b = Gather <axis = 0> (shape, zero)
    s = Gather <axis = 0> (shape, one)
    target = Concat <axis = 0> ({lead})
    qr = Reshape (qp, target)
    q = Transpose <perm = [0, 2, 1, 3]> (qr)
    ku = Unsqueeze (kp, axis_2)
    ke = Expand (ku, repeat)
    k = Reshape (ke, merge)
    vo = Neg (vp)
}}"""
BIGCODE_INTS = {
    "w": np.random.default_rng(8).standard_normal((8, 16)).astype(np.float32),
    "axis_1": np.array([1], np.int64),
    "axis_2": np.array([2], np.int64),
    "parts": np.array([8, 4, 4], np.int64),
    "zero": np.array([0], np.int64),
    "one": np.array([1], np.int64),
    "heads_tail": np.array([2, 4], np.int64),
    "repeat": np.array([1, 1, 2, 1, 1], np.int64),
    "merge": np.array([0, 2, -1, 4], np.int64),
    "copy_1": np.array([0], np.int64),
    "rest": np.array([-1, 4], np.int64),
}


def _bigcode(lead: str, q_out: str = "float[batch, 2, seq, 4]") -> onnx.ModelProto:
    text = BIGCODE.format(lead=lead, q_out=q_out)
    text = text.replace("=> (", "=> (float[batch, 1, seq, 4] vo, ")
    return build_model(text, BIGCODE_INTS)


def test_gpt_bigcodes_unsqueezed_split_becomes_head_splits() -> None:
    """``qkv.unsqueeze(1).split(...)``: q's Reshape reads the part itself, the key's one
    head is a one-head split that repeat_kv repeats; put back where no fusion took it."""
    model = _bigcode("b, s, heads_tail")
    canonical, done, again, work = _canonical(model)
    # the split, q's Reshape, k's and v's one-head splits; then q's target copies the
    # part's batch and sequence (copied_dims)
    assert done == {"one_kv_head": 4, "copied_dims": 1} and again == 0
    ops = _ops(canonical)
    assert ops[:2] == ["MatMul", "Split"] and ops.count("Unsqueeze") == 1, ops  # repeat_kv's
    feeds = {"x": np.random.default_rng(9).standard_normal((2, 3, 8)).astype(np.float32)}
    run_both(model, canonical, feeds=feeds, **EXACT)
    assert undo_unused(work.graph)["one_kv_head"] == 2
    run_both(model, ir.to_proto(work), feeds=feeds, **EXACT)


def test_a_reshape_that_copies_a_dimension_of_the_unsqueezed_part_stays_on_it() -> None:
    """A 0 entry copies a dimension of the Unsqueeze's output (its 1), not of the part."""
    # [B, 1, S, 8] -> [B, 1, 2 S, 4]: the 0 copies the 1, which the part does not have
    model = _bigcode("b, copy_1, rest", q_out="float[batch, q2, 1, 4]")
    canonical, done, _, _ = _canonical(model)
    assert done.get("one_kv_head", 0) == 3  # the split and the two one-head splits only
    feeds = {"x": np.random.default_rng(9).standard_normal((2, 3, 8)).astype(np.float32)}
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_a_bias_sliced_to_a_computed_length_sums_to_the_scores_shape() -> None:
    """MPT's ALiBi is a table ``[heads, 1, max]`` sliced to ``max - Max(0, max - L)`` keys
    beside a mask of ``L`` keys: not known to agree, but both are added to scores of
    ``L`` keys, which works only where the slice has ``L`` (or 1), so their sum has the
    scores' shape (the attention rewriters read the bias's rank and dimensions)."""
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[b, 2, s, 4] q, float[b, 2, 4, k] kt, float[2, 1, kp] position,
       bool[b, 1, s, k] allowed) => (float[b, 2, s, k] y) {
        scores = MatMul (q, kt)
        bias = Where (allowed, zero_f, lowest)
        positioned = Add (scores, position)
        masked = Add (positioned, bias)
        y = Softmax <axis = -1> (masked)
    }"""
    model = build_model(text, INTS)
    # what the pipeline's symbolic shape inference knows of the scores plus both biases
    # (onnx's own leaves the broadcast of k and kp unknown)
    scored = onnx.helper.make_tensor_value_info(
        "masked", onnx.TensorProto.FLOAT, ["b", 2, "s", "k"]
    )
    model.graph.value_info.append(scored)
    _, done, _, graph = _canonical(model)
    assert done.get("one_bias") == 1, done
    (summed,) = [n for n in graph.graph if n.name.startswith("one_bias_biases")]
    assert [str(d) for d in summed.outputs[0].shape] == ["b", "2", "s", "k"]
    rng = np.random.default_rng(5)
    feeds = {
        "q": rng.standard_normal((2, 2, 3, 4)).astype(np.float32),
        "kt": rng.standard_normal((2, 2, 4, 5)).astype(np.float32),
        "position": rng.standard_normal((2, 1, 5)).astype(np.float32),
        "allowed": rng.random((2, 1, 3, 5)) > 0.3,
    }
    run_both(model, _canonical(model)[0], feeds=feeds, **EXACT)
