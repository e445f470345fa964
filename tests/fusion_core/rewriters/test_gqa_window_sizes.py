"""A sliding window's term is the mask's own queries and keys by proven sizes where the
proof decides, by the labels where it does not (``group_query_attention/_window.py``).

The model is the decoder block of test_group_query_attention.py with Mistral's window
``key > query - W``, its key index ``Range(0, n)`` with ``n`` 1 (a ``ScatterElements``
of the constant 1 into the sequence's length, which the proof reads and onnx's inference
does not), and the term labelled ``[1, 1, seq, past + seq]`` in ``value_info`` as the
mask is. So the term compares one key index, the same for every key ("query < W"): no
window. The old check read the label and gave the kernel ``local_window_size = W``,
which differs wherever a query is at ``W`` or later (all 32 outputs of a decode step
after 6 cached keys). Now the proof says 1 against the mask's ``past + seq``, the window
stays in the bias (a near miss says why) and the fusion is exact. The original runs only
where 1 broadcasts against the keys: a decode step (any cache) or an empty cache.

Where the proof leaves the sizes undecided (an inner value's own size, or one capped by
a constant: GPT-Neo's causal buffer sliced by computed bounds, ``min(S, max(0, 128 -
P))`` rows), the labels decide as before: measured on GPT-Neo's KV export (2
GroupQueryAttention, 104 nodes; its local layer's window term read by the labels).

Tolerance: rtol = atol = 1e-5 (as test_group_query_attention.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import misses, optimize_quiet, run_both
from tests.fusion_core.rewriters.test_group_query_attention import (
    ORT,
    TOTAL,
    decoder_attention,
    feeds,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
# the key index's length ``key_n``: 1, written into the sequence's length
KEY_LENGTH_ONE = [
    "seq_1 = Unsqueeze (seq_len, zero)",
    "one_v = ScatterElements (seq_1, zero, one_1)",
    "key_n = Squeeze (one_v, zero)",
]


def window_block(window: int) -> onnx.ModelProto:
    """The block with the window term's key index ``Range(0, key_n)``, labelled as long
    as the keys."""
    model = decoder_attention(window=window)
    nodes = list(model.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.output[0] == "in_window")
    text = [*KEY_LENGTH_ONE, "key_pos = Range (start, key_n, step)"]
    text.append("key_u = Unsqueeze (key_pos, axes_kv)")
    extra = [onnx.parser.parse_node(line) for line in text]
    nodes[at].input[0] = "key_u"
    del model.graph.node[:]
    model.graph.node.extend([*nodes[:at], *extra, *nodes[at:]])
    model.graph.initializer.append(nh.from_array(np.array([1], np.int64), "one_1"))
    label = oh.make_tensor_value_info("in_window", onnx.TensorProto.BOOL, [1, 1, "seq", TOTAL])
    model.graph.value_info.append(label)
    onnx.checker.check_model(model, full_check=True)
    return model


def _gqa(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]


def _window(node: onnx.NodeProto) -> int | None:
    found = [a.i for a in node.attribute if a.name == "local_window_size"]
    return found[0] if found else None


@SPELLINGS
@given(window=st.integers(1, 5), past=st.integers(0, 8), mask=st.sampled_from(["none", "left"]))
def test_a_window_term_proven_one_key_long_is_no_window(window, past, mask) -> None:
    model = window_block(window)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    (gqa,) = _gqa(fused)
    assert _window(gqa) is None
    reasons = misses(result, "attention")
    assert any("proven 1 long on its keys" in r and "past + seq" in r for r in reasons), reasons
    onnx.checker.check_model(fused, full_check=True)
    for batch, seq, cached in ((2, 1, past), (1, 1, window + past), (2, 3, 0)):
        run_both(model, fused, feeds=feeds(batch, seq, cached, mask), **TOL)
