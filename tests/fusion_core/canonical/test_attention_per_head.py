"""Generated attention blocks whose context is read per head, or whose grouped heads
take a mask GroupQueryAttention cannot (canonical rules ``one_context`` and
``context_heads``; ``attention``'s ``grouped_multi_head_attention``).

A generator (hypothesis) writes one attention block, drawing:

* the query heads, the key/value heads (equal, or fewer and repeated: by repeat_kv, or
  in block order by a Tile of the heads, as JetMoE's mixture of attention heads does,
  which is no grouping GroupQueryAttention has), the head size and the value's head
  size (the query's or its own);
* the context computed once, or as two contexts of one softmax joined on the last axis
  (two halves of the value's heads, each repeated to the key's heads: differential
  attention; with grouped heads only: with as many key/value heads as query heads the
  joined value is no head split, which is left);
* how the context is read: merged as usual, or per head after the head Transpose (the
  Sub of two halves of the heads, a per-head RMS norm, a Mul by a weight per head);
* no mask, or an additive mask fed as a graph input (``[B, 1, S, S]`` or
  ``[B, N, S, S]``: computed from the values, as Doge's, so neither causal nor a Where
  of finite constants).

Every block must come out as exactly one attention op with no Softmax left, and
compute what the original computes (onnxruntime, its optimizations off): rtol = atol =
1e-5 (the fused kernel sums in another order; outputs differ by about 1e-6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import canonical_twice, fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.spelling_settings import EXAMPLES, SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 16
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention", "Attention")
READS = ("merged", "sub_halves", "norm", "mul", "mul_before_transpose", "gate_before_transpose")
# after the head Transpose: a scale per head and channel (nGPT's s_qk), then a shift and a
# scalar Div
QUERIES = ("plain", "scaled", "scaled_shifted")


@dataclass(frozen=True)
class Block:
    heads: int
    kv_heads: int
    size: int
    value_size: int
    two_contexts: bool  # two contexts of one softmax over halves of the value's heads
    read: str  # how the context is read (READS)
    mask: str  # "none", "batch" ([B, 1, S, S]) or "heads" ([B, N, S, S])
    repeat: str = "expand"  # repeat_kv ("expand") or the heads in block order ("tile")
    query: str = "plain"  # QUERIES: the query heads as the scores read them


@st.composite
def blocks(draw) -> Block:
    two = draw(st.booleans())
    kv = draw(st.sampled_from([2, 4]))
    heads = draw(st.sampled_from([h for h in (2, 4, 8) if h >= kv]))
    tile = heads > kv and not two and draw(st.booleans())
    return Block(
        heads=heads,
        kv_heads=kv,
        size=draw(st.sampled_from([4, 8])),
        value_size=draw(st.sampled_from([4, 6, 8])),
        two_contexts=two,
        read=draw(st.sampled_from(READS)),
        mask=draw(st.sampled_from(["none", "batch", "heads"])),
        repeat="tile" if tile else "expand",
        query=draw(st.sampled_from(QUERIES)),
    )


def _repeat(name: str, source: str, s: Block, size: int) -> list[str]:
    """``{name}``: ``source`` [B, KV, S, size] repeated to the query's heads (or as it is)."""
    if s.kv_heads == s.heads:
        return [f"{name} = Identity ({source})"]
    group, target = s.heads // s.kv_heads, f"rep_{size}"
    if s.repeat == "tile":  # head i reads KV head i % KV: [k0, k1, k0, k1]
        return [f"{name} = Tile ({source}, tile_group_{group})"]
    return [
        f"{name}_u = Unsqueeze ({source}, axis_2)",
        f"{name}_e = Expand ({name}_u, group_{group})",
        f"{name} = Reshape ({name}_e, {target})",
    ]


def _values(s: Block) -> list[str]:
    """``context`` = P @ V for the drawn values (one, or two joined on the last axis)."""
    lines = ["vm = MatMul (x, wv)", "vr = Reshape (vm, v_split)"]
    lines.append("vt = Transpose <perm = [0, 2, 1, 3]> (vr)")
    if not s.two_contexts:
        return [*lines, *_repeat("v_rep", "vt", s, s.value_size), "context = MatMul (probs, v_rep)"]
    lines.append("va, vb = Split <axis = 1, num_outputs = 2> (vt)")
    for part in ("va", "vb"):  # each half of the KV heads repeated back to KV heads
        lines += [
            f"{part}_t = Tile ({part}, tile_kv)",
            *_repeat(f"{part}_rep", f"{part}_t", s, s.value_size),
        ]
        lines.append(f"{part}_ctx = MatMul (probs, {part}_rep)")
    return [*lines, "context = Concat <axis = -1> (va_ctx, vb_ctx)"]


