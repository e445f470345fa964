"""``attention`` (MultiHeadAttention) decides on sizes the graph proves, not on the labels
an inference put on its values (``rewriters/_fused_sizes.py``: ``FusedSizeProof``,
``same_axis``, ``proven_dims``; the labels decide only where the proof cannot tell).

Each block projects ``x[batch, seq, 32]`` to ``heads * size`` features and splits them
into heads by a Reshape whose target the graph writes; ``value_info`` carries the labels
an inference could have written:

* ``swapped``: the target is ``Concat(S, B, heads, size)`` read from ``x``'s shape (heads
  over the batch), labelled ``[batch, seq, heads, size]``. The labels made the old
  rewriter read the heads as ``[B, S]``: a MultiHeadAttention of another shape. Now the
  proof sees the batch and sequence swapped and the block is refused or exact.
* ``wide``: the target is ``[0, 0, -1, size]`` of a projection labelled as ``2 * size``
  wide (it is ``heads * size``): the old rewriter took 2 heads. Now the proven width
  resolves the -1.
* ``relabelled``: the target is ``Concat(B, S, heads, size)`` and the heads carry fresh
  symbols (``u0``, ``u1``) that equal nothing: labels cannot show the split keeps B and S,
  the proof can, and it fuses.
* ``memory``: keys and values from a second input ``m[mb, mem, 32]``, ``mb`` declared 1
  or the query's ``batch``: the graph broadcasts a key batch of 1, the op does not, so
  only the proven equal batch fuses.

Tolerance: rtol = atol = 1e-5 (as tests/fusion_core/rewriters/test_attention.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 32
FUSED = ("MultiHeadAttention", "Attention")
SIZES = [(1, 1), (2, 3), (3, 2), (4, 1)]  # (batch, seq) the models run at


def _split_lines(kind: str, heads: int, size: int) -> tuple[list[str], str, dict]:
    """The lines computing the head-split target, its name and initializers."""
    inits = {"i0": np.array([0], np.int64), "i1": np.array([1], np.int64)}
    inits["tail"] = np.array([heads, size], np.int64)
    if kind in ("wide", "memory"):  # a constant: 0s copy each source's B and S
        return [], "split", {"split": np.array([0, 0, -1 if kind == "wide" else heads, size])}
    order = "s, b" if kind == "swapped" else "b, s"
    return (
        [
            "dims = Shape (x)",
            "b = Gather <axis = 0> (dims, i0)",
            "s = Gather <axis = 0> (dims, i1)",
            f"split = Concat <axis = 0> ({order}, tail)",
        ],
        "split",
        inits,
    )


def block(kind: str, heads: int, size: int, memory: str = "batch") -> onnx.ModelProto:
    """The attention of ``kind`` (see the module docstring) with its labels written."""
    width = heads * size
    rng = np.random.default_rng(heads * 10 + size)
    body, target, inits = _split_lines(kind, heads, size)
    inits |= {f"w{p}": rng.standard_normal((HIDDEN, width)) * 0.3 for p in "qkv"}
    inits |= {"merge": np.array([0, 0, width], np.int64), "scale": np.array(size**-0.5)}
    inputs = ["float[batch, seq, 32] x"] + (
        [f"float[{memory}, mem, 32] m"] if kind == "memory" else []
    )
    for p in "qkv":
        source = "m" if kind == "memory" and p != "q" else "x"
        body += [
            f"{p}m = MatMul ({source}, w{p})",
            f"{p}r = Reshape ({p}m, {target})",
            f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
        ]
    body += [
        "kT = Transpose <perm = [0, 1, 3, 2]> (kt)",
        "qk = MatMul (qt, kT)",
        "sc = Mul (qk, scale)",
        "p = Softmax <axis = -1> (sc)",
        "c = MatMul (p, vt)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (c)",
        "y = Reshape (ct, merge)",
    ]
    outputs = [f"float[{'seq, batch' if kind == 'swapped' else 'batch, seq'}, {width}] y"]
    return _labelled(graph_model(inputs, outputs, body, inits), _labels(kind, heads, size))


def _labels(kind: str, heads: int, size: int) -> dict[str, list]:
    """What ``value_info`` says of the heads: the inference's mistake of each ``kind``."""
    if kind == "swapped":  # the heads of [S, B, ..] labelled as if [B, S, ..]
        rows, count, width = ["batch", "seq"], heads, heads * size
    elif kind == "wide":  # a projection heads * size wide labelled 2 * size
        rows, count, width = ["batch", "seq"], 2, 2 * size
    elif kind == "relabelled":  # symbols that equal nothing
        rows, count, width = ["u0", "u1"], heads, heads * size
    else:
        return {}
    found: dict[str, list] = {}
    for p in "qkv":
        found |= {f"{p}m": [*rows, width], f"{p}r": [*rows, count, size]}
        found[f"{p}t"] = [rows[0], count, rows[1], size]
    return found


def _labelled(model: onnx.ModelProto, labels: dict[str, list]) -> onnx.ModelProto:
    for name, dims in labels.items():
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, 1, dims))
    return model


def _feeds(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 10 + seq)
    feeds = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)}
    if any(i.name == "m" for i in model.graph.input):
        declared = model.graph.input[1].type.tensor_type.shape.dim[0].dim_value
        feeds["m"] = rng.standard_normal((declared or batch, seq + 1, HIDDEN)).astype(np.float32)
    return feeds


def _fused_and_same(model: onnx.ModelProto, sizes: list[tuple[int, int]]) -> list[str]:
    """The fused attention ops; whatever was fused computes what the graph does."""
    fused = fuse_quiet(model)
    for batch, seq in sizes:
        run_both(model, fused.model, feeds=_feeds(model, batch, seq), **TOL)
    return fused.ops_among(FUSED)


HEADS = st.sampled_from([(2, 4), (4, 4), (4, 8), (8, 4)])
RUNS = st.lists(st.sampled_from(SIZES), min_size=1, max_size=3, unique=True)


@SPELLINGS
@given(heads=HEADS, runs=RUNS)
def test_heads_over_a_swapped_batch_labelled_as_kept_are_refused_or_exact(heads, runs) -> None:
    _fused_and_same(block("swapped", *heads), [(2, 3), *runs])


@SPELLINGS
@given(heads=HEADS, runs=RUNS)
def test_a_projection_labelled_narrower_splits_into_its_proven_heads(heads, runs) -> None:
    assert _fused_and_same(block("wide", *heads), [(2, 3), *runs])


@SPELLINGS
@given(heads=HEADS, runs=RUNS)
def test_heads_with_unknown_labels_fuse_where_sizes_prove_the_split(heads, runs) -> None:
    fused = _fused_and_same(block("relabelled", *heads), runs)
    assert fused, "a head split proven to keep [B, S] was refused"


@SPELLINGS
@given(heads=HEADS, memory=st.sampled_from(["1", "batch"]), runs=RUNS)
def test_keys_of_another_batch_fuse_only_where_it_is_proven_the_query_s(heads, memory, runs):
    fused = _fused_and_same(block("memory", *heads, memory), [(2, 3), *runs])
    assert bool(fused) == (memory == "batch"), fused
