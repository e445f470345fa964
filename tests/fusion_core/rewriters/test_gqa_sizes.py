"""GroupQueryAttention's decisions rest on sizes the graph proves, not on the labels an
inference put on its values (``group_query_attention/_proven.py``).

onnxruntime's symbolic inference labelled Kimi-Linear's padded length (the sequence
rounded up to a chunk) ``sequence``, the label of the unpadded length. Each model here
pads a tensor to a multiple of ``chunk`` by an amount computed from its shape (a ``Pad``
whose size no rule ties to another) and writes that merged label into ``value_info``:

* ``padded``: the whole block runs on the padded hidden states. The label names the
  input ``x``'s length, so the old rewriter read ``total_sequence_length`` from ``x``
  (the unpadded S, while the keys are P long): a fused model that cannot run or differs.
  Now the lengths are read from the key itself and the fusion is exact.
* ``cross``: only the keys and values are padded. The label made the key "as long as the
  query" (no KV cache), so the old rewriter fused a key GroupQueryAttention cannot take.
  Now it is refused with a near miss naming both proven lengths.
* ``shifted``: with a KV cache, the queries' positions start at a padded cache's length
  labelled ``past``. The old causal proof took the label for ``P`` and gave the kernel
  ``causal = 1``, which hides keys the graph's mask lets the queries see. Now the proof
  fails and the near miss names the query index's proven start.

Tolerance: rtol = atol = 1e-5 (as tests/fusion_core/rewriters/test_group_query_attention.py).
Example budget: ``AUTOFUSION_SPELLING_EXAMPLES`` (8 by default).
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import misses, op_sequence, optimize_quiet, run_both
from tests.fusion_core.decoder_text import MERGE, TEXT_CONSTANTS, graph_model

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "8"))
HIDDEN, HEADS, KV_HEADS, SIZE = 32, 4, 2, 8
GQA = "com.microsoft::GroupQueryAttention"
ORT = dict(target="onnxruntime", exclude=["qkv_merge", "kv_merge"])


def _inits(chunk: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(chunk)
    return {
        **TEXT_CONSTANTS,
        **{f"w{p}": rng.standard_normal((HIDDEN, n * SIZE)) * 0.3 for p, n in _HEADS.items()},
        "q_split": np.array([0, 0, HEADS, SIZE], np.int64),
        "kv_split": np.array([0, 0, KV_HEADS, SIZE], np.int64),
        "repeat": np.array([1, 1, HEADS // KV_HEADS, 1, 1], np.int64),
        "kv_merge": np.array([0, HEADS, -1, SIZE], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "chunk": np.array(chunk, np.int64),
        "zero": np.array([0], np.int64),
        "axis_2": np.array([2], np.int64),
        "zero_f": np.array(0.0, np.float32),
        "masked": np.array(np.finfo(np.float32).min, np.float32),
        "scale": np.array(SIZE**-0.5, np.float32),
    }


_HEADS = {"q": HEADS, "k": KV_HEADS, "v": KV_HEADS}


def _padded_lines(source: str, axis: int, rank: int) -> list[str]:
    """``{source}_p``: ``source`` padded at the end of ``axis`` by ``(-n) mod chunk``
    (n its length there), an amount the graph computes: its own size."""
    pads = ["zero"] * rank * 2
    pads[rank + axis] = f"{source}_grow"
    return [
        f"{source}_dims = Shape ({source})",
        f"{source}_len = Gather <axis = 0> ({source}_dims, index_{axis})",
        f"{source}_rem = Mod ({source}_len, chunk)",
        f"{source}_short = Sub (chunk, {source}_rem)",
        f"{source}_amount = Mod ({source}_short, chunk)",
        f"{source}_grow = Unsqueeze ({source}_amount, zero)",
        f"{source}_pads = Concat <axis = 0> ({', '.join(pads)})",
        f"{source}_p = Pad ({source}, {source}_pads)",
    ]


def _heads(p: str, source: str) -> list[str]:
    split = "q_split" if p == "q" else "kv_split"
    return [
        f"{p}m = MatMul ({source}, w{p})",
        f"{p}r = Reshape ({p}m, {split})",
        f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
    ]


def _attention(keys: str, values: str) -> list[str]:
    """repeat_kv, the scores, the finite mask ``bias`` (read from the lines before) and
    the context merged into ``y``."""
    lines = []
    for p, heads in (("k", keys), ("v", values)):
        lines += [
            f"{p}_u = Unsqueeze ({heads}, axis_2)",
            f"{p}_e = Expand ({p}_u, repeat)",
            f"{p}_rep = Reshape ({p}_e, kv_merge)",
        ]
    return lines + [
        "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
        "qk = MatMul (qt, kT)",
        "scores = Mul (qk, scale)",
        "biased = Add (scores, bias)",
        "probs = Softmax <axis = -1> (biased)",
        *MERGE[:-1],
    ]


def _positions(queries: str, keys: str, start: str = "start") -> list[str]:
    """The causal mask of query positions ``start + [0, len(queries))`` (axis 1) and key
    positions ``[0, len(keys))`` (axis 1 of ``keys``; axis 2 for a 4-D cache)."""
    key_axis = "index_2" if keys.startswith("present") else "index_1"
    return [
        f"q_dims = Shape ({queries})",
        "q_len = Gather <axis = 0> (q_dims, index_1)",
        f"q_end = Add ({start}, q_len)",
        f"q_pos = Range ({start}, q_end, step)",
        f"k_dims = Shape ({keys})",
        f"k_len = Gather <axis = 0> (k_dims, {key_axis})",
        "kv_pos = Range (start, k_len, step)",
        "kv_u = Unsqueeze (kv_pos, axes_kv)",
        "q_u = Unsqueeze (q_pos, axes_q)",
        "causal = LessOrEqual (kv_u, q_u)",
        "bias = Where (causal, zero_f, masked)",
    ]


def _labelled(model: onnx.ModelProto, labels: dict[str, list]) -> onnx.ModelProto:
    """Each value of ``labels`` labelled so in ``value_info``, and the key length the
    repeated heads have (``keys``) with them: the merged labels an inference gives."""
    for name, dims in labels.items():
        info = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)
        model.graph.value_info.append(info)
    return model


def _repeats(keys: str) -> dict[str, list]:
    """The labels of repeat_kv's values for a key length labelled ``keys``."""
    groups = HEADS // KV_HEADS
    labels = {f"{p}_e": ["batch", KV_HEADS, groups, keys, SIZE] for p in "kv"}
    return labels | {f"{p}_rep": ["batch", HEADS, keys, SIZE] for p in "kv"}