def _read(s: Block) -> list[str]:
    """``merged`` [B, S, *] from ``context`` as drawn."""
    t = "Transpose <perm = [0, 2, 1, 3]>"
    if s.read == "merged":
        return [f"ct = {t} (context)", "merged = Reshape (ct, merge)"]
    if s.read == "mul_before_transpose":
        return [
            "cw = Mul (context, w_heads_bnsh)",
            f"ct = {t} (cw)",
            "merged = Reshape (ct, merge)",
        ]
    if s.read == "gate_before_transpose":  # (1 - lambda) * C + b_n, per head, then a scalar
        return [
            "cw = Mul (w_heads_bnsh, context)",
            "cb = Add (cw, b_heads)",
            "cs = Div (cb, two)",
            f"ct = {t} (cs)",
            "merged = Reshape (ct, merge)",
        ]
    lines = [f"ct = {t} (context)"]
    if s.read == "sub_halves":
        lines += [
            "ca, cb = Split <axis = 2, num_outputs = 2> (ct)",
            "cbl = Mul (cb, lam)",
            "cd = Sub (ca, cbl)",
        ]
    elif s.read == "norm":
        lines += [
            "sq = Mul (ct, ct)",
            "ms = ReduceMean <keepdims = 1> (sq, axis_last)",
            "mse = Add (ms, eps)",
            "rms = Sqrt (mse)",
            "inv = Reciprocal (rms)",
            "cd = Mul (ct, inv)",
        ]
    else:
        lines += ["cd = Mul (ct, w_heads)"]
    return [*lines, "merged = Reshape (cd, merge)"]


def _query(s: Block) -> list[str]:
    """``q_read`` [B, N, S, H], the query heads ``qt`` as drawn (none for "plain")."""
    if s.query == "plain":
        return []
    lines = ["q_read = Mul (qt, s_qk)"]
    if s.query == "scaled_shifted":
        lines = ["qs = Mul (s_qk, qt)", "qb = Add (qs, b_q)", "q_read = Div (qb, two)"]
    return lines


def _inits(s: Block, rng: np.random.Generator) -> dict:
    n, kv, h = s.heads, s.kv_heads, s.size
    vh = s.value_size * (2 if s.two_contexts else 1)  # the context's head size
    out = n * vh // (2 if s.read == "sub_halves" else 1)
    return {
        "wq": rng.standard_normal((HIDDEN, n * h)) * 0.3,
        "wk": rng.standard_normal((HIDDEN, kv * h)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, kv * s.value_size)) * 0.3,
        "wo": rng.standard_normal((out, HIDDEN)) * 0.3,
        "q_split": np.array([0, 0, n, h], np.int64),
        "k_split": np.array([0, 0, kv, h], np.int64),
        "v_split": np.array([0, 0, kv, s.value_size], np.int64),
        "axis_2": np.array([2], np.int64),
        "axis_last": np.array([-1], np.int64),
        **{f"group_{g}": np.array([1, 1, g, 1, 1], np.int64) for g in (2, 4)},
        **{f"rep_{d}": np.array([0, n, -1, d], np.int64) for d in (s.size, s.value_size)},
        "tile_kv": np.array([1, 2, 1, 1], np.int64),
        **{f"tile_group_{g}": np.array([1, g, 1, 1], np.int64) for g in (2, 4)},
        "merge": np.array([0, 0, out], np.int64),
        "scale": np.array(h**-0.5, np.float32),
        "lam": np.array(0.37, np.float32),
        "eps": np.array(1e-6, np.float32),
        "w_heads": rng.standard_normal((n, vh)).astype(np.float32),
        "w_heads_bnsh": rng.standard_normal((n, 1, vh)).astype(np.float32),
        "b_heads": rng.standard_normal((n, 1, 1)).astype(np.float32),
        "s_qk": rng.uniform(0.5, 2.0, (n, 1, h)).astype(np.float32),
        "b_q": rng.standard_normal((1, n, 1, h)).astype(np.float32),
        "two": np.array(2.0, np.float32),
    }


