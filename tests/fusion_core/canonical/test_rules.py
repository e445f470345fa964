"""Each rule of the canonical form on a small graph: what it rewrites, what it leaves,
that it changes no value (onnxruntime, optimizations off, rtol = atol = 0: the rules
only move, copy or re-view data, and the scalars they fold are the ones the graph
computes), and that a second run changes nothing."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import MARK, canonical_form, undo_unused
from autofusion.fusion_core.testing import (
    build_model,
    canonical_twice,
    op_sequence,
    optimize_quiet,
    run_both,
)

EXACT = dict(rtol=0, atol=0)
INTS = {
    "zero": np.array([0], np.int64),
    "axis_last": np.array([-1], np.int64),
    "heads_axis": np.array([2], np.int64),
    "last": np.array([-1], np.int64),
}


def _canonical(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict, int]:
    """The model in canonical form, the rules that applied, and what a second run did."""
    return canonical_twice(model)[:3]


def _model(
    body: list[str], inputs: str, outputs: str, inits: dict, opset: int = 18
) -> onnx.ModelProto:
    ir_version = 8 if opset <= 18 else 10
    text = f"""<ir_version: {ir_version}, opset_import: ["" : {opset}]>
    g ({inputs}) => ({outputs}) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, {**INTS, **inits})


def test_a_per_head_op_before_the_transpose_gets_a_merge_and_split_pair() -> None:
    model = _model(
        [
            "r = Reshape (x, split)",
            "n = Mul (r, gamma)",
            "y = Transpose <perm = [0, 2, 1, 3]> (n)",
        ],
        "float[batch, seq, 32] x",
        "float[batch, 4, seq, 8] y",
        {"split": np.array([0, 0, 4, 8], np.int64), "gamma": np.linspace(0.5, 1.5, 8)},
    )
    canonical, done, again = _canonical(model)
    assert done == {"head_split": 1} and again == 0
    assert op_sequence(canonical) == ["Reshape", "Mul", "Reshape", "Reshape", "Transpose"]
    marks = [onnx.helper.printable_node(n) for n in canonical.graph.node if n.metadata_props]
    assert len(marks) == 2
    run_both(model, canonical, **EXACT)


def test_no_pair_where_the_transpose_merges_the_heads_of_a_matmul() -> None:
    """``Transpose(P @ V)`` has no head split above it through per-head ops."""
    model = _model(
        ["c = MatMul (p, v)", "y = Transpose <perm = [0, 2, 1, 3]> (c)"],
        "float[2, 4, 8, 8] p, float[2, 4, 8, 8] v",
        "float[2, 8, 4, 8] y",
        {},
    )
    assert _canonical(model)[1] == {}


def test_a_pair_no_fusion_took_is_undone() -> None:
    model = _model(
        [
            "r = Reshape (x, split)",
            "n = Mul (r, gamma)",
            "y = Transpose <perm = [0, 2, 1, 3]> (n)",
        ],
        "float[batch, seq, 32] x",
        "float[batch, 4, seq, 8] y",
        {"split": np.array([0, 0, 4, 8], np.int64), "gamma": np.linspace(0.5, 1.5, 8)},
    )
    work = ir.from_proto(onnx.shape_inference.infer_shapes(model))
    counter = itertools.count()
    canonical_form(work.graph, lambda hint: f"{hint}__{next(counter)}")
    assert undo_unused(work.graph)["head_split"] == 1
    assert [n.op_type for n in work.graph] == ["Reshape", "Mul", "Transpose"]
    assert not any(MARK in n.metadata_props for n in work.graph)
    # and through the pipeline: nothing fuses here, so the model comes out as it went in
    result = optimize_quiet(model, target="onnxruntime")
    assert op_sequence(result.to_proto()) == op_sequence(model)


