"""An fp16 decoder's attention with a KV cache becomes GroupQueryAttention with past and
present, as the float32 one does (tests/fusion_core/rewriters/test_group_query_attention.py):
the bias rebuilt from the mask and the rows to keep are built in float16.

The block is a decoder layer's attention in float16 throughout (weights, activations, the
cache and the mask), the mask ``causal AND padding`` spelled four ways:

* ``sdpa_inf``: TorchScript's SDPA, ``Where(allowed, 0, -inf)`` and the NaN guard after the
  Softmax (a row with nothing to attend to is 0), the scale on the scores (the canonical
  ``scale_to_scores`` moves SDPA's split scale there for float32 only, so far);
* ``sdpa_lowest``: the same with float16's lowest, -65504, for -inf;
* ``eager_lowest``: eager attention, ``finfo(float16).min`` = -65504, no guard;
* ``eager_clipped``: -1e4, what onnxruntime's float16 converter (``max_finite_val=1e4``)
  makes of float32's lowest.

onnxruntime 1.32's CPU GroupQueryAttention runs float16 with past/present, ``seqlens_k``,
``total_sequence_length``, ``query_seqlens`` and a float16 ``attention_bias`` (probed with
one-node models); it adds the bias in float32, so float16's lowest leaves a fully masked
row finite (-inf would make it NaN, which 0 times the row to keep leaves NaN: -inf becomes
-65504).

Tolerance. The fused block rounds where the kernel does (once, its softmax in float32),
the original after each op (scores, softmax, context in float16). Both are held against
the same graph computed in float32 (``in_float32``, the check's own noise floor): the
fused block's error is at most twice the original's own plus 2e-3 (one float16 rounding
at |y| up to 2), and fused and original agree within rtol 1e-2, atol 1e-2. A wrong mask
or cache moves outputs by O(0.1-1).

A row with nothing to attend to (a padded query). Under ``sdpa_inf`` it is 0 in both.
Under a finite mask the original's row is the softmax of its scores over every key:
onnxruntime's CPU has no float16 Add or Softmax kernel and runs both in float32 between
Casts, where ``m + s`` keeps ``s`` (measured). The kernel adds its bias in float32 too,
so the last query's row (it sees every key: each decode step's) keeps the kernel's
output, exact; the earlier ones of a prefill take the mean of the cache's values, the
uniform average, near the original's only where the scores are small (a normed
model's, not this block's). Those rows, which only padded positions have and
generation never reads, are left out of the comparison (``_exact_rows``); every other
row is compared.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.testing import misses, op_sequence, optimize_quiet
from autofusion.fusion_core.validate import in_float32
from tests.fusion_core.decoder_text import CAUSAL, PADDING, kv_cache, positions

Spelling = Literal["sdpa_inf", "sdpa_lowest", "eager_lowest", "eager_clipped", "sdpa_split"]
SPELLINGS: tuple[Spelling, ...] = ("sdpa_inf", "sdpa_lowest", "eager_lowest", "eager_clipped")
MASKED = {"sdpa_inf": -np.inf, "sdpa_lowest": -65504.0, "eager_lowest": -65504.0}
MASKED |= {"eager_clipped": -1e4, "sdpa_split": -np.inf}
HIDDEN, SIZE = 32, 8
GQA = "com.microsoft::GroupQueryAttention"
ORT = dict(target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
AGREE = dict(rtol=1e-2, atol=1e-2)  # fused against original (see the docstring)


def fp16_attention(heads: int, kv_heads: int, spelling: Spelling) -> onnx.ModelProto:
    """One attention block in float16 with a KV cache: ``heads`` query heads share
    ``kv_heads`` of size 8, the mask spelled as ``spelling`` says."""
    rng = np.random.default_rng(heads * 10 + kv_heads)
    groups = heads // kv_heads
    inits = {
        "wq": rng.standard_normal((HIDDEN, heads * SIZE)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, kv_heads * SIZE)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, kv_heads * SIZE)) * 0.3,
        "zero_f": np.array(0.0),
        "masked": np.array(MASKED[spelling]),
        "scale": np.array(SIZE**-0.5),
        "root_scale": np.array(SIZE**-0.25),
    }
    inits = {k: v.astype(np.float16) for k, v in inits.items()}
    inits |= {
        name: np.array(value, np.int64)
        for name, value in {
            "q_split": [0, 0, heads, SIZE], "kv_split": [0, 0, kv_heads, SIZE],
            "repeat": [1, 1, groups, 1, 1], "kv_merge": [0, heads, -1, SIZE],
            "merge": [0, 0, heads * SIZE], "axes_kv": [0, 1, 2], "axes_q": [0, 1, 3],
            "axes_pad": [1, 2], "axis_2": [2], "index_1": 1, "index_2": 2, "start": 0,
            "step": 1,
        }.items()
    }  # fmt: skip
    body = []
    for p, split in (("q", "q_split"), ("k", "kv_split"), ("v", "kv_split")):
        body += [
            f"{p}m = MatMul (x, w{p})",
            f"{p}r = Reshape ({p}m, {split})",
            f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)",
        ]
    cache = kv_cache(True, kv_heads, SIZE, "total", new=("kt", "vt"))
    body += cache.body
    for p, source in (("k", cache.key), ("v", cache.value)):
        body += (
            [f"{p}_u = Unsqueeze ({source}, axis_2)", f"{p}_e = Expand ({p}_u, repeat)"]
            + [f"{p}_rep = Reshape ({p}_e, kv_merge)"]
            if groups > 1
            else [f"{p}_rep = Identity ({source})"]
        )
    body += [*positions(), CAUSAL, *PADDING, "allowed = And (causal, padding)"]
    body += [
        "bias = Where (allowed, zero_f, masked)",
        "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
    ]
    if spelling == "sdpa_split":  # sqrt of the scale on each side, as SDPA exports it
        body += [
            "qs = Mul (qt, root_scale)",
            "ks = Mul (kT, root_scale)",
            "scores = MatMul (qs, ks)",
        ]
    else:
        body += ["qk = MatMul (qt, kT)", "scores = Mul (qk, scale)"]
    body.append("biased = Add (scores, bias)")
    if spelling.startswith("sdpa"):
        body += [
            "p = Softmax <axis = -1> (biased)",
            "nan = IsNaN (p)",
            "probs = Where (nan, zero_f, p)",
        ]
    else:
        body.append("probs = Softmax <axis = -1> (biased)")
    body += [
        "context = MatMul (probs, v_rep)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge)",
    ]
    inputs = [f"float16[batch, seq, {HIDDEN}] x", "int64[batch, total] attention_mask"]
    inputs += [i.replace("float[", "float16[") for i in cache.inputs]
    outputs = [f"float16[batch, seq, {heads * SIZE}] y"]
    outputs += [o.replace("float[", "float16[") for o in cache.outputs]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({", ".join(inputs)}) => ({", ".join(outputs)}) {{
        {chr(10).join(body)}
    }}"""
    model = onnx.parser.parse_model(text)
    for name, array in inits.items():
        model.graph.initializer.append(nh.from_array(array, name))
    for value in [*model.graph.input, *model.graph.output]:  # named as optimum names it
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "total":
                dim.dim_param = "past + seq"
    onnx.checker.check_model(model, full_check=True)
    return model


