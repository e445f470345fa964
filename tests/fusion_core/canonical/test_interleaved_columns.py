"""Generated multi-head latent attention whose rope part is interleaved (DeepSeek-V2/V3,
Youtu, GLM-4.7-Flash): each fuses exactly once, exactly (canonical rule
``interleaved_columns``, then ``rotary_halves``, ``scatter_parts``, ``concat_heads``).

A generator (hypothesis) takes a block of tests/fusion_core/canonical/test_concat_heads.py
(its draws: heads, nope/rope/value head sizes, where the rope part sits in the head, the
key's rope part one head expanded as MLA has it or one per head, the key written by a
Concat or by ScatterNDs, ``k_nope`` and ``v`` split from one projection or two) with the
rope parts rotated, and reads each rope part interleaved, drawing:

* the spelling: one shuffle ``view(.., r/2, 2).transpose(-1, -2).reshape(.., r)`` then
  rotate_half (transformers before 5), a Gather of the same columns then rotate_half, or
  ``x[..., 0::2]`` and ``x[..., 1::2]`` each pair rotated by one angle (transformers 5),
  its rotation joined with ``q_nope`` by one Concat of three (as TorchScript flattens
  ``cat(q_nope, cat(a, b))``) or by a Concat of its own;
* the query through one projection or two (``q_a_proj``, ``q_b_proj``);
* after the query's and the key's rope projections a constant bias, a constant scale
  of each column (LongCat's ``mla_scale``, per column here), or nothing;
* the key's rope part a projection of its own, or split from one with the latent that
  ``k_nope`` and ``v`` are projected from (``kv_a_proj_with_mqa``).

Every block must come out as one MultiHeadAttention with two RotaryEmbeddings, no
Softmax and no strided read left, and compute what the original computes (onnxruntime,
its optimizations off) on two shapes, with and without a left-padded row: rtol = atol =
1e-5, as test_concat_heads.py (a permutation of weight columns computes the same dot
products; the kernel sums the attention in another order, about 1e-6 apart).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx.parser
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.canonical.test_concat_heads import (
    ATTENTION,
    HIDDEN,
    MINICPM3,
    Latent,
    feeds,
    latent_block,
)
from tests.fusion_core.spelling_settings import SPELLINGS as SETTINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
SPELLINGS = ("shuffle", "gather", "strided")
WORDS = "heads read in another order computed so by their projection"
LORA = 12  # the query's low rank (q_a_proj's output)


@dataclass(frozen=True)
class Interleaved:
    base: Latent  # rotary and on_heads always: the rope parts rotated on [B, N, S, r]
    spelling: str  # SPELLINGS
    flat_concat: bool  # the query's rotation and q_nope joined by one Concat ("strided")
    q_lora: bool  # the query through two projections
    after: str  # "bias", "scale" (per column) or "none" after the q and k_rope projections
    k_latent: bool  # the key's rope part split from the latent's projection


@st.composite
def interleaved(draw) -> Interleaved:
    nope, rope = draw(st.sampled_from([4, 8])), draw(st.sampled_from([4, 8]))
    base = Latent(
        heads=draw(st.sampled_from([2, 4])),
        nope=nope,
        rope=rope,
        value=draw(st.sampled_from([4, 12, nope + rope])),
        nope_first=draw(st.booleans()),
        on_heads=True,
        shared_rope=draw(st.booleans()),
        scatter=draw(st.booleans()),
        kv_split=draw(st.booleans()),
        rotary=True,
        mask=draw(st.booleans()),
        scale=(nope + rope) ** -0.5,
    )
    spelling = draw(st.sampled_from(SPELLINGS))
    return Interleaved(
        base=base,
        spelling=spelling,
        flat_concat=spelling == "strided" and draw(st.booleans()),
        q_lora=draw(st.booleans()),
        after=draw(st.sampled_from(["none", "bias", "scale"])),
        k_latent=draw(st.booleans()),
    )


def _read_interleaved(p: str, source: str, s: Interleaved) -> dict[str, list[str]]:
    """Edits (output -> lines in its place) that make the rotation ``{p}_rot`` read
    ``source`` interleaved; ``_rotated``'s lines of test_concat_heads.py are replaced."""
    if s.spelling == "strided":  # (x1, x2) = x[..., 0::2], x[..., 1::2], one angle a pair
        lines = [
            f"{p}_e = Slice ({source}, zero, end, axis_last, two)",
            f"{p}_o = Slice ({source}, one, end, axis_last, two)",
            f"{p}_m1 = Mul ({p}_e, cos_h)",
            f"{p}_m2 = Mul ({p}_o, sin_h)",
            f"{p}_sub = Sub ({p}_m1, {p}_m2)",
            f"{p}_m3 = Mul ({p}_o, cos_h)",
            f"{p}_m4 = Mul ({p}_e, sin_h)",
            f"{p}_add = Add ({p}_m3, {p}_m4)",
        ]
        if not (p == "q" and s.flat_concat):
            lines.append(f"{p}_rot = Concat <axis = -1> ({p}_sub, {p}_add)")
        gone = ["hi", "neg", "turn", "c", "s", "rot"]
        return {f"{p}_lo": lines, **{f"{p}_{name}": [] for name in gone}}
    if s.spelling == "gather":
        read = [f"{p}_il = Gather <axis = -1> ({source}, deinterleave)"]
    else:
        read = [
            f"{p}_pairs = Reshape ({source}, pairs)",
            f"{p}_swap = Transpose <perm = [0, 1, 2, 4, 3]> ({p}_pairs)",
            f"{p}_il = Reshape ({p}_swap, unpaired)",
        ]
    return {
        f"{p}_lo": [*read, f"{p}_lo = Slice ({p}_il, zero, half, axis_last)"],
        f"{p}_hi": [f"{p}_hi = Slice ({p}_il, half, end, axis_last)"],
        f"{p}_c": [f"{p}_c = Mul ({p}_il, cos_u)"],
    }