@pytest.mark.parametrize("spelling", ["slice", "split"])
def test_parts_of_one_projection_per_head_are_sliced_before_the_transpose(spelling) -> None:
    slices = (
        ["q, k, v = Split <axis = -1> (t, parts)"]
        if spelling == "split"
        else [
            "q = Slice (t, zero, eight, axis_last)",
            "k = Slice (t, eight, sixteen, axis_last)",
            "v = Slice (t, sixteen, big, axis_last)",
        ]
    )
    model = _model(
        [
            "r = Reshape (x, split)",
            "t = Transpose <perm = [0, 2, 1, 3]> (r)",
            *slices,
            "qo = Neg (q)",
            "ko = Neg (k)",
            "vo = Neg (v)",
        ],
        "float[batch, seq, 96] x",
        "float[batch, 4, seq, 8] qo, float[batch, 4, seq, 8] ko, float[batch, 4, seq, 8] vo",
        {
            "split": np.array([0, 0, 4, 24], np.int64),
            "parts": np.array([8, 8, 8], np.int64),
            "eight": np.array([8], np.int64),
            "sixteen": np.array([16], np.int64),
            "big": np.array([1 << 40], np.int64),
        },
    )
    canonical, done, again = _canonical(model)
    assert done["slice_before_transpose"] == (1 if spelling == "split" else 3)
    assert again == 0
    assert op_sequence(canonical).count("Transpose") == 3
    run_both(model, canonical, **EXACT)


def test_a_rotary_half_slice_of_a_transposed_head_stays() -> None:
    """The Transpose is read whole too (``x * cos``): its slices are halves of a head,
    not parts of a projection."""
    model = _model(
        [
            "r = Reshape (x, split)",
            "t = Transpose <perm = [0, 2, 1, 3]> (r)",
            "lo = Slice (t, zero, four, axis_last)",
            "c = Mul (t, two)",
        ],
        "float[batch, seq, 32] x",
        "float[batch, 4, seq, 4] lo, float[batch, 4, seq, 8] c",
        {
            "split": np.array([0, 0, 4, 8], np.int64),
            "four": np.array([4], np.int64),
            "two": np.array(2.0, np.float32),
        },
    )
    assert "slice_before_transpose" not in _canonical(model)[1]


def test_slices_and_gathers_of_heads_become_head_splits_of_their_own() -> None:
    """Falcon's multi-query projection: 4 query heads, one key and one value head."""
    model = _model(
        [
            "r = Reshape (x, split)",
            "q = Slice (r, zero, four, heads_axis)",
            "k = Gather <axis = 2> (r, index_k)",
            "v = Gather <axis = 2> (r, index_v)",
            "v_flat = Gather <axis = 2> (r, scalar_v)",
            "qo = Neg (q)",
            "ko = Neg (k)",
            "vo = Neg (v)",
            "v_flat_o = Neg (v_flat)",
        ],
        "float[batch, seq, 48] x",
        "float[batch, seq, 4, 8] qo, float[batch, seq, 1, 8] ko, float[batch, seq, 1, 8] vo, "
        "float[batch, seq, 8] v_flat_o",
        {
            "split": np.array([0, 0, 6, 8], np.int64),
            "four": np.array([4], np.int64),
            "index_k": np.array([4], np.int64),
            "index_v": np.array([-1], np.int64),
            "scalar_v": np.array(5, np.int64),
        },
    )
    canonical, done, again = _canonical(model)
    assert done == {"heads_by_slice": 4} and again == 0
    assert "Gather" not in op_sequence(canonical)
    run_both(model, canonical, **EXACT)


def test_a_gather_of_heads_out_of_order_stays() -> None:
    model = _model(
        ["r = Reshape (x, split)", "kv = Gather <axis = 2> (r, picked)"],
        "float[batch, seq, 48] x",
        "float[batch, seq, 2, 8] kv",
        {"split": np.array([0, 0, 6, 8], np.int64), "picked": np.array([5, 4], np.int64)},
    )
    assert _canonical(model)[1] == {}


