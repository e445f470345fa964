"""GroupQueryAttention only where onnxruntime's kernel takes the head size: a multiple of 8
("head_size must be a multiple of 8"; the CPU kernel refuses 4, 12 or 20 when it runs, so a
fused model with such heads could not run and the job fell back). Other head sizes get a
near miss that says so, and the block becomes MultiHeadAttention over the repeated heads
(with or without a cache) where that op can compute it, or stays (sinks, which only
GroupQueryAttention takes). The fused block computes what it did:
rtol = atol = 1e-5, as in tests/fusion_core/rewriters/test_group_query_attention.py."""

from __future__ import annotations

import os

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import misses, optimize_quiet, run_both
from tests.fusion_core.value_block import Block, feeds, value_block

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)

# the example budget: 16 in `make test`, AUTOFUSION_SPELLING_EXAMPLES in the corpus tier
EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "16"))


@st.composite
def blocks(draw) -> Block:
    kv = draw(st.sampled_from([1, 2]))
    size = draw(st.sampled_from([4, 12, 16, 20, 24]))
    return Block(
        heads=kv * draw(st.sampled_from([1, 2])),
        kv_heads=kv,
        size=size,
        v_size=size,
        scale="none",
        cache=draw(st.booleans()),
        sinks=draw(st.booleans()),
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(block=blocks())
def test_group_query_attention_only_over_heads_its_kernel_takes(block: Block) -> None:
    model = value_block(block)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    attention = [op for op in ops if op in ("GroupQueryAttention", "MultiHeadAttention")]
    if block.size % 8 == 0 or not block.sinks:
        assert len(attention) == 1 and "Softmax" not in ops, (ops, misses(result, "attention"))
    if block.size % 8 == 0 and block.sinks:
        assert attention == ["GroupQueryAttention"], ops
    if block.size % 8:
        assert "GroupQueryAttention" not in ops, ops
        reasons = misses(result, "attention")
        if block.sinks:  # no other op takes sinks
            want = f"the heads are {block.size} wide: GroupQueryAttention takes a head size"
            assert any(want in r for r in reasons), reasons
        else:
            assert ops.count("MultiHeadAttention") == 1, (ops, reasons)
    onnx.checker.check_model(fused, full_check=True)
    past = 3 if block.cache else 0
    for batch, seq in ((2, 5), (1, 1 if block.cache else 3)):
        run_both(model, fused, feeds=feeds(block, batch, seq, past), **TOL)