def fp16_feeds(
    shape: tuple[int, int, int], kv_heads: int, padding: str, *, seed: int
) -> dict[str, np.ndarray]:
    """``(batch, new tokens, past)`` feeds: the last batch padded as ``padding`` says
    (``left``, ``right``, ``random`` holes) or none."""
    batch, seq, past = shape
    rng = np.random.default_rng(seed)
    total = past + seq
    mask = np.ones((batch, total), np.int64)
    if padding == "left":
        mask[-1, : min(2, total - 1)] = 0
    elif padding == "right":
        mask[-1, -1:] = 0
    elif padding == "random":
        mask = rng.integers(0, 2, (batch, total)).astype(np.int64)
    cache = [rng.standard_normal((batch, kv_heads, past, SIZE)).astype(np.float16) for _ in "kv"]
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float16),
        "attention_mask": mask,
        "past_key": cache[0],
        "past_value": cache[1],
    }


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def fuse(model: onnx.ModelProto) -> onnx.ModelProto:
    """The block as one GroupQueryAttention with the cache, valid ONNX."""
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"attention": 1}, (result.counts, misses(result, "attention"))
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    assert list(gqa.input[3:5]) == ["past_key", "past_value"]
    assert list(gqa.output[1:]) == ["present_key", "present_value"]
    assert {a.name: a.i for a in gqa.attribute if a.type == onnx.AttributeProto.INT}["causal"] == 1
    assert "Softmax" not in op_sequence(fused)
    return fused