def test_a_scale_from_the_head_size_becomes_a_constant() -> None:
    model = _model(
        [
            "s = Shape (q)",
            "size = Gather <axis = 0> (s, three)",
            "size_f = Cast <to = 1> (size)",
            "root = Sqrt (size_f)",
            "scale = Div (one, root)",
            "y = Mul (q, scale)",
        ],
        "float[batch, 4, seq, 8] q",
        "float[batch, 4, seq, 8] y",
        {"three": np.array(3, np.int64), "one": np.array(1.0, np.float32)},
    )
    canonical, done, again = _canonical(model)
    # Gather, Cast, Sqrt and Div; the Shape itself reads the batch
    assert done == {"known_scalars": 4} and again == 0
    assert op_sequence(canonical) == ["Mul"]
    (scale,) = [t for t in canonical.graph.initializer if t.name.startswith("scale")]
    assert onnx.numpy_helper.to_array(scale) == pytest.approx(8**-0.5, rel=1e-7)
    run_both(model, canonical, **EXACT)


def test_a_head_size_sliced_and_squeezed_becomes_a_constant() -> None:
    """DeBERTa's TorchScript export: ``sqrt(float(Squeeze(Slice(Shape(q), -1))))``."""
    model = _model(
        [
            "s = Shape (q)",
            "tail_dim = Slice (s, minus_one, end)",
            "size = Squeeze (tail_dim, axis0)",
            "size_f = Cast <to = 1> (size)",
            "root = Sqrt (size_f)",
            "y = Div (q, root)",
        ],
        "float[batch, 4, seq, 16] q",
        "float[batch, 4, seq, 16] y",
        {
            "minus_one": np.array([-1], np.int64),
            "end": np.array([4], np.int64),
            "axis0": np.array([0], np.int64),
        },
    )
    canonical, done, again = _canonical(model)
    assert done.get("known_scalars", 0) >= 3 and again == 0, done
    assert op_sequence(canonical) == ["Div"]
    run_both(model, canonical, **EXACT)


def test_a_size_that_depends_on_the_batch_stays() -> None:
    model = _model(
        ["s = Shape (q)", "b = Gather <axis = 0> (s, first)", "y = Cast <to = 1> (b)"],
        "float[batch, 4] q",
        "float y",
        {"first": np.array(0, np.int64)},
    )
    assert _canonical(model)[1] == {}


def test_a_reshape_to_its_own_shape_goes() -> None:
    model = _model(
        ["s = Shape (t)", "r = Reshape (t, s)", "y = Mul (r, two)"],
        "float[batch, 4, seq, 8] t",
        "float[batch, 4, seq, 8] y",
        {"two": np.array(2.0, np.float32)},
    )
    canonical, done, again = _canonical(model)
    assert done == {"identity_reshape": 1} and again == 0
    assert "Reshape" not in op_sequence(canonical)
    run_both(model, canonical, **EXACT)


def test_a_reshape_that_changes_the_shape_stays() -> None:
    model = _model(
        ["r = Reshape (t, flat)"],
        "float[batch, 4, 8] t",
        "float[batch, 32] r",
        {"flat": np.array([0, 32], np.int64)},
    )
    assert _canonical(model)[1] == {}


def test_a_slice_that_keeps_the_whole_shape_goes() -> None:
    """The eager mask's ``mask[:, :, :, : key_length]`` of a mask as long as the keys."""
    model = _model(
        ["m = Slice (mask, zero, end, last)"],
        "float[batch, 1, 5, 5] mask",
        "float[batch, 1, 5, 5] m",
        {"end": np.array([1 << 40], np.int64)},
    )
    model.graph.node.append(onnx.helper.make_node("Neg", ["m"], ["m_out"]))
    model.graph.output[0].name = "m_out"
    canonical, done, again = _canonical(model)
    assert done.get("identity_slice") == 1 and again == 0
    assert op_sequence(canonical) == ["Neg"]
    run_both(model, canonical, **EXACT)


