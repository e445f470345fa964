"""A head split whose sequence the size proof leaves undecided is read from the labels
(``rewriters/_attention_shapes.py``, b26dca0): LFM2's KV graph.

LFM2's attention layer reads hidden states that came through its short convolution's
state and a padding-mask multiply, whose length no rule ties to the graph's inputs (a
value's own size), while the head-split Reshape's target is read from the input's shape
(``seq``, declared). The proof can say neither equal nor different, and at 53061f7 the
rewriter refused ("does not keep [B, S]"): LFM2 lost its GroupQueryAttention. Here the
hidden states are ``x`` padded by an amount computed from the mask (a maximum of its
zeros: 0, which no size rule reads), labelled ``[batch, seq, 32]`` as the exporter
labels them, and the three head splits' targets are ``Concat(Shape(x)[:2], [N, H])``.
The labels decide: one GroupQueryAttention, exact, with and without a cache.

Checked against 53061f7's behaviour by putting its ``_keeps_axes`` back (a size not
proven equal refuses) in a worktree of HEAD: the test fails there with no
GroupQueryAttention. Tolerance: rtol = atol = 1e-5 (as test_group_query_attention.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import misses, op_sequence, optimize_quiet, run_both
from tests.fusion_core.rewriters.test_group_query_attention import (
    GQA,
    HEADS,
    HIDDEN,
    KV_HEADS,
    ORT,
    SIZE,
    decoder_attention,
    feeds,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
# ``h``: ``x`` padded at the end of its sequence by 0 rows, an amount computed from the mask
HIDDEN_STATES = [
    "mask_zeros = Sub (attention_mask, attention_mask)",
    "no_rows = ReduceMax <keepdims = 0> (mask_zeros)",
    "no_rows_1 = Unsqueeze (no_rows, zero)",
    "pads_h = Concat <axis = 0> (zero, zero, zero, zero, no_rows_1, zero)",
    "h = Pad (x, pads_h)",
    "x_dims = Shape (x)",
    "x_lead = Slice (x_dims, zero, axis_2)",
    "q_target = Concat <axis = 0> (x_lead, q_heads)",
    "kv_target = Concat <axis = 0> (x_lead, kv_heads)",
]


def conv_state_block(cache: bool) -> onnx.ModelProto:
    """decoder_attention's block with q, k and v projected from ``h`` and split by targets
    read from ``x``'s shape."""
    model = decoder_attention(cache=cache)
    nodes = list(model.graph.node)
    targets = {"q_split": "q_target", "kv_split": "kv_target"}
    for node in nodes:
        if node.op_type == "MatMul" and node.output[0] in ("qm", "km", "vm"):
            node.input[0] = "h"
        if node.op_type == "Reshape" and node.input[1] in targets:
            node.input[1] = targets[node.input[1]]
    first = next(i for i, n in enumerate(nodes) if n.output[0] == "qm")
    extra = [onnx.parser.parse_node(line) for line in HIDDEN_STATES]
    del model.graph.node[:]
    model.graph.node.extend([*nodes[:first], *extra, *nodes[first:]])
    heads = {"q_heads": [HEADS, SIZE], "kv_heads": [KV_HEADS, SIZE]}
    for name, value in heads.items():
        model.graph.initializer.append(nh.from_array(np.array(value, np.int64), name))
    label = oh.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    model.graph.value_info.append(label)  # as the exporter labels the hidden states
    onnx.checker.check_model(model, full_check=True)
    return model


@SPELLINGS
@given(
    cache=st.booleans(),
    shape=st.sampled_from([(1, 1, 5), (2, 3, 4), (2, 1, 0), (3, 4, 1)]),
    mask=st.sampled_from(["none", "left", "right"]),
)
def test_a_head_split_the_proof_leaves_undecided_is_read_by_its_labels(cache, shape, mask):
    model = conv_state_block(cache)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    assert op_sequence(fused).count(GQA) == 1, misses(result, "attention")
    onnx.checker.check_model(fused, full_check=True)
    batch, seq, past = shape
    run_both(model, fused, feeds=feeds(batch, seq, past, mask, cache=cache), **TOL)
