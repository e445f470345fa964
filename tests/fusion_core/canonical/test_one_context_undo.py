"""Rule ``one_context`` written back where no fusion took it: contexts ``P @ V_i`` of one
softmax joined on the last axis (differential attention) are the context of the joined
values while the patterns look, and come back apart when nothing fused.

A generator (hypothesis) writes one attention block whose context is two or three
contexts of one ``P`` joined by a Concat, drawing the query heads, the key/value heads
(fewer, repeated by repeat_kv: Unsqueeze, Expand, Reshape, with the Expand's shape
written ``[1, 1, G, 1, 1]`` or computed in full; as many heads as the query's, the
joined values are heads ``concat_heads`` rewrites, whose undo leaves them laid out as
``[B, S, N, *]``, so this one has nothing to write back), each value's head size, and
whether each context is joined as ``[B, N, S, *]`` or after its head Transpose. With
every attention pattern left out nothing fuses: the model must come out with the op
sequence it went in with and compute the same values bit for bit (rtol = atol = 0: the
same ops on the same inputs, onnxruntime's optimizations off). Where the attention
fuses, the rule still serves it (tests/fusion_core/canonical/test_attention_per_head.py,
its blocks with two contexts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx_ir.passes.common import RemoveUnusedNodesPass

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import canonical_twice, op_sequence, optimize_quiet, run_both
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

EXACT = dict(rtol=0, atol=0)
HIDDEN, SIZE = 16, 8
WORDS = "contexts of one softmax joined on the last axis made one context"


@dataclass(frozen=True)
class Joined:
    heads: int
    kv_heads: int
    sizes: tuple[int, ...]  # each value's head size
    turned: bool  # each context joined after its head Transpose
    full_shape: bool  # the repeat's Expand shape written [B, KV, G, S, H] (from Shape)


@st.composite
def joined_blocks(draw) -> Joined:
    kv = draw(st.sampled_from([1, 2, 4]))
    return Joined(
        heads=draw(st.sampled_from([h for h in (2, 4, 8) if h > kv])),
        kv_heads=kv,
        sizes=tuple(draw(st.lists(st.sampled_from([2, 4, 6]), min_size=2, max_size=3))),
        turned=draw(st.booleans()),
        full_shape=draw(st.booleans()),
    )


def _value(i: int, size: int, s: Joined) -> list[str]:
    """``v{i}_rep`` [B, N, S, size]: the i-th value's heads, repeated to the query's."""
    lines = [
        f"v{i}_m = MatMul (x, wv{i})",
        f"v{i}_r = Reshape (v{i}_m, v{i}_split)",
        f"v{i}_t = Transpose <perm = [0, 2, 1, 3]> (v{i}_r)",
    ]
    if s.kv_heads == s.heads:
        lines[-1] = f"v{i}_rep = Transpose <perm = [0, 2, 1, 3]> (v{i}_r)"
        return lines
    shape = f"v{i}_shape" if s.full_shape else "group"
    full = [
        f"v{i}_dims = Shape (v{i}_u)",
        f"v{i}_shape = Mul (v{i}_dims, group)",
    ]
    return [
        *lines,
        f"v{i}_u = Unsqueeze (v{i}_t, axis_2)",
        *(full if s.full_shape else []),
        f"v{i}_e = Expand (v{i}_u, {shape})",
        f"v{i}_rep = Reshape (v{i}_e, rep_{size})",
    ]


def joined_block(s: Joined, seed: int = 0) -> onnx.ModelProto:
    n, kv, group = s.heads, s.kv_heads, s.heads // s.kv_heads
    total = sum(s.sizes)
    body = [
        "qm = MatMul (x, wq)",
        "qr = Reshape (qm, q_split)",
        "qt = Transpose <perm = [0, 2, 1, 3]> (qr)",
        "km = MatMul (x, wk)",
        "kr = Reshape (km, q_split)",
        "kT = Transpose <perm = [0, 2, 3, 1]> (kr)",
        "qk = MatMul (qt, kT)",
        "scaled = Mul (qk, scale)",
        "probs = Softmax <axis = -1> (scaled)",
    ]
    parts = []
    for i, size in enumerate(s.sizes):
        body += [*_value(i, size, s), f"c{i} = MatMul (probs, v{i}_rep)"]
        if s.turned:
            body.append(f"c{i}_t = Transpose <perm = [0, 2, 1, 3]> (c{i})")
        parts.append(f"c{i}_t" if s.turned else f"c{i}")
    body.append(f"context = Concat <axis = -1> ({', '.join(parts)})")
    if not s.turned:
        body.append("context_t = Transpose <perm = [0, 2, 1, 3]> (context)")
    body += [
        f"merged = Reshape ({'context' if s.turned else 'context_t'}, merge)",
        "y = MatMul (merged, wo)",
    ]
    rng = np.random.default_rng(seed)
    inits = {
        "wq": rng.standard_normal((HIDDEN, n * SIZE)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, n * SIZE)) * 0.3,
        "wo": rng.standard_normal((n * total, HIDDEN)) * 0.3,
        "q_split": np.array([0, 0, n, SIZE], np.int64),
        "merge": np.array([0, 0, n * total], np.int64),
        "axis_2": np.array([2], np.int64),
        "group": np.array([1, 1, group, 1, 1], np.int64),
        "scale": np.array(SIZE**-0.5, np.float32),
    }
    for i, size in enumerate(s.sizes):
        inits[f"wv{i}"] = rng.standard_normal((HIDDEN, kv * size)) * 0.3
        inits[f"v{i}_split"] = np.array([0, 0, kv, size], np.int64)
        inits[f"rep_{size}"] = np.array([0, n, -1, size], np.int64)
    return graph_model(["float[B, S, 16] x"], ["float[B, S, 16] y"], body, inits)


def _feeds(batch: int, seq: int) -> dict:
    rng = np.random.default_rng(batch * 10 + seq)
    return {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)}


@SPELLINGS
@given(joined_blocks())
def test_contexts_no_fusion_took_come_back_apart(s: Joined) -> None:
    model = joined_block(s)
    _canonical, done, _again, work = canonical_twice(model)
    assert done.get("one_context") == 1, (s, done)
    assert undo_unused(work.graph)["one_context"] == 1, s
    RemoveUnusedNodesPass()(work)  # as the pipeline does after the rounds
    undone = ir.to_proto(work)
    assert op_sequence(undone) == op_sequence(model), s
    run_both(model, undone, feeds=_feeds(2, 5), **EXACT)
    # through the whole optimizer, every attention pattern left out: nothing fuses
    result = optimize_quiet(model, target="onnxruntime", patterns=["gelu_tanh"])
    fused = result.to_proto()
    assert not any(WORDS in p for p in result.prepasses), result.prepasses
    if not s.full_shape:  # a computed shape: the pre-passes read it from the inputs
        assert op_sequence(fused) == op_sequence(model), (s, result.prepasses)
    onnx.checker.check_model(fused, full_check=True)
    for batch, seq in ((1, 3), (2, 5)):
        run_both(model, fused, feeds=_feeds(batch, seq), **EXACT)


@SPELLINGS
@given(joined_blocks())
def test_repeats_cleaned_up_before_the_undo_are_written_again(s: Joined) -> None:
    """The graph's own repeats gone (nothing read them): each value is repeated again
    with the constants its repeat had (a shape the graph computed becomes ``[1, 1, G, 1,
    1]``), the same values."""
    model = joined_block(s)
    _canonical, _done, _again, work = canonical_twice(model)
    RemoveUnusedNodesPass()(work)
    assert undo_unused(work.graph)["one_context"] == 1, s
    undone = ir.to_proto(work)
    expected = [op for op in op_sequence(model) if not (s.full_shape and op in ("Shape", "Mul"))]
    assert [op for op in op_sequence(undone) if op not in ("Shape", "Mul")] == [
        op for op in expected if op not in ("Shape", "Mul")
    ], s
    onnx.checker.check_model(undone, full_check=True)
    run_both(model, undone, feeds=_feeds(2, 5), **EXACT)
