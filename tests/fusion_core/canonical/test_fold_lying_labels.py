"""The fold rules decide on sizes the graph proves, not on labels that can lie.

As ``test_layout_lying_labels.py``, for the rules that read heads folded into the
batch: each block is a spelling (or one that only looks like it) whose Reshape targets
read their sizes from the graph; ``tests/fusion_core/lying_labels.py`` draws the labels
an inference could have written instead (two symbols merged, an inner value given an
input's symbol, a label dropped). Whatever the optimizer makes of it must compute what
the graph computes at two input sizes where the lie matters, or leave it.

* ``fold``/``fold_crossed``: WavLM's bmm attention over heads folded straight from
  ``x[L, B, E]`` (``sequence_first_fold``, then ``heads_in_batch``), and one whose fold
  reads ``[B, L * N, H]``: its labels are the fold's once ``L`` and ``B`` are merged;
* ``kt_repeated``/``kt_repeated_reread``: K^T through a flattening of repeated heads
  ``x[B, KV, G, L, H]`` (``kt_by_reshape``), and one flattening to ``[B * KV * G, H,
  L]``: its labels are the swap's once ``H`` and ``L`` are merged;
* ``bias_fold``/``bias_rows``: a bias added to folded scores before their unfold
  (``heads_in_batch``), a fold of ``[B, N, 1, L]``, and one of its own rows ``R`` (one
  row for all at ``R = 1``): labelled the scores' rows, it looks like a fold.

Tolerance: rtol = atol = 1e-5 (the products and the Softmax per head rather than
folded: the same sums, float32).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.lying_labels import inferred, lies, merged, relabelled
from tests.fusion_core.spelling_settings import SPELLINGS
from tests.fusion_core.wavlm_text import FOLD_ATTENTION

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
_INTS = {f"i{a}": np.array([a], np.int64) for a in range(5)}
_INTS |= {"rest": np.array([-1], np.int64), "two": np.array(2.0, np.float32)}


def _reads(value: str, axes: int) -> list[str]:
    return [f"d = Shape ({value})", *(f"s{a} = Gather <axis = 0> (d, i{a})" for a in range(axes))]


def _fold(kind: str) -> onnx.ModelProto:
    """Self-attention over 2 heads of 4 folded from ``x[L, B, 8]`` into the batch, its
    context merged back to ``[L * B, 8]`` rows (``fold_crossed``: the fold reads B first)."""
    lead = "s1" if kind == "fold_crossed" else "s0"
    body = [
        "q = Mul (x, two)",
        "k = Add (x, two)",
        "v = Sub (x, two)",
        *_reads("x", 2),
        f"t1 = Concat <axis = 0> ({lead}, rest, four)",
        *(f"{p}f = Reshape ({p}, t1)" for p in "qkv"),
        *FOLD_ATTENTION,
        "rows = Reshape (ct, merge)",
        "z = Mul (rows, two)",
    ]
    inits = {**_INTS, "four": np.array([4], np.int64), "merge": np.array([-1, 8], np.int64)}
    return graph_model(["float[L, B, 8] x"], ["float[?, 8] z"], body, inits)


def _kt_repeated(kind: str) -> onnx.ModelProto:
    """K^T of the repeated heads ``x[B, 2, 2, L, H]`` flattened to ``[B * 4, L, H]``
    (``kt_repeated_reread``: to ``[B * 4, H, L]``, and written back the other way)."""
    flat, back = ("s4, s3", "s3, s4") if kind == "kt_repeated_reread" else ("s3, s4", "s4, s3")
    body = [
        "k = Mul (x, two)",
        *_reads("k", 5),
        f"t1 = Concat <axis = 0> (rest, {flat})",
        "f = Reshape (k, t1)",
        "t = Transpose <perm = [0, 2, 1]> (f)",
        f"t2 = Concat <axis = 0> (s0, four, {back})",
        "y = Reshape (t, t2)",
        "z = Mul (y, two)",
    ]
    inits = {**_INTS, "four": np.array([4], np.int64)}
    return graph_model(["float[B, 2, 2, L, H] x"], ["float[?, 4, ?, ?] z"], body, inits)


def _bias(kind: str) -> onnx.ModelProto:
    """``split(merge(q) @ merge(k)^T + b)`` over 2 heads of ``x[B, 2, 5, 4]``: ``b`` the
    fold of ``c[B, 2, 1, 5]`` (``bias_fold``) or ``c[R, 1, 5]`` itself (``bias_rows``)."""
    if kind == "bias_fold":
        bias, declared = ["cs = Mul (c, two)", "b = Reshape (cs, bias_fold)"], "float[B, 2, 1, 5] c"
    else:
        bias, declared = ["b = Mul (c, two)"], "float[R, 1, 5] c"
    body = [
        "q = Mul (x, two)",
        "k = Add (x, two)",
        *_reads("q", 2),
        "q3 = Reshape (q, fold)",
        "k3 = Reshape (k, fold)",
        "kt = Transpose <perm = [0, 2, 1]> (k3)",
        "scores = MatMul (q3, kt)",
        *bias,
        "biased = Add (scores, b)",
        "t2 = Concat <axis = 0> (s0, s1, five, five)",
        "y = Reshape (biased, t2)",
        "z = Mul (y, two)",
    ]
    inits = {**_INTS, "five": np.array([5], np.int64)}
    inits |= {"fold": np.array([-1, 5, 4], np.int64), "bias_fold": np.array([-1, 1, 5], np.int64)}
    return graph_model(["float[B, 2, 5, 4] x", declared], ["float[?, ?, 5, 5] z"], body, inits)


BLOCKS = {
    "fold": (_fold, [{"x": (5, 2, 8)}, {"x": (3, 4, 8)}]),
    "fold_crossed": (_fold, [{"x": (5, 2, 8)}, {"x": (3, 4, 8)}]),
    "kt_repeated": (_kt_repeated, [{"x": (2, 2, 2, 5, 3)}, {"x": (1, 2, 2, 3, 6)}]),
    "kt_repeated_reread": (_kt_repeated, [{"x": (2, 2, 2, 5, 3)}, {"x": (1, 2, 2, 3, 6)}]),
    "bias_fold": (
        _bias,
        [{"x": (3, 2, 5, 4), "c": (3, 2, 1, 5)}, {"x": (1, 2, 5, 4), "c": (1, 2, 1, 5)}],
    ),
    "bias_rows": (
        _bias,
        [{"x": (3, 2, 5, 4), "c": (1, 1, 5)}, {"x": (2, 2, 5, 4), "c": (4, 1, 5)}],
    ),
}
_LIES = {kind: lies(build(kind)) for kind, (build, _) in BLOCKS.items()}


def _same_at_both_sizes(kind: str, model: onnx.ModelProto) -> list[str]:
    """The optimized model's ops; it computes what the block does at both sizes."""
    build, sizes = BLOCKS[kind]
    fused = fuse_quiet(model)
    for seed, shapes in enumerate(sizes):
        rng = np.random.default_rng(seed)
        feeds = {name: rng.standard_normal(s).astype(np.float32) for name, s in shapes.items()}
        run_both(build(kind), fused.model, feeds=feeds, **TOL)
    return fused.ops