def _padded_rows() -> onnx.ModelProto:
    """Heads padded to a multiple of 4 rows, worked on per chunk, cut back to the first S
    rows: the Slice's end is S, its input P >= S rows, which onnxruntime's symbolic
    inference cannot compare and "treats as equal" (Kimi's delta attention)."""
    body = [
        "x4 = Reshape (x, heads)", "xt = Transpose <perm = [0, 2, 1, 3]> (x4)",
        "xs = Shape (x)", "s1 = Slice (xs, one, two_axis)", "b1 = Slice (xs, zero, one)",
        "rem = Mod (s1, chunk)", "gap = Sub (chunk, rem)", "pad_n = Mod (gap, chunk)",
        "pads = ScatterElements <axis = 0> (pads0, pad_at, pad_n)", "padded = Pad (xt, pads)",
        "t5 = Concat <axis = 0> (b1, hh, minus1, chunk, dd)", "chunks = Reshape (padded, t5)",
        "work = Mul (chunks, two)", "t4 = Concat <axis = 0> (b1, hh, minus1, dd)",
        "rows = Reshape (work, t4)", "kept = Slice (rows, zero, s1, two_axis)",
        "y = Transpose <perm = [0, 2, 1, 3]> (kept)",
    ]  # fmt: skip
    ints = {"heads": [0, 0, 2, 4], "two_axis": [2], "chunk": [4], "pads0": [0] * 8,
            "pad_at": [6], "minus1": [-1], "hh": [2], "dd": [4], "one": [1]}  # fmt: skip
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two": np.float32(2.0)}
    return _model(body, "float[batch, sequence, 8] x", "float[batch, sequence, 2, 4] y", inits)


def test_a_slice_cutting_padded_rows_back_stays_at_every_length() -> None:
    """The Slice is whole at the lengths that are a multiple of the chunk only: dropping
    it (from its output's inferred shape) hands out P rows for S elsewhere."""
    model = _padded_rows()
    fused = optimize_quiet(model, target="onnxruntime").to_proto()
    for length in (3, 4, 5):  # the shapes differ first
        feeds = {"x": np.random.default_rng(length).standard_normal((1, length, 8), np.float32)}
        run_both(model, fused, feeds=feeds, **EXACT)


@pytest.mark.parametrize("steps", [[1], [-1]])
def test_a_slice_that_shortens_or_reverses_stays(steps) -> None:
    """A reversed slice keeps the shape and changes the order: not an identity."""
    model = _model(
        ["m = Slice (t, begin, end, last, step)", "y = Neg (m)"],
        "float[2, 6] t",
        f"float[2, {6 if steps == [-1] else 4}] y",
        {
            "begin": np.array([0 if steps == [1] else -1], np.int64),
            "end": np.array([4 if steps == [1] else -(1 << 40)], np.int64),
            "step": np.array(steps, np.int64),
        },
    )
    assert "identity_slice" not in _canonical(model)[1]


def test_the_features_a_partial_rotary_passes_through_stay_on_the_whole_head() -> None:
    """Phi's ``cat((rotated(q[..., :r]), q[..., r:]), -1)``: parts joined back as they
    are, which the partial rotary pattern reads on the whole head."""
    model = _model(
        [
            "r = Reshape (x, split)",
            "t = Transpose <perm = [0, 2, 1, 3]> (r)",
            "rot = Slice (t, zero, four, axis_last)",
            "keep = Slice (t, four, big, axis_last)",
            "turned = Neg (rot)",
            "y = Concat <axis = -1> (turned, keep)",
        ],
        "float[batch, seq, 32] x",
        "float[batch, 4, seq, 8] y",
        {
            "split": np.array([0, 0, 4, 8], np.int64),
            "four": np.array([4], np.int64),
            "big": np.array([1 << 40], np.int64),
        },
    )
    moved = {"slice_before_transpose", "slice_before_transpose_of_one"}
    assert not moved & set(_canonical(model)[1])


_NORM_AFTER_TRANSPOSE = {
    "LayerNormalization": "n = LayerNormalization <axis = {axis}> (t, gamma, beta)",
    "RMSNormalization": "n = RMSNormalization <axis = {axis}> (t, gamma)",
}


