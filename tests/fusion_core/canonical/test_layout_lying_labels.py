"""The layout rules decide on sizes the graph proves, not on labels that can lie.

Each block is a layout spelling (or one that only looks like it) whose target Reshapes
read their sizes from the graph; ``tests/fusion_core/lying_labels.py`` draws the labels
an inference could have written instead of the true ones: two symbols merged into one
(onnxruntime's auto-merge), an inner value given another input axis's symbol, a label
dropped. Whatever the optimizer (check off: the rules' own decisions) makes of it must
compute what the graph computes at two input sizes where the lie matters (``L != H``,
``B != L``), or be left as it was.

* ``kt_swap``/``kt_heads``: ``Reshape(Transpose(Reshape(k, [B*N, L, H]), [0, 2, 1]),
  [B, N, H, L])``, K^T by ``kt_by_reshape`` (``kt_heads``: k a head Transpose);
* ``kt_reread``: the same nodes flattening ``k`` to ``[B*N, H, L]`` (a reinterpretation,
  not a swap) and writing ``[B, N, L, H]`` back: with ``H`` merged into ``L`` its labels
  are the swap's, and the old ``kt_by_reshape`` made it ``Transpose(k)``;
* ``seq_heads``/``seq_crossed``: nn.MultiheadAttention's sequence-first head split of
  ``x[L, B, E]`` (``sequence_first_heads``), and one whose last target writes ``[L, h,
  B, d]``: its labels are the split's once ``L`` and ``B`` are merged.

Tolerance: rtol = atol = 1e-6 (the rules move elements, no arithmetic).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.lying_labels import inferred, lies, merged
from tests.fusion_core.spelling_settings import SPELLINGS

TOL = dict(rtol=1e-6, atol=1e-6)
HEADS, SIZE = 2, 4
_AXES = {f"i{a}": np.array([a], np.int64) for a in range(4)}
_INITS = {**_AXES, "rest": np.array([-1], np.int64), "two": np.array(2.0, np.float32)}
_READS = ["d = Shape (k)", *(f"s{a} = Gather <axis = 0> (d, i{a})" for a in range(4))]


def _kt(kind: str) -> onnx.ModelProto:
    """A K^T sandwich over ``x[B, N, L, H]`` (``kt_reread``: its sizes the other way)."""
    flat, back = ("s3, s2", "s2, s3") if kind == "kt_reread" else ("s2, s3", "s3, s2")
    head = ["k = Transpose <perm = [0, 2, 1, 3]> (xs)"] if kind == "kt_heads" else []
    body = [
        "xs = Mul (x, two)",
        *(head or ["k = Identity (xs)"]),
        *_READS,
        f"t1 = Concat <axis = 0> (rest, {flat})",
        "f = Reshape (k, t1)",
        "t = Transpose <perm = [0, 2, 1]> (f)",
        f"t2 = Concat <axis = 0> (s0, s1, {back})",
        "y = Reshape (t, t2)",
        "z = Mul (y, two)",
    ]
    return graph_model(["float[B, N, L, H] x"], ["float[B, N, ?, ?] z"], body, _INITS)


def _seq(kind: str) -> onnx.ModelProto:
    """A sequence-first head split of ``x[L, B, E]`` (``seq_crossed``: B and L crossed)."""
    inits = {**_INITS, "flat": np.array([0, -1, SIZE], np.int64)}
    inits["h"], inits["hd"] = np.array([HEADS], np.int64), np.array([SIZE], np.int64)
    back = "s0, h, s1, hd" if kind == "seq_crossed" else "s1, h, s0, hd"
    body = [
        "k = Mul (x, two)",
        *_READS[:3],
        "f = Reshape (k, flat)",
        "t = Transpose <perm = [1, 0, 2]> (f)",
        f"t2 = Concat <axis = 0> ({back})",
        "y = Reshape (t, t2)",
        "z = Mul (y, two)",
    ]
    width = HEADS * SIZE
    return graph_model([f"float[L, B, {width}] x"], ["float[?, ?, ?, ?] z"], body, inits)


BLOCKS = {
    "kt_swap": (_kt, [(2, 3, 5, 4), (1, 2, 3, 6)]),
    "kt_heads": (_kt, [(2, 5, 3, 4), (1, 3, 2, 6)]),
    "kt_reread": (_kt, [(2, 3, 5, 4), (1, 2, 3, 6)]),
    "seq_heads": (_seq, [(5, 2, HEADS * SIZE), (3, 4, HEADS * SIZE)]),
    "seq_crossed": (_seq, [(5, 2, HEADS * SIZE), (3, 4, HEADS * SIZE)]),
}
_LIES = {kind: lies(build(kind)) for kind, (build, _) in BLOCKS.items()}


def _same_at_both_sizes(kind: str, model: onnx.ModelProto) -> list[str]:
    """The optimized model's ops; it computes what the block does at both sizes."""
    build, shapes = BLOCKS[kind]
    fused = fuse_quiet(model)
    for seed, shape in enumerate(shapes):
        rng = np.random.default_rng(seed)
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        run_both(build(kind), fused.model, feeds=feeds, **TOL)
    return fused.ops


@pytest.mark.parametrize("kind", sorted(BLOCKS))
@SPELLINGS
@given(data=st.data())
def test_lying_labels_leave_the_layout_rules_exact(kind, data) -> None:
    lie, lying = data.draw(_LIES[kind], label="lie")
    note(lie)
    _same_at_both_sizes(kind, lying)


SWAPPED = ["Mul", "Transpose", "Mul"]


@pytest.mark.parametrize(
    ("kind", "left"),
    [
        ("kt_swap", SWAPPED),
        ("kt_heads", SWAPPED),
        ("seq_heads", ["Mul", "Transpose", "Reshape", "Transpose", "Mul"]),
    ],
)
def test_true_labels_still_make_the_batch_first_spelling(kind, left) -> None:
    assert _same_at_both_sizes(kind, inferred(BLOCKS[kind][0](kind))) == left


@pytest.mark.parametrize(
    ("kind", "gone", "kept"), [("kt_reread", "H", "L"), ("seq_crossed", "B", "L")]
)
def test_a_spelling_labelled_as_the_layout_is_left(kind, gone, kept) -> None:
    lying = merged(inferred(BLOCKS[kind][0](kind)), gone, kept)
    assert "Reshape" in _same_at_both_sizes(kind, lying)
