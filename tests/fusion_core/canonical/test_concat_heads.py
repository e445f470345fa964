"""Generated spellings of multi-head latent attention (DeepSeek-V2/V3, MiniCPM3): each
fuses exactly once, exactly (canonical rules ``scatter_parts`` and ``concat_heads``).

A generator (hypothesis) writes one attention block whose query and key heads are each
the Concat of a part without position (``nope``) and a rotary part (``rope``), drawing:

* the head count, the two parts' sizes and the value's head size (its own or the
  query's);
* the order of the parts (nope first, as DeepSeek; or rope first);
* where the Concat is: on the transposed heads ``[B, N, S, *]`` (the models), or on
  ``[B, S, N, *]`` before the head Transpose;
* the key's rope part: one head ``[B, 1, S, r]`` shared by every head and expanded (the
  models), or a head of its own per head;
* the key written by a Concat, or into an empty tensor slab by slab by ScatterNDs over
  index grids (TorchScript's ``new_empty`` and ``copy_``, as MiniCPM3 writes it);
* ``k_nope`` and ``v`` cut by one Split from one projection's heads (``kv_b_proj``), or
  two projections;
* the rope parts rotated by a written-out rotary (which fuses first) or not; with or
  without the causal and padding mask; the scale ``1 / sqrt(D)`` or another constant.

Every block must come out as one attention op (MultiHeadAttention, which takes a value
head size of its own) with no Softmax left, and compute what the original computes
(onnxruntime, its optimizations off) on two shapes, with and without a left-padded row:
rtol = atol = 1e-5, as tests/fusion_core/canonical/test_attention_spellings.py (the
kernel sums in another order; at these sizes outputs differ by about 1e-6).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.decoder_text import (
    CAUSAL,
    HALF_TABLES,
    PADDING,
    TEXT_CONSTANTS,
    graph_model,
    positions,
)
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN = 32
ATTENTION = ("GroupQueryAttention", "MultiHeadAttention")


@dataclass(frozen=True)
class Latent:
    heads: int
    nope: int  # the head features without position
    rope: int  # the rotated ones
    value: int  # v's head size
    nope_first: bool
    on_heads: bool  # the Concat on [B, N, S, *]; else on [B, S, N, *] before the Transpose
    shared_rope: bool  # the key's rope part one head, expanded to every head
    scatter: bool  # the key written slab by slab by ScatterNDs (on_heads only)
    kv_split: bool  # k_nope and v split from one projection's heads
    rotary: bool  # the rope parts rotated (on_heads only)
    mask: bool
    scale: float


@st.composite
def latents(draw) -> Latent:
    nope, rope = draw(st.sampled_from([4, 8])), draw(st.sampled_from([4, 8]))
    on_heads = draw(st.booleans())
    return Latent(
        heads=draw(st.sampled_from([2, 4])),
        nope=nope,
        rope=rope,
        value=draw(st.sampled_from([4, 12, nope + rope])),
        nope_first=draw(st.booleans()),
        on_heads=on_heads,
        shared_rope=draw(st.booleans()),
        scatter=on_heads and draw(st.booleans()),
        kv_split=draw(st.booleans()),
        rotary=on_heads and draw(st.booleans()),
        mask=draw(st.booleans()),
        scale=(nope + rope) ** -0.5 * draw(st.sampled_from([1.0, 1.3])),
    )


def _inits(s: Latent, rng: np.random.Generator) -> dict:
    n, d = s.heads, s.nope + s.rope
    r = s.rope
    return {
        "inv_freq": 1.0 / (10000 ** (np.arange(0, r, 2) / r)),
        "wq": rng.standard_normal((HIDDEN, n * d)) * 0.3,
        "wkv": rng.standard_normal((HIDDEN, n * (s.nope + s.value))) * 0.3,
        "wk_nope": rng.standard_normal((HIDDEN, n * s.nope)) * 0.3,
        "wv": rng.standard_normal((HIDDEN, n * s.value)) * 0.3,
        "wk_rope": rng.standard_normal((HIDDEN, (1 if s.shared_rope else n) * r)) * 0.3,
        "wo": rng.standard_normal((n * s.value, HIDDEN)) * 0.3,
        "q_split": np.array([0, 0, n, d], np.int64),
        "kv_split": np.array([0, 0, n, s.nope + s.value], np.int64),
        "k_nope_split": np.array([0, 0, n, s.nope], np.int64),
        "v_split": np.array([0, 0, n, s.value], np.int64),
        "rope_split": np.array([0, 0, n, r], np.int64),
        "q_parts": np.array([s.nope, r] if s.nope_first else [r, s.nope], np.int64),
        "kv_parts": np.array([s.nope, s.value], np.int64),
        "rope_heads": np.array([1, n, 1, 1], np.int64),
        "rope_heads_bsnd": np.array([1, 1, n, 1], np.int64),
        "one_head": np.array([r], np.int64),
        "merge": np.array([0, 0, n * s.value], np.int64),
        "heads_d": np.array([n, d], np.int64),
        **{f"grid_view_{k}": np.array([-1] + [1] * (3 - k), np.int64) for k in range(4)},
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "half": np.array([r // 2], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "axis_1": np.array([1], np.int64),
        "axis_2": np.array([2], np.int64),
        "axis_last": np.array([-1], np.int64),
        **TEXT_CONSTANTS,
        "index_0": np.array(0, np.int64),
        "head_size": np.array(d, np.int64),
        "zero_f": np.array(0.0, np.float32),
        "lowest": np.array(np.finfo(np.float32).min, np.float32),
        "scale": np.array(s.scale, np.float32),
    }


def _rotated(p: str, source: str, cos: str, sin: str) -> list[str]:
    """``{p}_rot``: rotate_half's rotary of ``source`` (``x * cos + rotate_half(x) * sin``)."""
    return [
        f"{p}_lo = Slice ({source}, zero, half, axis_last)",
        f"{p}_hi = Slice ({source}, half, end, axis_last)",
        f"{p}_neg = Neg ({p}_hi)",
        f"{p}_turn = Concat <axis = -1> ({p}_neg, {p}_lo)",
        f"{p}_c = Mul ({source}, {cos})",
        f"{p}_s = Mul ({p}_turn, {sin})",
        f"{p}_rot = Add ({p}_c, {p}_s)",
    ]