@pytest.mark.parametrize("norm", sorted(_NORM_AFTER_TRANSPOSE))
def test_a_norm_of_each_head_after_the_head_transpose_moves_before_it(norm) -> None:
    """Gemma-3's ``q_norm(q.view(..).transpose(1, 2))``: the norm moves above the
    Transpose, and ``head_split`` then gives the heads their merge/split pair."""
    model = _model(
        [
            "r = Reshape (x, split)",
            "t = Transpose <perm = [0, 2, 1, 3]> (r)",
            _NORM_AFTER_TRANSPOSE[norm].format(axis=-1),
            "y = Mul (n, two)",
        ],
        "float[batch, seq, 32] x",
        "float[batch, 4, seq, 8] y",
        {
            "split": np.array([0, 0, 4, 8], np.int64),
            "gamma": np.linspace(0.5, 1.5, 8).astype(np.float32),
            "beta": np.linspace(-0.3, 0.2, 8).astype(np.float32),
            "two": np.array(2.0, np.float32),
        },
        opset=23,  # RMSNormalization
    )
    canonical, done, again = _canonical(model)
    assert done == {"transpose_after_norm": 1, "head_split": 1} and again == 0
    assert op_sequence(canonical) == ["Reshape", norm, "Reshape", "Reshape", "Transpose", "Mul"]
    run_both(model, canonical, **EXACT)


def test_a_norm_over_the_heads_axis_stays_after_the_transpose() -> None:
    model = _model(
        [
            "r = Reshape (x, split)",
            "t = Transpose <perm = [0, 2, 1, 3]> (r)",
            "n = LayerNormalization <axis = 1> (t, gamma, beta)",
        ],
        "float[2, 3, 32] x",
        "float[2, 4, 3, 8] n",
        {
            "split": np.array([0, 0, 4, 8], np.int64),
            "gamma": np.ones((4, 3, 8), np.float32),
            "beta": np.zeros((4, 3, 8), np.float32),
        },
    )
    assert _canonical(model)[1] == {}


def test_a_rotary_of_transposed_heads_rotates_the_projection() -> None:
    """A RotaryEmbedding fused on ``[B, N, S, H]`` heads: its 3-D form on the
    ``[B, S, N * H]`` projection, then the head split, then the Transpose."""
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 3, (16, 4)).astype(np.float32)
    text = """<ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
    g (float[batch, seq, 32] x, int64[batch, seq] pos) => (float[batch, 4, seq, 8] y) {
        r = Reshape (x, split)
        t = Transpose <perm = [0, 2, 1, 3]> (r)
        ro = com.microsoft.RotaryEmbedding (t, pos, cos, sin)
        y = Neg (ro)
    }"""
    inits = {
        "split": np.array([0, 0, 4, 8], np.int64),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
    }
    model = build_model(text, inits)
    canonical, done, again = _canonical(model)
    assert done == {"transpose_after_rotary": 1} and again == 0
    assert op_sequence(canonical) == [
        "Reshape",
        "Reshape",
        "com.microsoft::RotaryEmbedding",
        "Reshape",
        "Transpose",
        "Neg",
    ]
    rotary = next(n for n in canonical.graph.node if n.op_type == "RotaryEmbedding")
    assert {a.name: a.i for a in rotary.attribute}["num_heads"] == 4
    feeds = {
        "x": rng.standard_normal((2, 5, 32)).astype(np.float32),
        "pos": np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], np.int64),
    }
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_a_gather_of_q_k_or_v_from_heads_of_three_is_a_head_split() -> None:
    """Persimmon's fused projection ``Reshape(qkv, [B, S, N, 3, H])[:, :, :, 2]``, then
    a per-head op and the Transpose: the value heads get their merge/split pair."""
    model = _model(
        [
            "r = Reshape (x, split)",
            "v = Gather <axis = 3> (r, two)",
            "n = Mul (v, gamma)",
            "y = Transpose <perm = [0, 2, 1, 3]> (n)",
        ],
        "float[batch, seq, 96] x",
        "float[batch, 4, seq, 8] y",
        {
            "split": np.array([0, 0, 4, 3, 8], np.int64),
            "two": np.array(2, np.int64),
            "gamma": np.linspace(0.5, 1.5, 8).astype(np.float32),
        },
    )
    canonical, done, again = _canonical(model)
    assert done == {"head_split": 1} and again == 0
    run_both(model, canonical, **EXACT)