def _projections(s: Interleaved) -> dict[str, list[str]]:
    """Edits of the query's projection and the key's rope projection."""
    q_mm = "MatMul (ql, wqb)" if s.q_lora else "MatMul (x, wq)"
    k_source = "kpl" if s.k_latent else "kp"
    k_weight = "wk_all" if s.k_latent else "wk_rope"
    op = {"bias": "Add", "scale": "Mul"}.get(s.after)
    k_lines = [f"{k_source}{'_mm' if op else ''} = MatMul (x, {k_weight})"]
    if op:
        k_lines.append(f"{k_source} = {op} ({k_source}_mm, bk)")
    if s.k_latent:  # the latent k_nope and v are projected from, and the rope part
        k_lines.append("latent, kp = Split <axis = -1> (kpl, k_sizes)")
    q_lines = ["ql = MatMul (x, wqa)"] if s.q_lora else []
    q_lines += [f"qm_mm = {q_mm}", f"qm = {op} (qm_mm, bq)"] if op else [f"qm = {q_mm}"]
    # the key's projection before the query's: its latent is read before "kp" was
    return {"qm": [*k_lines, *q_lines], "kp": []}


def _constants(s: Interleaved, rng: np.random.Generator) -> dict:
    n, r, d = s.base.heads, s.base.rope, s.base.nope + s.base.rope
    k_rope = (1 if s.base.shared_rope else n) * r
    k_width = HIDDEN + k_rope if s.k_latent else k_rope
    return {
        "two": np.array([2], np.int64),
        "deinterleave": np.array([*range(0, r, 2), *range(1, r, 2)], np.int64),
        "pairs": np.array([0, 0, 0, r // 2, 2], np.int64),
        "unpaired": np.array([0, 0, 0, r], np.int64),
        "k_sizes": np.array([HIDDEN, k_rope], np.int64),
        "wqa": rng.standard_normal((HIDDEN, LORA)) * 0.3,
        "wqb": rng.standard_normal((LORA, n * d)) * 0.3,
        "bq": rng.standard_normal(n * d) * 0.3,
        "wk_all": rng.standard_normal((HIDDEN, k_width)) * 0.3,
        "bk": rng.standard_normal(k_width) * 0.3,
    }


def interleaved_block(s: Interleaved, seed: int = 0) -> onnx.ModelProto:
    """test_concat_heads.py's block of ``s.base`` with the rope parts read interleaved."""
    model = latent_block(s.base, seed)
    q_pe = "qb" if s.base.nope_first else "qa"
    edits = {**_read_interleaved("q", q_pe, s), **_read_interleaved("k", "k_pe", s)}
    edits.update(_projections(s))
    if s.spelling == "strided":  # the angles' first halves: cat(freqs, freqs)[..., :r/2]
        edits["q_lo"] = [
            "cos_half = Slice (cos, zero, half, axis_last)",
            "sin_half = Slice (sin, zero, half, axis_last)",
            "cos_h = Unsqueeze (cos_half, axis_1)",
            "sin_h = Unsqueeze (sin_half, axis_1)",
            *edits["q_lo"],
        ]
    if s.flat_concat:
        parts = ["qa", "q_sub", "q_add"] if s.base.nope_first else ["q_sub", "q_add", "qb"]
        edits["q_cat"] = [f"q_cat = Concat <axis = -1> ({', '.join(parts)})"]
    nodes = []
    for node in model.graph.node:
        if s.k_latent and node.output[0] in ("kv", "kn", "vm"):
            node.input[0] = "latent"
        lines = edits.get(node.output[0])
        nodes += [node] if lines is None else [onnx.parser.parse_node(t) for t in lines]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    arrays = _constants(s, np.random.default_rng(seed + 1))
    model.graph.initializer.extend(
        onnx.numpy_helper.from_array(a.astype(np.float32 if a.dtype.kind == "f" else a.dtype), k)
        for k, a in arrays.items()
    )
    return model


def _applied(result) -> int:
    """How many heads the rule made read in order (the report's words)."""
    counts = [re.match(r"canonical form: (\d+) ", p) for p in result.prepasses if WORDS in p]
    return int(counts[0].group(1)) if counts and counts[0] else 0


def _strided_or_shuffled(model: onnx.ModelProto) -> list[str]:
    """The interleaved reads left: the test's own names for them."""
    names = ("_e", "_o", "_il", "_pairs", "_swap")
    return [n.output[0] for n in model.graph.node if n.output[0].endswith(names)]


DEEPSEEK = Interleaved(  # Youtu's and GLM-4.7-Flash's TorchScript spelling (transformers 5)
    base=replace(MINICPM3, scatter=True), spelling="strided", flat_concat=True,
    q_lora=True, after="none", k_latent=True,
)  # fmt: skip


@SETTINGS
@given(interleaved())
@example(DEEPSEEK)
@example(replace(DEEPSEEK, spelling="shuffle", flat_concat=False, after="bias"))
@example(replace(DEEPSEEK, flat_concat=False, after="scale"))
def test_every_interleaved_latent_attention_fuses_into_one_attention_exactly(
    s: Interleaved,
) -> None:
    model = interleaved_block(s)
    onnx.checker.check_model(model, full_check=True)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    result, fused, ops = done.result, done.model, done.ops
    reasons = done.misses_about("attention")
    assert _applied(result) == 2, f"{s}: {result.prepasses}"
    assert [op for op in ops if op in ATTENTION] == ["MultiHeadAttention"], f"{s}: {reasons[:3]}"
    assert "Softmax" not in ops and ops.count("RotaryEmbedding") == 2, f"{s}: {ops}"
    assert not _strided_or_shuffled(fused), s
    onnx.checker.check_model(fused, full_check=True)
    for batch, seq in [(1, 3), (2, 5)]:
        for padded in (False, True):
            run_both(model, fused, feeds=feeds(batch, seq, padded=padded), **TOL)


def _read_also(model: onnx.ModelProto, value: str) -> onnx.ModelProto:
    """``model`` with ``value`` also read by a second graph output (its sum)."""
    model.graph.node.append(onnx.helper.make_node("ReduceSum", [value], ["probe"], keepdims=0))
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("probe", onnx.TensorProto.FLOAT, [])
    )
    return model


@pytest.mark.parametrize(
    ("spelling", "read"),
    [("strided", "qb"), ("shuffle", "qb"), ("strided", "qm"), ("gather", "qt")],
    ids=["rope-part-read", "shuffled-part-read", "projection-read", "heads-read"],
)
def test_a_query_read_elsewhere_keeps_its_interleave(spelling: str, read: str) -> None:
    """A value between the query's projection and its interleaved read that another op
    reads too would see the columns moved: the query's read stays as it is (the key's is
    moved), nothing fuses, and the model computes what it did."""
    s = replace(DEEPSEEK, spelling=spelling, flat_concat=False, k_latent=False)
    model = _read_also(interleaved_block(s), read)
    result = optimize_quiet(model, target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    assert _applied(result) == 1, result.prepasses  # the key's alone
    assert [n for n in _strided_or_shuffled(fused) if n.startswith("q_")], ops
    assert "Softmax" in ops and not set(ops) & set(ATTENTION), ops
    for batch, seq in [(1, 3), (2, 5)]:
        run_both(model, fused, feeds=feeds(batch, seq, padded=True), **TOL)


def test_a_tied_weight_keeps_its_columns_for_its_other_reader() -> None:
    """The query's weight also read by another MatMul: the query reads a permuted copy,
    the other MatMul the weight as it was, and the block fuses."""
    s = replace(DEEPSEEK, q_lora=False)
    model = interleaved_block(s)
    model.graph.node.append(onnx.helper.make_node("MatMul", ["x", "wq"], ["probe"]))
    n, d = s.base.heads, s.base.nope + s.base.rope
    out = onnx.helper.make_tensor_value_info(
        "probe", onnx.TensorProto.FLOAT, ["batch", "seq", n * d]
    )
    model.graph.output.append(out)
    result = optimize_quiet(model, target="onnxruntime", exclude=["qkv_merge", "kv_merge"])
    fused = result.to_proto()
    assert _applied(result) == 2, result.prepasses
    assert "wq" in {i.name for i in fused.graph.initializer}
    assert [n.op_type for n in fused.graph.node].count("MultiHeadAttention") == 1
    for batch, seq in [(1, 3), (2, 5)]:
        run_both(model, fused, feeds=feeds(batch, seq, padded=True), **TOL)