def _key_parts(s: Latent) -> list[str]:
    """``k_nope``, ``v_heads`` (``[B, N, S, *]``, or ``[B, S, N, *]`` when not
    ``on_heads``) and ``k_pe`` (one head or ``N``, not yet expanded)."""
    t = "Transpose <perm = [0, 2, 1, 3]>"
    if s.kv_split:
        lines = ["kv = MatMul (x, wkv)", "kv_r = Reshape (kv, kv_split)"]
        if s.on_heads:
            lines += [f"kv_t = {t} (kv_r)", "k_nope, v_part = Split <axis = -1> (kv_t, kv_parts)"]
        else:
            lines += ["k_nope, v_part = Split <axis = -1> (kv_r, kv_parts)"]
    else:
        lines = [
            "kn = MatMul (x, wk_nope)",
            "kn_r = Reshape (kn, k_nope_split)",
            f"k_nope = {t} (kn_r)" if s.on_heads else "k_nope = Identity (kn_r)",
            "vm = MatMul (x, wv)",
            "v_part = Reshape (vm, v_split)",
        ]
    if not s.on_heads or s.kv_split:
        lines.append(f"v_heads = {t} (v_part)" if not s.on_heads else "v_heads = Identity (v_part)")
    else:
        lines.append(f"v_heads = {t} (v_part)")
    lines.append("kp = MatMul (x, wk_rope)")
    if s.shared_rope and s.on_heads:  # k_rot.view(B, 1, S, r): one head, no Transpose
        lines += [
            "one_b = Gather <axis = 0> (x_shape, index_0)",
            "one_s = Gather <axis = 0> (x_shape, index_1)",
            "one_bu = Unsqueeze (one_b, zero)",
            "one_su = Unsqueeze (one_s, zero)",
            "one_target = Concat <axis = 0> (one_bu, one, one_su, one_head)",
            "k_pe = Reshape (kp, one_target)",
        ]
    elif s.shared_rope:
        lines += ["k_pe = Unsqueeze (kp, axis_2)"]
    else:
        lines += ["kp_r = Reshape (kp, rope_split)"]
        lines.append(f"k_pe = {t} (kp_r)" if s.on_heads else "k_pe = Identity (kp_r)")
    return lines