class Runs:
    """The float32 computation of the original, the original and the fused model."""

    def __init__(self, model: onnx.ModelProto, fused: onnx.ModelProto) -> None:
        with in_float32(model):  # edited in place for the block
            self.truth = _session(model)
        self.original, self.fused = _session(model), _session(fused)

    def compare(self, feeds: dict[str, np.ndarray], rows: np.ndarray | None = None) -> None:
        """Every output (``rows``: of ``y``, those ``[B, S]`` rows only) as the docstring
        says: near the original, and no further from float32 than twice its own error."""
        names = [o.name for o in self.original.get_outputs()]
        exact, before, after = (
            s.run(names, feeds) for s in (self.truth, self.original, self.fused)
        )
        for name, want, old, new in zip(names, exact, before, after, strict=True):
            old, new = old.astype(np.float32), new.astype(np.float32)
            if name == "y" and rows is not None:
                want, old, new = want[rows], old[rows], new[rows]
            own = float(np.abs(old - want).max(initial=0))
            error = float(np.abs(new - want).max(initial=0))
            assert error <= 2 * own + 2e-3, (name, error, own)
            np.testing.assert_allclose(new, old, err_msg=name, **AGREE)


def _exact_rows(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """``[B, S]``: the query rows with a key to attend to (causal and padding), and the
    last query's, which sees every key (see the docstring)."""
    mask, seq = feeds["attention_mask"].astype(bool), feeds["x"].shape[1]
    past = mask.shape[1] - seq
    seen = np.cumsum(mask, axis=1)[:, past:]
    return (seen > 0) | (np.arange(seq) == seq - 1)


@functools.cache
def fused_runs(heads: int, kv_heads: int, spelling: Spelling) -> Runs:
    """The block of these heads and mask, fused once for every example that uses it."""
    model = fp16_attention(heads, kv_heads, spelling)
    return Runs(model, fuse(model))


@settings(max_examples=30, deadline=None)
@given(
    heads_and_kv=st.sampled_from([(4, 2), (4, 1), (4, 4), (8, 2), (6, 3)]),
    spelling=st.sampled_from(SPELLINGS),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 9)),
    padding=st.sampled_from(["none", "left", "right", "random"]),
    seed=st.integers(0, 2**16),
)
def test_an_fp16_block_with_a_cache_becomes_group_query_attention(
    heads_and_kv, spelling, shape, padding, seed
) -> None:
    heads, kv_heads = heads_and_kv
    runs = fused_runs(heads, kv_heads, spelling)
    feeds = fp16_feeds(shape, kv_heads, padding, seed=seed)
    finite = spelling != "sdpa_inf"  # a prefill's fully masked rows differ (docstring)
    runs.compare(feeds, rows=_exact_rows(feeds) if finite else None)


@pytest.mark.parametrize("spelling", ["sdpa_inf", "eager_lowest"])
def test_four_fp16_steps_with_the_cache_match(spelling) -> None:
    """A prefill of 5 tokens with an empty cache, then three decode steps that feed the
    presents back, a batch of two, the second left-padded: each step's output and cache
    as the docstring says (``_exact_rows``)."""
    runs = fused_runs(4, 2, spelling)
    states = [fp16_feeds((2, 5, 0), 2, "left", seed=1) for _ in "of"]
    rng = np.random.default_rng(2)
    for _ in range(4):
        runs.compare(states[0], rows=_exact_rows(states[0]))
        outs = [s.run(None, f) for s, f in zip((runs.original, runs.fused), states, strict=True)]
        x = rng.standard_normal((2, 1, HIDDEN)).astype(np.float16)
        for state, (_, key, value) in zip(states, outs, strict=True):
            state.update(
                x=x,
                attention_mask=np.pad(state["attention_mask"], ((0, 0), (0, 1)), constant_values=1),
                past_key=key,
                past_value=value,
            )
        assert states[1]["past_key"].shape[2] == states[1]["attention_mask"].shape[1] - 1