@pytest.mark.parametrize("kind", sorted(BLOCKS))
@SPELLINGS
@given(data=st.data())
def test_lying_labels_leave_the_fold_rules_exact(kind, data) -> None:
    lie, lying = data.draw(_LIES[kind], label="lie")
    note(lie)
    _same_at_both_sizes(kind, lying)


@pytest.mark.parametrize(
    ("kind", "rank3"),
    [("fold", False), ("kt_repeated", False), ("bias_fold", False), ("bias_rows", True)],
)
def test_true_labels_read_the_folds_that_are_folds(kind, rank3) -> None:
    """With the true labels the folds are read per head (no rank-3 product left), the
    bias of rows of its own (proven other than the scores') stays folded."""
    model = inferred(BLOCKS[kind][0](kind))
    fused = fuse_quiet(model, value_info="all")  # the ranks the rules left, declared
    _same_at_both_sizes(kind, model)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in fused.model.graph.value_info}
    products = [n for n in fused.model.graph.node if n.op_type == "MatMul"]
    assert (3 in [ranks.get(n.output[0]) for n in products]) == rank3, fused.ops
    if kind == "kt_repeated":
        assert fused.ops == ["Mul", "Shape", "Concat", "Reshape", "Transpose", "Mul"], fused.ops


@pytest.mark.parametrize(
    ("kind", "gone", "kept"),
    [("fold_crossed", "B", "L"), ("kt_repeated_reread", "H", "L")],
)
def test_a_spelling_labelled_as_the_fold_is_left(kind, gone, kept) -> None:
    lying = merged(inferred(BLOCKS[kind][0](kind)), gone, kept)
    _same_at_both_sizes(kind, lying)


def test_a_bias_of_its_own_rows_labelled_the_scores_rows_is_left() -> None:
    """``c[R, 1, 5]`` with the folded scores labelled ``R`` rows too: the graph proves
    ``R`` (an input's) other than ``2 * B``, so the bias is no fold; at ``R = 1`` an
    unfold to 2 heads would fail to run."""
    lying = inferred(_bias("bias_rows"))
    for name in ("scores", "biased"):
        lying = relabelled(lying, name, 0, "R")
    _same_at_both_sizes("bias_rows", lying)