def _split_scale_model(with_softmax: bool) -> onnx.ModelProto:
    tail = ["p = Softmax <axis = -1> (masked)"] if with_softmax else ["p = Identity (masked)"]
    return _model(
        [
            "qs = Mul (q, a)",
            "kts = Mul (b, kt)",
            "scores = MatMul (qs, kts)",
            "masked = Add (scores, bias)",
            *tail,
        ],
        "float[2, 4, 5, 8] q, float[2, 4, 8, 5] kt, float[2, 1, 5, 5] bias",
        "float[2, 4, 5, 5] p",
        {"a": np.array(8**-0.25, np.float32), "b": np.array(8**-0.25, np.float32)},
    )


def test_a_scale_split_over_q_and_k_moves_onto_the_scores() -> None:
    """SDPA's ``Mul(Q, s) @ Mul(s, K^T)`` becomes ``(Q @ K^T) * s * s``: one rounding of
    the product instead of one per operand, hence rtol = atol = 1e-6 (float32 products
    of these sizes differ by about 1e-7), not 0."""
    model = _split_scale_model(with_softmax=True)
    canonical, done, again = _canonical(model)
    assert done == {"scale_to_scores": 1} and again == 0
    assert op_sequence(canonical) == ["MatMul", "Mul", "Add", "Softmax"]
    run_both(model, canonical, rtol=1e-6, atol=1e-6)


def test_a_scaled_matmul_that_no_softmax_reads_keeps_its_scales() -> None:
    assert _canonical(_split_scale_model(with_softmax=False))[1] == {}


