"""``heads_in_batch`` on a KV-cache graph: BLOOM's decode step folds the heads into the
batch (``baddbmm``) over keys concatenated to the past ones, and adds an ALiBi bias read
from the attention mask. The bias's key length (the mask's, ``total``) is a symbol other
than the scores' (``past + seq``): equal at run time, unproven in the graph. The unfold
keeps the bias's trailing sizes as they are, so the Add broadcasts as before whatever they
are: the product, the scale and the bias move after the unfold all the same, exactly."""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, optimize_quiet, run_both

EXACT = dict(rtol=0, atol=0)

CACHED = """<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, {n}, seq, {h}] q, float[batch, {n}, seq, {h}] k_new,
   float[batch, {n}, seq, {h}] v_new, float[batch, {n}, past, {h}] past_k,
   float[batch, {n}, past, {h}] past_v, float[batch, {n}, total] alibi)
   => (float[batch, {n}, seq, {h}] y) {{
    k = Concat <axis = 2> (past_k, k_new)
    v = Concat <axis = 2> (past_v, v_new)
    q_shape = Shape (q)
    s = Slice (q_shape, two, three)
    k_shape = Shape (k)
    l = Slice (k_shape, two, three)
    b = Slice (q_shape, zero, one)
    rows = Mul (b, heads)
    q_fold = Concat <axis = 0> (rows, s, size)
    kv_fold = Concat <axis = 0> (rows, l, size)
    q3 = Reshape (q, q_fold)
    k3 = Reshape (k, kv_fold)
    v3 = Reshape (v, kv_fold)
    kT3 = Transpose <perm = [0, 2, 1]> (k3)
    scores3 = MatMul (q3, kT3)
    scaled3 = Mul (scores3, alpha)
    alibi_shape = Shape (alibi)
    t = Slice (alibi_shape, two, three)
    alibi_fold = Concat <axis = 0> (rows, one, t)
    alibi3 = Reshape (alibi, alibi_fold)
    biased3 = Add (scaled3, alibi3)
    unfold = Concat <axis = 0> (b, heads, s, minus_one)
    scores = Reshape (biased3, unfold)
    probs = Softmax <axis = -1> (scores)
    probs_fold = Concat <axis = 0> (rows, s, minus_one)
    probs3 = Reshape (probs, probs_fold)
    context3 = MatMul (probs3, v3)
    context_unfold = Concat <axis = 0> (b, heads, s, size)
    context = Reshape (context3, context_unfold)
    y = Neg (context)
}}"""


def _cached(heads: int, size: int) -> onnx.ModelProto:
    """The graph with the exporter's shapes: the keys' length ``past + seq`` (of the
    Concat), the mask's ``total``, the folded batch ``N*batch`` (as ``torch.export``
    declares them)."""
    model = build_model(CACHED.format(n=heads, h=size), _ints(heads, size))
    rows, keys = f"{heads}*batch", "past + seq"
    declared = {
        "k": ["batch", heads, keys, size],
        "v": ["batch", heads, keys, size],
        "k3": [rows, keys, size],
        "kT3": [rows, size, keys],
        "scores3": [rows, "seq", keys],
        "scaled3": [rows, "seq", keys],
        "biased3": [rows, "seq", keys],
        "scores": ["batch", heads, "seq", keys],
        "probs": ["batch", heads, "seq", keys],
    }
    model.graph.value_info.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)
        for name, dims in declared.items()
    )
    return model


def _ints(heads: int, size: int) -> dict:
    return {
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "three": np.array([3], np.int64),
        "minus_one": np.array([-1], np.int64),
        "size": np.array([size], np.int64),
        "heads": np.array([heads], np.int64),
        "alpha": np.array(0.5, np.float32),
    }


def _feeds(rng, batch: int, heads: int, size: int, seq: int, past: int) -> dict:
    new, old = (batch, heads, seq, size), (batch, heads, past, size)
    shapes = {"q": new, "k_new": new, "v_new": new, "past_k": old, "past_v": old}
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    slopes = rng.random((1, heads, 1)) * np.arange(past + seq)  # ALiBi: slope x position
    feeds["alibi"] = np.broadcast_to(slopes, (batch, heads, past + seq)).astype(np.float32)
    return feeds


@settings(max_examples=4, deadline=None)
@given(
    heads=st.integers(2, 3),  # one head: the fold is no fold
    size=st.sampled_from([2, 4]),
    batch=st.integers(1, 2),
    seq=st.integers(1, 3),
    past=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_folded_attention_over_cached_keys_with_the_masks_alibi_is_per_head(
    heads, size, batch, seq, past, seed
) -> None:
    model = _cached(heads, size)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    producer = {o: n for n in canonical.graph.node for o in n.output}
    softmax = next(n for n in canonical.graph.node if n.op_type == "Softmax")
    chain, node = [], producer[softmax.input[0]]
    while node.op_type in ("Add", "Mul"):
        chain.append(node.op_type)
        node = producer[node.input[0]]
    # the 4-D product, then its scale and the unfolded bias: no unfold before the Softmax
    assert (chain, node.op_type) == (["Add", "Mul"], "MatMul"), (chain, node.op_type)
    feeds = _feeds(np.random.default_rng(seed), batch, heads, size, seq, past)
    run_both(model, canonical, feeds=feeds, **EXACT)