def padded_block(chunk: int, *, cross: bool) -> onnx.ModelProto:
    """The block on ``x`` padded to a multiple of ``chunk`` (``cross``: only its keys and
    values), the padded length labelled ``seq`` like ``x``'s."""
    body = _padded_lines("x", 1, 3)
    body += _heads("q", "x" if cross else "x_p") + _heads("k", "x_p") + _heads("v", "x_p")
    body += _positions("x" if cross else "x_p", "x_p") + _attention("kt", "vt")
    body.append("y = Reshape (ct, merge)")
    inputs = ["float[batch, seq, 32] x"]
    model = graph_model(inputs, ["float[batch, rows, 32] y"], body, _inits(chunk))
    labels = {"x_p": ["batch", "seq", HIDDEN], "bias": [1, 1, "seq", "seq"]}
    return _labelled(model, labels | _repeats("seq"))


def shifted_block(chunk: int) -> onnx.ModelProto:
    """A decode block whose query positions start at the length of the cache padded to a
    multiple of ``chunk`` along its keys, labelled ``past`` like the cache's."""
    body = _padded_lines("past_key", 2, 4)
    body += ["p_dims = Shape (past_key_p)", "p_len = Gather <axis = 0> (p_dims, index_2)"]
    body += _heads("q", "x") + _heads("k", "x") + _heads("v", "x")
    body += [
        "present_key = Concat <axis = 2> (past_key, kt)",
        "present_value = Concat <axis = 2> (past_value, vt)",
    ]
    body += _positions("x", "present_key", start="p_len") + _attention(
        "present_key", "present_value"
    )
    body.append("y = Reshape (ct, merge)")
    cache = [f"float[batch, {KV_HEADS}, past, {SIZE}] past_{p}" for p in ("key", "value")]
    outputs = ["float[batch, seq, 32] y"]
    outputs += [f"float[batch, {KV_HEADS}, total, {SIZE}] present_{p}" for p in ("key", "value")]
    model = graph_model(["float[batch, seq, 32] x", *cache], outputs, body, _inits(chunk))
    for value in model.graph.output:  # as the exporters name the key length
        for dim in value.type.tensor_type.shape.dim:
            dim.dim_param = "past + seq" if dim.dim_param == "total" else dim.dim_param
    return _labelled(
        model, {"past_key_p": ["batch", KV_HEADS, "past", SIZE], **_repeats("past + seq")}
    )


def _feeds(batch: int, seq: int, past: int | None = None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq * 10 + (past or 0))
    found = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)}
    if past is not None:
        for name in ("past_key", "past_value"):
            found[name] = rng.standard_normal((batch, KV_HEADS, past, SIZE)).astype(np.float32)
    return found


@settings(max_examples=EXAMPLES, deadline=None)
@given(chunk=st.integers(2, 8), seqs=st.lists(st.integers(1, 12), min_size=1, max_size=3))
def test_a_padded_length_labelled_as_the_input_is_read_from_the_key(chunk, seqs) -> None:
    model = padded_block(chunk, cross=False)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    assert op_sequence(fused).count(GQA) == 1, misses(result, "attention")
    onnx.checker.check_model(fused, full_check=True)
    for seq in seqs:  # padded or not: the lengths the kernel takes are the key's
        run_both(model, fused, feeds=_feeds(2, seq), **TOL)


@settings(max_examples=EXAMPLES, deadline=None)
@given(chunk=st.integers(2, 8))
def test_a_key_only_labelled_as_long_as_the_query_is_refused(chunk) -> None:
    model = padded_block(chunk, cross=True)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    assert GQA not in op_sequence(fused)
    reasons = misses(result, "attention")
    want = "must be as long as the query"
    assert any(want in r and "x_p[1]" in r for r in reasons), reasons
    for seq in (1, chunk + 1, 2 * chunk):  # whatever it became computes what the graph does
        run_both(model, fused, feeds=_feeds(2, seq), **TOL)


@settings(max_examples=EXAMPLES, deadline=None)
@given(chunk=st.integers(2, 8))
def test_query_positions_after_a_cache_labelled_past_are_not_proven_causal(chunk) -> None:
    model = shifted_block(chunk)
    result = optimize_quiet(model, **ORT)
    fused = result.to_proto()
    assert GQA not in op_sequence(fused)
    reasons = misses(result, "attention")
    want = "its first position is past_key_p[2]"
    assert any("not Range(P, P + S)" in r and want in r for r in reasons), reasons
    for seq, past in ((1, 1), (3, chunk + 1), (2, 0)):
        run_both(model, fused, feeds=_feeds(2, seq, past), **TOL)
