"""Rule ``value_scale``: values scaled by a constant after their head split (MiMo-V2-Flash's
``v * v_scale``) are the head split of the projection so scaled, and the attention over
them fuses once, in every spelling the rule reads (Mul or Div; one number, one per head,
one per channel, or both; after the head Transpose or before it; with or without
repeat_kv, a KV cache and attention sinks). The moved scale is the same product of the
same numbers, and the fused op computes what the block did: rtol = atol = 1e-5, as in
tests/fusion_core/rewriters/test_group_query_attention.py (the kernels sum in another
order; at these sizes the outputs differ by about 1e-6). Where nothing fuses, the scale
is written after the head Transpose again."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import misses, optimize_quiet, run_both
from tests.fusion_core.value_block import Block, feeds, value_block

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
ATTENTION_OPS = ("GroupQueryAttention", "MultiHeadAttention")

blocks = st.builds(
    Block,
    heads=st.sampled_from([2, 4]),
    kv_heads=st.just(2),
    op=st.sampled_from(["Mul", "Div"]),
    scale=st.sampled_from(["scalar", "head", "channel", "both"]),
    place=st.sampled_from(["after", "between"]),
    cache=st.booleans(),
    sinks=st.booleans(),
)

# the example budget: 16 in `make test`, AUTOFUSION_SPELLING_EXAMPLES in the corpus tier
EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "16"))


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@settings(max_examples=EXAMPLES, deadline=None)
@given(block=blocks)
def test_scaled_values_fuse_once_and_compute_the_same(block: Block) -> None:
    model = value_block(block)
    result = optimize_quiet(model, target="onnxruntime")
    fused = result.to_proto()
    ops = _ops(fused)
    assert "Softmax" not in ops, misses(result, "attention")
    assert sum(ops.count(op) for op in ATTENTION_OPS) == 1, ops
    (scale,) = [n for n in fused.graph.node if n.op_type == block.op]  # moved, not copied
    assert scale.input[0] == "vm"  # on the value projection
    onnx.checker.check_model(fused, full_check=True)
    shapes = [(2, 1, 4), (1, 3, 2)] if block.cache else [(2, 6, 0), (1, 4, 0)]
    for batch, seq, past in shapes:
        run_both(model, fused, feeds=feeds(block, batch, seq, past), **TOL)


def test_the_moved_scale_is_the_same_product_bit_for_bit() -> None:
    """The canonical form alone (attention left out): exact, not within a tolerance."""
    block = Block(scale="both", place="after", op="Div")
    model = value_block(block)
    canonical = optimize_quiet(model, target="onnxruntime", exclude=["attention"]).to_proto()
    run_both(model, canonical, feeds=feeds(block, 2, 5, 0), rtol=0, atol=0)


def test_a_scale_no_fusion_took_is_written_after_the_head_transpose_again() -> None:
    block = Block(scale="both", place="between")
    model = value_block(block)
    result = optimize_quiet(model, target="onnxruntime", exclude=["attention"])
    fused = result.to_proto()
    producers = {o: n for n in fused.graph.node for o in n.output}
    (scale,) = [n for n in fused.graph.node if n.op_type == "Mul" and n.input[0] == "vt"]
    turn = producers[scale.input[0]]  # the value's head Transpose, reading its Reshape again
    assert turn.op_type == "Transpose" and producers[turn.input[0]].op_type == "Reshape"
    assert producers[turn.input[0]].input[0] == "vm"
    (constant,) = [t for t in fused.graph.initializer if t.name == scale.input[1]]
    assert list(constant.dims) == [1, block.kv_heads, 1, block.v_size]
    run_both(model, fused, feeds=feeds(block, 2, 5, 0), rtol=0, atol=0)


def test_a_scale_that_varies_with_the_position_stays() -> None:
    """``[1, 1, S, 1]`` after the Transpose is a scale per position, not per channel: the
    rule leaves it, and with sinks (GroupQueryAttention's alone) the attention names the
    value it cannot read."""
    block = Block(scale="scalar", sinks=True)
    model = value_block(block)
    (init,) = [t for t in model.graph.initializer if t.name == "v_scale"]
    per_position = np.linspace(0.5, 1.0, 6, dtype=np.float32).reshape(1, 1, 6, 1)
    init.CopyFrom(onnx.numpy_helper.from_array(per_position, "v_scale"))
    result = optimize_quiet(model, target="onnxruntime")
    assert "Softmax" in _ops(result.to_proto())
    reasons = misses(result, "attention")
    assert any("the value 'v_scaled' is not a head split" in r for r in reasons), reasons