def _grid(name: str, target: str, lo: str, hi: str) -> list[str]:
    """``{name}``: the index grid of a ``target``-shaped slab, last component lo .. hi - 1."""
    lines = []
    for axis in range(3):
        lines += [
            f"{name}_n{axis} = Gather <axis = 0> (k_shape, index_{axis})",
            f"{name}_r{axis} = Range (start, {name}_n{axis}, step)",
            f"{name}_c{axis} = Reshape ({name}_r{axis}, grid_view_{axis})",
        ]
    lines += [
        f"{name}_c3 = Slice (features, {lo}, {hi}, zero)",
        *[f"{name}_e{k} = Expand ({name}_c{k}, {target})" for k in range(4)],
        *[f"{name}_u{k} = Unsqueeze ({name}_e{k}, axis_last)" for k in range(4)],
        f"{name} = Concat <axis = -1> ({', '.join(f'{name}_u{k}' for k in range(4))})",
    ]
    return lines


def _scattered(s: Latent, first: str, second: str) -> list[str]:
    """``k_cat``: ``first`` and ``second`` written into an empty key, slab by slab."""
    inits_lines = [
        "k_shape = Shape (qt)",
        "features = Range (start, head_size, step)",
        "empty = ConstantOfShape <value = float[1] {0.0}> (k_shape)",
        f"slab_a = Shape ({first})",
        f"slab_b = Shape ({second})",
    ]
    return [
        *inits_lines,
        *_grid("grid_a", "slab_a", "zero", "split_at"),
        *_grid("grid_b", "slab_b", "split_at", "end"),
        f"k_half = ScatterND (empty, grid_a, {first})",
        f"k_cat = ScatterND (k_half, grid_b, {second})",
    ]


def _attention(s: Latent, q_heads: str, k_heads: str) -> list[str]:
    """The scores, the optional mask, the Softmax, the context and the output ``y``."""
    lines = [
        "kT = Transpose <perm = [0, 1, 3, 2]> (" + k_heads + ")",
        f"qk = MatMul ({q_heads}, kT)",
        "scaled = Mul (qk, scale)",
    ]
    if s.mask:
        lines += [
            CAUSAL,
            *PADDING,
            "allowed = And (causal, padding)",
            "bias = Where (allowed, zero_f, lowest)",
            "biased = Add (scaled, bias)",
        ]
    else:
        lines.append("biased = Identity (scaled)")
    return [
        *lines,
        "probs = Softmax <axis = -1> (biased)",
        "context = MatMul (probs, v_heads)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]


def latent_block(s: Latent, seed: int = 0) -> onnx.ModelProto:
    inits = _inits(s, np.random.default_rng(seed))
    inits["split_at"] = np.array([s.nope if s.nope_first else s.rope], np.int64)
    t = "Transpose <perm = [0, 2, 1, 3]>"
    body = [
        "past_len = Identity (start)",
        *positions(),
        *HALF_TABLES,
        "qm = MatMul (x, wq)",
        "qr = Reshape (qm, q_split)",
        f"qt = {t} (qr)",
        f"qa, qb = Split <axis = -1> ({'qt' if s.on_heads else 'qr'}, q_parts)",
    ]
    q_nope, q_pe = ("qa", "qb") if s.nope_first else ("qb", "qa")
    k_pe = "k_pe"
    body += _key_parts(s)
    if s.rotary:  # on the transposed heads, as apply_rotary_pos_emb
        body += [*_rotated("q", q_pe, "cos_u", "sin_u"), *_rotated("k", k_pe, "cos_u", "sin_u")]
        q_pe, k_pe = "q_rot", "k_rot"
    if s.shared_rope:
        heads = "rope_heads" if s.on_heads else "rope_heads_bsnd"
        body.append(f"k_pe_all = Expand ({k_pe}, {heads})")
        k_pe = "k_pe_all"
    q_parts = (q_nope, q_pe) if s.nope_first else (q_pe, q_nope)
    k_parts = ("k_nope", k_pe) if s.nope_first else (k_pe, "k_nope")
    body.append(f"q_cat = Concat <axis = -1> ({', '.join(q_parts)})")
    if s.scatter:
        body += _scattered(s, *k_parts)
    else:
        body.append(f"k_cat = Concat <axis = -1> ({', '.join(k_parts)})")
    if not s.on_heads:
        body += [f"q_heads = {t} (q_cat)", f"k_heads = {t} (k_cat)"]
    body += _attention(s, *(("q_cat", "k_cat") if s.on_heads else ("q_heads", "k_heads")))
    inputs = [
        "float[batch, seq, 32] x",
        "int64[batch, seq] position_ids",
        "int64[batch, seq] attention_mask",
    ]
    return graph_model(inputs, ["float[batch, seq, 32] y"], body, inits)


def feeds(batch: int, seq: int, *, padded: bool) -> dict:
    rng = np.random.default_rng(batch * 10 + seq)
    mask = np.ones((batch, seq), np.int64)
    if padded:  # the last row padded on the left, as batched generation pads
        mask[-1, : min(2, seq - 1)] = 0
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "position_ids": rng.integers(0, 64, (batch, seq)).astype(np.int64),
        "attention_mask": mask,
    }


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