def test_the_checked_fp16_block_keeps_group_query_attention() -> None:
    """The engine's own check, with its float16 noise floor, passes the fused block. (Its
    random masks leave prefill rows with nothing to attend to, which differ under the
    finite masks (docstring): on this block's unnormed scores it fails there, and falls
    back; the real exports of the benchmarks pass it.)"""
    spelling = "sdpa_inf"
    config = OptimizeConfig(**ORT, target_profile="cpu-roofline")
    result = optimize(fp16_attention(4, 2, spelling), config)
    assert result.check.passed, result.check
    assert op_sequence(result.to_proto()).count(GQA) == 1


def test_an_fp16_mask_that_does_not_mask_becomes_multi_head_attention() -> None:
    """-100 in float16 is not a mask's lowest (a score 100 above the others would leak
    through it): with a cache GroupQueryAttention must be causal, which the mask is not
    shown to be, so the grouped heads go to MultiHeadAttention over the repeated key and
    value heads, with the mask as its bias, which is exact for any additive mask."""
    model = fp16_attention(4, 2, "eager_lowest")
    (masked,) = [t for t in model.graph.initializer if t.name == "masked"]
    masked.CopyFrom(nh.from_array(np.array(-100.0, np.float16), "masked"))
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"attention": 1}, (result.counts, misses(result, "attention"))
    fused = result.to_proto()
    ops = op_sequence(fused)
    assert "com.microsoft::MultiHeadAttention" in ops and GQA not in ops, ops
    runs = Runs(model, fused)
    for shape, padding in (((2, 3, 4), "left"), ((1, 1, 6), "random"), ((2, 4, 0), "right")):
        runs.compare(fp16_feeds(shape, 2, padding, seed=3))  # every row: the bias is exact


def test_an_fp16_sdpa_split_scale_with_a_cache_becomes_group_query_attention() -> None:
    """SDPA's export scales Q and K^T by the root of the scale each (``sdpa_split``, the
    -inf mask and the NaN guard); once the canonical form moves that scale onto float16
    scores, the block fuses as the others do."""
    runs = fused_runs(4, 2, "sdpa_split")
    runs.compare(fp16_feeds((2, 3, 4), 2, "random", seed=0))


def test_an_fp16_encoder_with_an_infinite_mask_becomes_multi_head_attention() -> None:
    """The same finite mask and rows to keep serve MultiHeadAttention (``guarded_mask``):
    an fp16 encoder block (no cache, a mask per batch) with ``-inf`` and the NaN guard
    fuses, the rows to keep in float16, a fully masked batch 0 in both."""
    rng = np.random.default_rng(4)
    inits = {f"w{p}": rng.standard_normal((HIDDEN, HIDDEN)) * 0.25 for p in "qkv"}
    inits |= {"zero_f": np.array(0.0), "masked": np.array(-np.inf), "scale": np.array(0.35)}
    inits = {k: v.astype(np.float16) for k, v in inits.items()}
    inits |= {
        "split": np.array([0, 0, 4, HIDDEN // 4], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
    }
    body = ["bias = Where (keep, zero_f, masked)"]
    for p in "qkv":
        body += [f"{p}m = MatMul (x, w{p})", f"{p}r = Reshape ({p}m, split)"]
        body.append(f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}r)")
    body += [
        "kT = Transpose <perm = [0, 1, 3, 2]> (kt)",
        "qk = MatMul (qt, kT)",
        "scores = Mul (qk, scale)",
        "biased = Add (scores, bias)",
        "p = Softmax <axis = -1> (biased)",
        "nan = IsNaN (p)",
        "probs = Where (nan, zero_f, p)",
        "context = MatMul (probs, vt)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "y = Reshape (ct, merge)",
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float16[batch, seq, {HIDDEN}] x, bool[batch, 1, seq, seq] keep)
        => (float16[batch, seq, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(nh.from_array(a, n) for n, a in inits.items())
    result = optimize_quiet(model, **ORT)
    assert result.counts == {"attention": 1}, misses(result, "attention")
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    assert op_sequence(fused)[-3:] == ["Cast", "com.microsoft::MultiHeadAttention", "Mul"]
    keep = rng.random((2, 1, 5, 5)) < 0.7
    keep[0] = False
    feeds = {"x": rng.standard_normal((2, 5, HIDDEN)).astype(np.float16), "keep": keep}
    runs = Runs(model, fused)
    runs.compare(feeds)
    assert not np.any(runs.fused.run(None, feeds)[0][0])