def test_a_moved_scale_no_fusion_took_goes_back_where_it_was() -> None:
    model = _split_scale_model(with_softmax=True)
    work = ir.from_proto(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    counter = itertools.count()
    canonical_form(work.graph, lambda hint: f"{hint}__{next(counter)}")
    assert undo_unused(work.graph)["scale_to_scores"] == 1
    restored = ir.to_proto(work)
    assert op_sequence(restored) == ["Mul", "Mul", "MatMul", "Add", "Softmax"]
    run_both(model, restored, **EXACT)


def test_one_head_picked_from_permuted_heads_becomes_a_head_split() -> None:
    """dynamo's Falcon: ``Transpose(GatherND(Transpose(heads, [2, 0, 1, 3]), [[j]]),
    [1, 0, 2, 3])`` for the key and the value head: a Slice of the heads, then
    ``heads_by_slice``'s head split."""
    model = _model(
        [
            "r = Reshape (x, split)",
            "t = Transpose <perm = [2, 0, 1, 3]> (r)",
            "k1 = GatherND (t, key_index)",
            "v1 = GatherND (t, value_index)",
            "k = Transpose <perm = [1, 0, 2, 3]> (k1)",
            "v = Transpose <perm = [1, 0, 2, 3]> (v1)",
            "ko = Neg (k)",
            "vo = Neg (v)",
        ],
        "float[batch, seq, 48] x",
        "float[batch, 1, seq, 8] ko, float[batch, 1, seq, 8] vo",
        {
            "split": np.array([0, 0, 6, 8], np.int64),
            "key_index": np.array([[4]], np.int64),
            "value_index": np.array([[-1]], np.int64),
        },
    )
    canonical, done, again = _canonical(model)
    assert done["gather_nd_as_slice"] == 2 and done["slice_before_transpose_of_one"] == 2
    assert done["transposes_composed"] == 2 and done["heads_by_slice"] == 2 and again == 0
    assert "GatherND" not in op_sequence(canonical)
    assert op_sequence(canonical).count("Transpose") == 2
    run_both(model, canonical, **EXACT)


def test_a_gather_nd_of_several_indices_stays() -> None:
    model = _model(
        ["g = GatherND (t, picks)"],
        "float[6, 2, 8] t",
        "float[2, 2, 8] g",
        {"picks": np.array([[1], [3]], np.int64)},
    )
    assert _canonical(model)[1] == {}


def _head_split_from_shapes(shape_of: str, inputs: str) -> onnx.ModelProto:
    """x.view(batch, seq, 4, 8) with batch and seq read from the shape of ``shape_of``."""
    return _model(
        [
            f"s = Shape ({shape_of})",
            "b = Gather <axis = 0> (s, i0)",
            "q = Gather <axis = 0> (s, i1)",
            "bu = Unsqueeze (b, zero)",
            "qu = Unsqueeze (q, zero)",
            "t = Concat <axis = 0> (bu, qu, heads, size)",
            "y = Reshape (x, t)",
        ],
        inputs,
        "float[batch, seq, 4, 8] y",
        {
            "i0": np.array(0, np.int64),
            "i1": np.array(1, np.int64),
            "heads": np.array([4], np.int64),
            "size": np.array([-1], np.int64),
        },
    )


def _reshape_target(model: onnx.ModelProto) -> list[int] | None:
    (reshape,) = [n for n in model.graph.node if n.op_type == "Reshape"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    target = inits.get(reshape.input[1])
    return None if target is None else target.tolist()


def test_a_target_that_copies_the_batch_and_sequence_becomes_a_constant() -> None:
    model = _head_split_from_shapes("x", "float[batch, seq, 32] x")
    canonical, done, again = _canonical(model)
    assert done == {"copied_dims": 1} and again == 0
    assert _reshape_target(canonical) == [0, 0, 4, -1]
    run_both(model, canonical, **EXACT)


def test_a_target_read_from_another_tensors_dims_stays() -> None:
    """The batch and sequence of ``u`` are other symbols: nothing proves them x's."""
    model = _head_split_from_shapes("u", "float[batch, seq, 32] x, float[n, m, 32] u")
    assert _canonical(model)[1] == {}


# --- nn.MultiheadAttention's sequence-first layout (_sequence_first.py) ---------------


def test_a_part_of_a_packed_projection_picked_by_gather_is_a_slice() -> None:
    model = _model(
        [
            "r = Reshape (qkv, parts)",
            "u = Unsqueeze (r, zero)",
            "t = Transpose <perm = [3, 1, 2, 0, 4]> (u)",
            "s = Squeeze (t, minus_two)",
            "g = Gather <axis = 0> (s, one)",
            "y = Mul (g, two)",
        ],
        "float[seq, batch, 48] qkv",
        "float[seq, batch, 16] y",
        {
            "parts": np.array([0, 0, 3, 16], np.int64),
            "minus_two": np.array([-2], np.int64),
            "one": np.array(1, np.int64),
            "two": np.array(2.0, np.float32),
        },
    )
    canonical, done, again = _canonical(model)
    assert done == {"packed_part": 1} and again == 0
    assert "Slice" in op_sequence(canonical) and "Gather" not in op_sequence(canonical)
    run_both(model, canonical, **EXACT)


def _sequence_first_heads(last_target: list[int]) -> onnx.ModelProto:
    """x[L=6, B=2, E=32] split into 4 heads of 8 sequence-first, as nn.MultiheadAttention
    does: [L, B*h, d], Transpose(1, 0, 2), then ``last_target``."""
    return _model(
        [
            "r = Reshape (x, flat)",
            "t = Transpose <perm = [1, 0, 2]> (r)",
            "h = Reshape (t, heads)",
            "y = Mul (h, two)",
        ],
        "float[6, 2, 32] x",
        f"float[{', '.join(map(str, last_target))}] y",
        {
            "flat": np.array([6, 8, 8], np.int64),
            "heads": np.array(last_target, np.int64),
            "two": np.array(2.0, np.float32),
        },
    )


def test_a_sequence_first_head_split_becomes_batch_first() -> None:
    model = _sequence_first_heads([2, 4, 6, 8])
    canonical, done, again = _canonical(model)
    assert done == {"sequence_first_heads": 1} and again == 0
    assert op_sequence(canonical) == ["Transpose", "Reshape", "Transpose", "Mul"]
    run_both(model, canonical, **EXACT)


def test_heads_taken_batch_minor_stay() -> None:
    """[h, B, L, d] is not the head split the rule proves: the rows are b-major."""
    assert _canonical(_sequence_first_heads([4, 2, 6, 8]))[1] == {}


def test_a_sequence_first_heads_merge_and_its_projection_become_batch_first() -> None:
    rng = np.random.default_rng(5)
    model = _model(
        [
            "t = Transpose <perm = [2, 0, 1, 3]> (ctx)",
            "r = Reshape (t, rows)",
            "p = Gemm <transB = 1> (r, w, b)",
            "u = Reshape (p, seq_first)",
            "o = Transpose <perm = [1, 0, 2]> (u)",
            "y = Mul (o, two)",
        ],
        "float[2, 4, 6, 8] ctx",
        "float[2, 6, 32] y",
        {
            "rows": np.array([-1, 32], np.int64),
            "seq_first": np.array([6, 2, 32], np.int64),
            "w": rng.standard_normal((32, 32)),
            "b": rng.standard_normal(32),
            "two": np.array(2.0, np.float32),
        },
    )
    canonical, done, again = _canonical(model)
    assert done == {"sequence_first_merge": 1} and again == 0
    assert op_sequence(canonical) == ["Transpose", "Reshape", "Gemm", "Reshape", "Mul"]
    run_both(model, canonical, rtol=1e-6, atol=1e-6)  # the Gemm's rows in another order


def test_k_transposed_through_a_3d_reshape_is_one_transpose() -> None:
    model = _model(
        [
            "f = Reshape (k, flat)",
            "t = Transpose <perm = [0, 2, 1]> (f)",
            "kt = Reshape (t, back)",
            "y = Mul (kt, two)",
        ],
        "float[2, 4, 6, 8] k",
        "float[2, 4, 8, 6] y",
        {
            "flat": np.array([8, 6, 8], np.int64),
            "back": np.array([2, 4, 8, 6], np.int64),
            "two": np.array(2.0, np.float32),
        },
    )
    canonical, done, again = _canonical(model)
    assert done == {"kt_by_reshape": 1} and again == 0
    assert op_sequence(canonical) == ["Transpose", "Mul"]
    (swap,) = [n for n in canonical.graph.node if n.op_type == "Transpose"]
    assert list(swap.attribute[0].ints) == [0, 1, 3, 2]
    run_both(model, canonical, **EXACT)


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 3),
    kv=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 3]),
    length=st.integers(1, 9),
    size=st.sampled_from([4, 8]),
)
def test_k_transposed_through_a_3d_reshape_of_repeated_heads_is_the_swap_of_the_heads(
    batch: int, kv: int, group: int, length: int, size: int
) -> None:
    """An optimizer merges repeat_kv's ``[B, N, L, H]`` Reshape into K^T's flattening one
    (a graph exported for one length: Jamba's, Gated DeltaNet hybrids'): the flattening
    Reshape then reads ``[B, KV, G, L, H]``. The heads' Reshape is written back and K^T
    is their swap."""
    heads = kv * group
    model = _model(
        [
            "u = Unsqueeze (k, axis_2)",
            "e = Expand (u, repeat)",
            "f = Reshape (e, flat)",
            "t = Transpose <perm = [0, 2, 1]> (f)",
            "kt = Reshape (t, back)",
            "y = Mul (kt, two)",
        ],
        f"float[{batch}, {kv}, {length}, {size}] k",
        f"float[{batch}, {heads}, {size}, {length}] y",
        {
            "axis_2": np.array([2], np.int64),
            "repeat": np.array([1, 1, group, 1, 1], np.int64),
            "flat": np.array([batch * heads, length, size], np.int64),
            "back": np.array([batch, heads, size, length], np.int64),
            "two": np.array(2.0, np.float32),
        },
    )
    canonical, done, _ = _canonical(model)
    assert done.get("kt_by_reshape") == 1, done
    ops = op_sequence(canonical)
    assert ops.count("Transpose") == 1 and ops.count("Reshape") == 1, ops
    (swap,) = [n for n in canonical.graph.node if n.op_type == "Transpose"]
    assert list(swap.attribute[0].ints) == [0, 1, 3, 2]
    run_both(model, canonical, **EXACT)