MINICPM3 = Latent(  # MiniCPM3's own spelling (TorchScript): every part as the model has it
    heads=4, nope=8, rope=4, value=8, nope_first=True, on_heads=True, shared_rope=True,
    scatter=True, kv_split=True, rotary=True, mask=True, scale=12**-0.5,
)  # fmt: skip


@SPELLINGS
@given(latents())
@example(MINICPM3)
def test_every_latent_attention_fuses_into_one_attention_exactly(s: Latent) -> None:
    model = latent_block(s)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    fused, ops, fused_attention = done.model, done.ops, done.ops_among(ATTENTION)
    reasons = done.misses_about("attention")[:3]
    assert fused_attention == ["MultiHeadAttention"], f"{s}: {fused_attention}; {reasons}"
    assert "Softmax" not in ops, s
    if s.rotary:
        assert ops.count("RotaryEmbedding") == 2, f"{s}: {ops.count('RotaryEmbedding')} rotary"
    onnx.checker.check_model(fused, full_check=True)
    for batch, seq in [(1, 3), (2, 5)]:
        for padded in (False, True):
            run_both(model, fused, feeds=feeds(batch, seq, padded=padded), **TOL)


def test_slabs_that_do_not_tile_the_key_stay_as_they_are() -> None:
    """The second slab written over the first (same range) leaves the rest of the key
    as the buffer was: no Concat reads it so (``scatter_parts`` leaves the ScatterNDs),
    and the attention takes the key's heads as they are (MultiHeadAttention over
    ``[B, N, L, H]``), whatever they hold."""
    s = replace(MINICPM3, nope=4, rope=4, scale=8**-0.5)
    model = latent_block(s)
    for node in model.graph.node:  # grid_b's last component from 0, as grid_a's
        if node.output[0] == "grid_b_c3":
            node.input[1], node.input[2] = "zero", "split_at"
    result = optimize_quiet(model, target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
    fused = result.to_proto()
    ops = _ops(fused)
    assert "ScatterND" in ops and "Softmax" not in ops, ops
    assert [op for op in ops if op in ATTENTION] == ["MultiHeadAttention"], ops
    for batch, seq in [(1, 3), (2, 5)]:
        run_both(model, fused, feeds=feeds(batch, seq, padded=True), **TOL)


def test_a_part_no_rule_lays_out_leaves_the_block_with_a_near_miss() -> None:
    """A part formed by an op the layout does not move through (a Tanh of the query's
    rope part) keeps the Concat: nothing fuses, and the near miss names it."""
    s = replace(MINICPM3, scatter=False, rotary=False)
    model = latent_block(s)
    for node in model.graph.node:
        if node.op_type == "Concat" and node.output[0] == "q_cat":
            node.input[1] = "q_odd"
    model.graph.node.insert(
        next(i for i, n in enumerate(model.graph.node) if n.output[0] == "q_cat"),
        onnx.helper.make_node("Tanh", ["qb"], ["q_odd"]),
    )
    result = optimize_quiet(model, target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
    ops = _ops(result.to_proto())
    assert "Softmax" in ops and not set(ops) & set(ATTENTION)
    reasons = [m.reason for m in result.near_misses if m.pattern == "attention"]
    assert any("expected Transpose 'q_t'" in r and "Concat" in r for r in reasons), reasons
