"""``rotary`` decides on sizes the graph proves, not on the labels an inference put on
its values (``rewriters/_rotary_tables.py``: ``Heads``, over ``FusedSizeProof``; the
labels decide only where the proof cannot tell).

Each block rotates heads ``x`` by rotate_half with angles computed from ``position_ids``
(``HALF_TABLES``: ``Unsqueeze(Cos(Concat(f, f)), 1)``); ``value_info`` carries the labels
an inference could have written:

* ``rows``: ``position_ids[1, pos]``, its angles labelled ``[1, seq, r]`` like the heads'
  sequence. The graph broadcasts one position over every query (``pos = 1``); the old
  rewriter took the table for the heads' positions and the op read rows the cache does
  not have. Now ``pos`` and ``seq`` are proven apart and the block is refused or exact.
* ``batch``: ``position_ids[pbatch, seq]`` labelled ``[batch, seq]``: the graph
  broadcasts a batch of 1, the old rewriter read the table as batched (rows ``b * S + s``).
* ``relabelled``: ``position_ids[batch, seq]``, the angles labelled with fresh symbols
  that equal nothing: the labels cannot show the rows are the heads', the proof can, and
  it fuses.
* ``heads``: ``x`` is the head split ``[0, 0, -1, 16]`` of a projection ``heads * 16``
  wide labelled ``2 * 16`` (two heads): the old rewriter gave the op ``num_heads = 2``.
* GPT-J's interleaved spelling (``test_rotary_interleaved.gptj_block``) of angles from
  ``position_ids[pbatch, seq]`` labelled ``[batch, seq]``, as ``batch`` above.

Tolerance: rtol = atol = 1e-5 (as tests/fusion_core/rewriters/test_rotary.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.decoder_text import HALF_TABLES, graph_model
from tests.fusion_core.rewriters.test_rotary import rotary_constants
from tests.fusion_core.rewriters.test_rotary_interleaved import gptj_block
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
SIZE, HIDDEN = 16, 32
ROTATE = [
    "lo = Slice (x, zero, half, last)",
    "hi = Slice (x, half, end, last)",
    "neg = Neg (hi)",
    "rot = Concat <axis = -1> (neg, lo)",
    "c = Mul (x, cos_u)",
    "s = Mul (rot, sin_u)",
    "y = Add (c, s)",
]
IDS = {
    "rows": "int64[1, pos] position_ids",
    "batch": "int64[pbatch, seq] position_ids",
    "relabelled": "int64[batch, seq] position_ids",
    "heads": "int64[batch, seq] position_ids",
}
# what value_info says of the angles' [Bc, S] and of the heads x
TABLE_ROWS = {"rows": [1, "seq"], "batch": ["batch", "seq"], "relabelled": ["t0", "t1"]}


def block(kind: str, heads: int) -> onnx.ModelProto:
    """The rotary of ``kind`` (see the module docstring) with its labels written."""
    inits = {"inv_freq": 1.0 / (10000 ** (np.arange(0, SIZE, 2) / SIZE))}
    inits |= rotary_constants(SIZE)
    body = list(HALF_TABLES)
    if kind == "heads":  # x: the head split of a projection
        rng = np.random.default_rng(heads)
        inits |= {"wq": rng.standard_normal((HIDDEN, heads * SIZE)) * 0.3}
        inits["split"] = np.array([0, 0, -1, SIZE], np.int64)
        body += [
            "qm = MatMul (h, wq)",
            "qr = Reshape (qm, split)",
            "x = Transpose <perm = [0, 2, 1, 3]> (qr)",
        ]
        inputs = ["float[batch, seq, 32] h"]
    else:
        inputs = [f"float[batch, {heads}, seq, {SIZE}] x"]
    model = graph_model(
        [*inputs, IDS[kind]], [f"float[batch, {heads}, seq, {SIZE}] y"], body + ROTATE, inits
    )
    return _labelled(model, _labels(kind))


def _labels(kind: str) -> dict[str, list]:
    if kind == "heads":  # a projection heads * 16 wide labelled 2 * 16: two heads
        return {
            "qm": ["batch", "seq", 2 * SIZE],
            "qr": ["batch", "seq", 2, SIZE],
            "x": ["batch", 2, "seq", SIZE],
        }
    rows = TABLE_ROWS[kind]
    found = {"pos": rows, "pos_u": [*rows, 1], "freqs": [*rows, SIZE // 2]}
    found |= {name: [*rows, SIZE] for name in ("emb", "cos", "sin")}
    return found | {name: [rows[0], 1, rows[1], SIZE] for name in ("cos_u", "sin_u")}


def _labelled(model: onnx.ModelProto, labels: dict[str, list]) -> onnx.ModelProto:
    for name, dims in labels.items():
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, 1, dims))
    return model


def _feeds(kind: str, heads: int, run: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """Inputs at ``run`` = (batch, seq, n): n positions (``rows``) or batches of
    positions (``batch``); sizes at which the original itself runs."""
    batch, seq, n = run
    rng = np.random.default_rng(batch * 100 + seq * 10 + n)
    shape = {"rows": (1, n), "batch": (n, seq)}.get(kind, (batch, seq))
    feeds = {"position_ids": rng.integers(0, 64, shape).astype(np.int64)}
    if kind == "heads":
        feeds["h"] = rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)
    else:
        feeds["x"] = rng.standard_normal((batch, heads, seq, SIZE)).astype(np.float32)
    return feeds


def _fused_and_same(kind: str, heads: int, runs: list[tuple[int, int, int]]) -> int:
    """How many RotaryEmbedding ops the block became; whatever it became computes what
    the graph does."""
    model = block(kind, heads)
    fused = fuse_quiet(model)
    for run in runs:
        run_both(model, fused.model, feeds=_feeds(kind, heads, run), **TOL)
    return fused.ops.count("RotaryEmbedding")


SHAPES = st.tuples(st.integers(1, 3), st.integers(2, 5))
HEADS = st.sampled_from([1, 2, 4])


@SPELLINGS
@given(heads=HEADS, shape=SHAPES, equal=st.booleans())
def test_a_table_of_other_positions_labelled_as_the_heads_is_refused_or_exact(
    heads, shape, equal
) -> None:
    batch, seq = shape
    # one position broadcast over every query (the original runs there), or one per query
    _fused_and_same("rows", heads, [(batch, seq, 1), (batch, seq, seq if equal else 1)])


@SPELLINGS
@given(heads=HEADS, shape=SHAPES)
def test_a_table_of_one_batch_labelled_as_the_heads_is_refused_or_exact(heads, shape) -> None:
    batch, seq = shape
    _fused_and_same("batch", heads, [(batch + 1, seq, 1), (batch, seq, batch)])


@SPELLINGS
@given(heads=HEADS, shape=SHAPES)
def test_a_table_with_unknown_labels_fuses_where_sizes_prove_its_rows(heads, shape) -> None:
    batch, seq = shape
    assert _fused_and_same("relabelled", heads, [(batch, seq, 0), (batch + 1, 1, 0)]) == 1


@SPELLINGS
@given(heads=st.sampled_from([4, 8]), shape=SHAPES)
def test_heads_of_a_projection_labelled_narrower_are_its_proven_heads(heads, shape) -> None:
    batch, seq = shape
    assert _fused_and_same("heads", heads, [(batch, seq, 0)]) == 1


def interleaved_block() -> onnx.ModelProto:
    """GPT-J's rotation (4 heads of 16 from ``h[batch, seq, 64]``) of angles computed from
    ``position_ids[pbatch, seq]``, every angle labelled with the heads' ``batch``."""
    model = gptj_block(partial=False, gathered=False)
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "pbatch"
    rows = ["batch", "seq"]
    labels = {"pos": rows, "pos_u": [*rows, 1], "freqs": [*rows, 8]}
    for name in ("sin", "cos"):
        labels |= {f"{name}_h": [*rows, 8], f"{name}_2": [*rows, 1, 8]}
        labels |= {f"{name}_4": [*rows, 1, 8, 1], f"{name}_t": [*rows, 1, 8, 2]}
        labels[f"{name}_r"] = [*rows, 1, 16]
    return _labelled(model, labels)


@SPELLINGS
@given(shape=SHAPES, broadcast=st.booleans())
def test_interleaved_angles_of_one_batch_labelled_as_the_heads_are_refused_or_exact(
    shape, broadcast
) -> None:
    batch, seq = shape
    model = interleaved_block()
    fused = fuse_quiet(model)
    rng = np.random.default_rng(batch * 10 + seq)
    for rows in (1, 1 if broadcast else batch + 1):
        feeds = {
            "h": rng.standard_normal((batch + 1, seq, 64)).astype(np.float32),
            "position_ids": rng.integers(0, 32, (rows, seq)).astype(np.int64),
        }
        run_both(model, fused.model, feeds=feeds, **TOL)
