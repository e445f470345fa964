"""Where no fusion takes what rule ``interleaved_columns`` wrote, ``undo_unused`` writes it
back: the model comes out with the op sequence it went in with and computes the same
values bit for bit (rtol = atol = 0: the same products on the same inputs; un-permuting
the columns gives back the very same weights).

A generator (hypothesis) writes the rope parts of multi-head latent attention as
tests/fusion_core/canonical/test_interleaved_columns.py draws them (its ``interleaved``
draws and its ``_read_interleaved`` reads: the shuffle, the Gather or the two strided
Slices; the query through one projection or two, with a bias, a scale or nothing after
it; its rotation joined with ``q_nope`` by one Concat of three or by its own), and the
key's rope part (its own projection or split from the latent's, one head or one per
head) read the same way, with no attention after them: nothing there to fuse. Each is
checked twice: the canonical form and ``undo_unused`` alone, and the whole optimizer with
only an unrelated pattern enabled. Where the rotary and the attention fuse, the rule's
form stays (test_interleaved_columns.py counts it in every fused block).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.provenance import PATTERN
from autofusion.fusion_core.testing import canonical_twice, op_sequence, optimize_quiet, run_both
from tests.fusion_core.canonical.test_concat_heads import HIDDEN, _rotated
from tests.fusion_core.canonical.test_interleaved_columns import (
    DEEPSEEK,
    LORA,
    Interleaved,
    _read_interleaved,
    interleaved,
)
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

EXACT = dict(rtol=0, atol=0)
T = "Transpose <perm = [0, 2, 1, 3]>"


def _projected(s: Interleaved) -> list[str]:
    """``qm`` (the query, ``[B, S, N * d]``) and ``kp`` (the key's rope part)."""
    op = {"bias": "Add", "scale": "Mul"}.get(s.after)
    q_in = "ql" if s.q_lora else "x"
    lines = ["ql = MatMul (x, wqa)"] if s.q_lora else []
    lines += (
        [f"qm_mm = MatMul ({q_in}, wq)", f"qm = {op} (qm_mm, bq)"]
        if op
        else [f"qm = MatMul ({q_in}, wq)"]
    )
    if s.k_latent:  # kv_a_proj_with_mqa: the latent and the key's rope part, one MatMul
        return [*lines, "kpl = MatMul (x, wk_all)", "latent, kp = Split <axis = -1> (kpl, k_sizes)"]
    return [*lines, "kp = MatMul (x, wk_rope)"]


def _rotation(p: str, source: str, s: Interleaved) -> list[str]:
    """``{p}_rot`` (or its two halves ``{p}_sub``, ``{p}_add``): the rotary of ``source``
    read interleaved, as test_interleaved_columns.py writes it."""
    edits = _read_interleaved(p, source, s)
    lines = []
    for line in _rotated(p, source, "cos_u", "sin_u"):
        lines += edits.get(line.split(" = ")[0], [line])
    return lines


def _inits(s: Interleaved, k_heads: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """What ``rope_block`` may read (it keeps those it names)."""
    n, r, d = s.base.heads, s.base.rope, s.base.nope + s.base.rope
    return {
        "wqa": rng.standard_normal((HIDDEN, LORA)) * 0.3,
        "wq": rng.standard_normal((LORA if s.q_lora else HIDDEN, n * d)) * 0.3,
        "bq": rng.standard_normal(n * d) * 0.3,
        "wk_rope": rng.standard_normal((HIDDEN, k_heads * r)) * 0.3,
        "wk_all": rng.standard_normal((HIDDEN, HIDDEN + k_heads * r)) * 0.3,
        "k_sizes": np.array([HIDDEN, k_heads * r], np.int64),
        "q_split": np.array([0, 0, n, d], np.int64),
        "q_parts": np.array([s.base.nope, r][:: 1 if s.base.nope_first else -1], np.int64),
        "rope_split": np.array([0, 0, n, r], np.int64),
        "one_head": np.array([0, 1, -1, r], np.int64),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "half": np.array([r // 2], np.int64),
        "end": np.array([np.iinfo(np.int64).max], np.int64),
        "axis_1": np.array([1], np.int64),
        "axis_last": np.array([-1], np.int64),
        "deinterleave": np.array([*range(0, r, 2), *range(1, r, 2)], np.int64),
        "pairs": np.array([0, 0, 0, r // 2, 2], np.int64),
        "unpaired": np.array([0, 0, 0, r], np.int64),
    }


def rope_block(s: Interleaved, seed: int = 0) -> onnx.ModelProto:
    """The query's and the key's rope parts of ``s`` rotated, read interleaved; ``y`` the
    query heads (``[B, S, N, d]``), ``k`` the key's rotated part."""
    b = s.base
    n, r, d = b.heads, b.rope, b.nope + b.rope
    angle = "h" if s.spelling == "strided" else "u"  # strided: one angle a pair
    body = [f"{a}_{angle} = Unsqueeze ({a}, axis_1)" for a in ("cos", "sin")]
    body += [*_projected(s), "qr = Reshape (qm, q_split)", f"qt = {T} (qr)"]
    body.append("qa, qb = Split <axis = -1> (qt, q_parts)")
    q_nope, q_pe = ("qa", "qb") if b.nope_first else ("qb", "qa")
    body += _rotation("q", q_pe, s)
    rotated = ["q_sub", "q_add"] if s.flat_concat else ["q_rot"]
    parts = [q_nope, *rotated] if b.nope_first else [*rotated, q_nope]
    body += [f"q_cat = Concat <axis = -1> ({', '.join(parts)})", f"y = {T} (q_cat)"]
    if b.shared_rope:  # k_pe.view(B, 1, S, r): one head
        body.append("k_pe = Reshape (kp, one_head)")
    else:
        body += ["kp_r = Reshape (kp, rope_split)", f"k_pe = {T} (kp_r)"]
    body += [*_rotation("k", "k_pe", s), "k = Relu (k_rot)"]  # read by no rule
    k_heads = 1 if b.shared_rope else n
    inits = _inits(s, k_heads, np.random.default_rng(seed))
    angles = r // 2 if s.spelling == "strided" else r
    inputs = [f"float[batch, seq, {HIDDEN}] x"] + [
        f"float[batch, seq, {angles}] {a}" for a in ("cos", "sin")
    ]
    outputs = [f"float[batch, seq, {n}, {d}] y", f"float[batch, {k_heads}, seq, {r}] k"]
    if s.k_latent:
        outputs.append(f"float[batch, seq, {HIDDEN}] latent")
    named = {word for line in body for word in line.replace(",", " ").replace(")", " ").split()}
    return graph_model(inputs, outputs, body, {k: v for k, v in inits.items() if k in named})


def _feeds(s: Interleaved, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    angles = rng.uniform(0.0, 6.3, (batch, seq, s.base.rope // 2))
    if s.spelling != "strided":  # rotate_half's angles: each pair's twice
        angles = np.concatenate([angles, angles], axis=-1)
    return {
        "x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }


@SPELLINGS
@given(s=interleaved(), seed=st.integers(0, 2**16))
@example(s=DEEPSEEK, seed=0)
@example(s=replace(DEEPSEEK, spelling="shuffle", flat_concat=False, after="bias"), seed=1)
@example(s=replace(DEEPSEEK, spelling="gather", flat_concat=False, after="scale"), seed=2)
def test_heads_no_fusion_took_come_back_as_they_went_in(s: Interleaved, seed: int) -> None:
    model = rope_block(s, seed)
    _canonical, done, again, work = canonical_twice(model)
    assert done.get("interleaved_columns") == 2 and again == 0, (s, done, again)
    assert undo_unused(work.graph)["interleaved_columns"] == 2, s
    undone = ir.to_proto(work)
    onnx.checker.check_model(undone, full_check=True)
    assert op_sequence(undone) == op_sequence(model), s
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in undone.graph.initializer}
    for weight in model.graph.initializer:  # the same weights, bit for bit, by name
        if weight.name.startswith("w"):
            np.testing.assert_array_equal(weights[weight.name], onnx.numpy_helper.to_array(weight))
    feeds = _feeds(s, 2, 5, seed)
    run_both(model, undone, feeds=feeds, **EXACT)
    # through the whole optimizer, only an unrelated pattern enabled: nothing fuses
    result = optimize_quiet(model, target="onnxruntime", patterns=["gelu_tanh"])
    assert not result.applied, result.applied
    assert op_sequence(result.to_proto()) == op_sequence(model), (s, result.prepasses)
    run_both(model, result.to_proto(), feeds=feeds, **EXACT)


def test_heads_a_fusion_reads_keep_the_rule_s_form() -> None:
    """The key's rotation taken by a fusion (its first reader marked as a fusion's node
    is): the key's site stays as the rule wrote it, the query's goes back, and the model
    still computes what it did."""
    s = replace(DEEPSEEK, spelling="shuffle", flat_concat=False)
    model = rope_block(s)
    _canonical, _done, _again, work = canonical_twice(model)
    heads = next(v for node in work.graph for v in node.outputs if v.name == "k_pe")
    next(use.node for use in heads.uses()).metadata_props[PATTERN] = "rotary_embedding"
    assert undo_unused(work.graph)["interleaved_columns"] == 1
    undone = ir.to_proto(work)
    assert op_sequence(undone) != op_sequence(model)
    assert [n.output[0] for n in undone.graph.node].count("q_il") == 1  # the query's shuffle
    run_both(model, undone, feeds=_feeds(s, 2, 5, 0), **EXACT)


def test_a_flattened_concat_that_is_a_graph_output_keeps_its_three_inputs() -> None:
    """``cat(q_nope, x1 * c - x2 * s, x2 * c + x1 * s)`` that the graph also returns: its
    name is the graph's, so the query's rotation is not joined on its own (the rule used to
    raise here) and only the key's is made rotate_half; the heads still read in order,
    and all of it goes back."""
    s = DEEPSEEK
    model = rope_block(s)
    n, d = s.base.heads, s.base.nope + s.base.rope
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("q_cat", onnx.TensorProto.FLOAT, ["batch", n, "seq", d])
    )
    _canonical, done, _again, work = canonical_twice(model)
    assert done.get("interleaved_columns") == 2 and done.get("rotary_halves") == 1, done  # k's
    assert undo_unused(work.graph)["interleaved_columns"] == 2
    undone = ir.to_proto(work)
    assert op_sequence(undone) == op_sequence(model)
    run_both(model, undone, feeds=_feeds(s, 2, 5, 0), **EXACT)