def block_model(s: Block, seed: int = 0) -> onnx.ModelProto:
    body = [
        "qm = MatMul (x, wq)",
        "qr = Reshape (qm, q_split)",
        "qt = Transpose <perm = [0, 2, 1, 3]> (qr)",
        *_query(s),
        "km = MatMul (x, wk)",
        "kr = Reshape (km, k_split)",
        "kt = Transpose <perm = [0, 2, 1, 3]> (kr)",
        *_repeat("k_rep", "kt", s, s.size),
        "kT = Transpose <perm = [0, 1, 3, 2]> (k_rep)",
        f"qk = MatMul ({'qt' if s.query == 'plain' else 'q_read'}, kT)",
        "scaled = Mul (qk, scale)",
        "biased = Add (scaled, mask)" if s.mask != "none" else "biased = Identity (scaled)",
        "probs = Softmax <axis = -1> (biased)",
        *_values(s),
        *_read(s),
        "y = MatMul (merged, wo)",
    ]
    inputs = ["float[B, S, 16] x"]
    if s.mask != "none":
        inputs.append(f"float[B, {1 if s.mask == 'batch' else s.heads}, S, S] mask")
    model = graph_model(inputs, ["float[B, S, 16] y"], body, _inits(s, np.random.default_rng(seed)))
    return model


def _feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32)}
    for value in model.graph.input[1:]:
        heads = value.type.tensor_type.shape.dim[1].dim_value
        feeds["mask"] = (rng.standard_normal((batch, heads, seq, seq)) * 2).astype(np.float32)
    return feeds


def fuses_exactly_once(s: Block, target: str = "onnxruntime") -> None:
    model = block_model(s)
    generic = target == "generic"  # ONNX Attention, opset 23
    done = fuse_quiet(model, target=target, upgrade_opset=23 if generic else None)
    fused, ops = done.model, done.ops
    assert len(done.ops_among(ATTENTION)) == 1, (s, ops, done.misses_about("attention")[:2])
    assert "Softmax" not in ops, (s, ops)
    for batch, seq in ((1, 5), (2, 7)):
        run_both(model, fused, feeds=_feeds(model, batch, seq, seq), **TOL)


@SPELLINGS
@example(Block(8, 2, 8, 8, True, "sub_halves", "none"))  # differential attention
@example(Block(8, 2, 8, 8, True, "norm", "batch"))
@example(Block(4, 2, 8, 8, False, "merged", "heads"))  # a mask computed from the values
@example(Block(4, 4, 8, 6, False, "mul", "batch"))
@example(Block(8, 2, 8, 8, False, "merged", "none", "tile"))  # mixture of attention heads
@example(Block(4, 2, 8, 6, False, "norm", "heads", "tile"))
@example(Block(4, 4, 8, 8, True, "mul_before_transpose", "none"))  # a gate before the Transpose
@example(Block(8, 2, 8, 6, False, "gate_before_transpose", "heads"))
@example(Block(4, 2, 8, 8, False, "merged", "batch", query="scaled"))  # nGPT's s_qk
@example(Block(4, 4, 8, 8, False, "norm", "none", query="scaled_shifted"))
@given(blocks())
def test_block_fuses_exactly_once(s: Block) -> None:
    fuses_exactly_once(s)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(Block(8, 2, 8, 8, False, "merged", "none", "tile"))  # heads in block order
@example(Block(4, 2, 8, 6, False, "gate_before_transpose", "heads"))
@given(blocks())
def test_block_fuses_exactly_once_on_the_generic_target(s: Block) -> None:
    """ONNX Attention over the repeated heads, where the onnxruntime target emits
    MultiHeadAttention over them (or GroupQueryAttention)."""
    fuses_exactly_once(s, target="generic")


@pytest.mark.parametrize("read", READS)
def test_unfused_context_comes_back_as_it_went_in(read: str) -> None:
    """Without the attention pattern nothing fuses, and what the rules inserted is undone."""
    model = block_model(Block(4, 2, 8, 6, False, read, "batch"))
    fused = optimize_quiet(model, target="onnxruntime", patterns=["gelu_tanh"]).to_proto()
    before = sorted(n.op_type for n in model.graph.node)
    assert sorted(n.op_type for n in fused.graph.node) == before


@pytest.mark.parametrize(
    "s", [Block(8, 2, 8, 8, True, "norm", "batch"), Block(4, 4, 8, 6, False, "mul", "batch")]
)
def test_the_context_heads_pair_stays_at_static_sizes(s: Block) -> None:
    """A decode step of one token at batch 1: every size of the merge/split pair
    ``context_heads`` inserts is a number, so the pair gives back its input, and
    ``identity_reshape`` took it out each run, ``context_heads`` put it in again: the
    canonical form never settled and every round ran (HY-V4's KV graph, 8 rounds). A
    rule's own pair stays; a second run changes nothing."""
    model = block_model(s)
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.ClearField("dim_param")
                dim.dim_value = 1
    _, done, again, _ = canonical_twice(model)
    assert done.get("context_heads") == 1 and "identity_reshape" not in done, done
    assert again == 0, done
