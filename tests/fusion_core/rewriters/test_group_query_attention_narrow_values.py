"""Value heads narrower than the query's and key's (MiMo-V2-Flash: values of 32 beside
q/k of 48; its sliding layers have attention sinks, which only GroupQueryAttention takes,
and GroupQueryAttention only one head size): the values are padded with zeros to the
query's head size and each context head cut back, ``P @ [V, 0] = [P @ V, 0]``. The fused
block computes what it did: rtol = atol = 1e-5, as in
tests/fusion_core/rewriters/test_group_query_attention.py (the kernel sums in another
order; at these sizes the outputs differ by about 1e-6). Without sinks MultiHeadAttention
takes the narrow values as they are (its ``v_hidden_size``), as before. With a KV cache
the present value would be padded: a near miss that says so."""

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

# the example budget: 14 in `make test`, AUTOFUSION_SPELLING_EXAMPLES in the corpus tier
EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "14"))


@st.composite
def narrow_blocks(draw) -> Block:
    kv = draw(st.sampled_from([1, 2, 4]))
    size = draw(st.sampled_from([16, 24, 48]))  # the CPU kernel takes multiples of 8
    return Block(
        heads=kv * draw(st.sampled_from([1, 2])),
        kv_heads=kv,
        size=size,
        v_size=draw(st.sampled_from([v for v in (8, 16, 32) if v < size])),
        scale=draw(st.sampled_from(["none", "scalar", "both"])),
        sinks=draw(st.booleans()),
    )


@settings(max_examples=EXAMPLES, deadline=None)
@given(block=narrow_blocks())
def test_narrow_value_heads_fuse_and_compute_the_same(block: Block) -> None:
    model = value_block(block)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    assert "Softmax" not in ops, misses(result, "attention")
    if block.sinks:  # padded to the query's head size, cut back after
        assert ops.count("GroupQueryAttention") == 1 and ops.count("Pad") == 1, ops
        assert "MultiHeadAttention" not in ops
    else:
        assert ops.count("MultiHeadAttention") == 1 and "Pad" not in ops, ops
    onnx.checker.check_model(fused, full_check=True)
    for batch, seq in ((2, 6), (1, 3)):
        run_both(model, fused, feeds=feeds(block, batch, seq, 0), **TOL)


def test_narrow_value_heads_with_a_cache_get_a_near_miss_that_says_why() -> None:
    block = Block(v_size=8, sinks=True, cache=True, scale="none")
    model = value_block(block)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    assert "Softmax" in [n.op_type for n in fused.graph.node]
    reasons = misses(result, "attention")
    want = "the KV cache's present value would be [B, 2, L, 16], not the graph's [B, 2, L, 8]"
    assert any(want in r for r in reasons), reasons
    run_both(model, fused, feeds=feeds(block, 2, 1, 4), **TOL)
