"""Every attention block left unfused gets a near miss naming a node of the block (issue
24); a Softmax that is no attention's gets none.

A generator (hypothesis) writes one encoder attention block (``x`` projected to q, k, v,
heads split and transposed, ``Softmax(q @ K^T * c [+ mask]) @ v``, the heads merged)
with one step spelled in a way no canonical rule takes and no pattern binds, drawn
among: K^T written into a buffer by a ScatterND, a CumSum along K^T's keys, an Erf or a
Sin between the scaled scores and the Softmax, the scores transposed before the Softmax
(a Softmax over the queries), the Softmax on the heads' axis. Nothing may fuse into an
attention op, and a near miss of the attention pattern must name a node of the block.
Before the probe stepped through elementwise ops no rule knows (and a Transpose), the
Erf, Sin and transposed-scores draws had no attention near miss at all.

The false alarms: a classifier head (``Softmax(x @ W + b)``, W a constant) and a
mixture-of-experts-free graph whose Softmax reads no product of two activations get no
attention near miss. ``AUTOFUSION_SPELLING_EXAMPLES`` sets the example budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet
from tests.fusion_core.spelling_settings import SPELLINGS as SETTINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

HIDDEN = 16
BROKEN = ["scatter_key", "cumsum_key", "erf_scores", "sin_scores", "transposed_scores", "axis"]
ATTENTION_OPS = ("MultiHeadAttention", "Attention", "GroupQueryAttention")


@dataclass(frozen=True)
class Block:
    heads: int
    masked: bool
    broken: str  # one of BROKEN


def named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each node named after its first output, so a near miss can name it."""
    for node in model.graph.node:
        node.name = node.name or node.output[0]
    return model


def _key_lines(broken: str) -> list[str]:
    """``kT`` ``[B, N, H, L]`` from the key heads ``kh`` ``[B, L, N, H]``."""
    lines = ["kT0 = Transpose <perm = [0, 2, 3, 1]> (kh)"]
    if broken == "scatter_key":  # the keys written into a zeroed buffer, batch row 0
        return [*lines, "buffer = Mul (kT0, zero_f)", "kT = ScatterND (buffer, row_0, kT0)"]
    if broken == "cumsum_key":
        return [*lines, "kT = CumSum (kT0, axis_last)"]
    return ["kT = Transpose <perm = [0, 2, 3, 1]> (kh)"]


def _softmax_lines(s: Block) -> list[str]:
    """``probs`` from ``scores`` (the scaled, maybe masked, scores)."""
    if s.broken in ("erf_scores", "sin_scores"):
        op = "Erf" if s.broken == "erf_scores" else "Sin"
        return [f"odd = {op} (scores)", "probs = Softmax <axis = -1> (odd)"]
    if s.broken == "transposed_scores":  # over the queries: no rule turns it back
        return [
            "swapped = Transpose <perm = [0, 1, 3, 2]> (scores)",
            "probs = Softmax <axis = -1> (swapped)",
        ]
    if s.broken == "axis":
        return ["probs = Softmax <axis = 1> (scores)"]
    return ["probs = Softmax <axis = -1> (scores)"]


def attention_block(s: Block, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    n, h = s.heads, HIDDEN // s.heads
    inits = {
        "scale": np.array(h**-0.5, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "lowest": np.array(-1e4, np.float32),
        "row_0": np.array([[0]], np.int64),
        "axis_last": np.array(-1, np.int64),
        "split": np.array([0, 0, n, h], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "pad_axes": np.array([1, 2], np.int64),
        "wo": rng.standard_normal((HIDDEN, HIDDEN)) * 0.3,
    }
    body = []
    for p in "qkv":
        inits[f"w{p}"] = rng.standard_normal((HIDDEN, HIDDEN)) * 0.3
        body += [f"{p}m = MatMul (x, w{p})", f"{p}h = Reshape ({p}m, split)"]
    body += [
        "qt = Transpose <perm = [0, 2, 1, 3]> (qh)",
        "vt = Transpose <perm = [0, 2, 1, 3]> (vh)",
    ]
    body += [*_key_lines(s.broken), "qk = MatMul (qt, kT)", "scaled = Mul (qk, scale)"]
    if s.masked:
        body += [
            "keep_u = Unsqueeze (attention_mask, pad_axes)",
            "keep = Cast <to = 9> (keep_u)",
            "bias = Where (keep, zero_f, lowest)",
            "scores = Add (scaled, bias)",
        ]
    else:
        body.append("scores = Identity (scaled)")
    body += [
        *_softmax_lines(s),
        "context = MatMul (probs, vt)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    inputs = [f"float[batch, 5, {HIDDEN}] x"] + (["int64[batch, 5] attention_mask"] * s.masked)
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({", ".join(inputs)}) => (float[batch, 5, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    return named(build_model(text, inits))


@st.composite
def blocks(draw) -> Block:
    return Block(
        heads=draw(st.sampled_from([2, 4])),
        masked=draw(st.booleans()),
        broken=draw(st.sampled_from(BROKEN)),
    )


@SETTINGS
@given(blocks())
def test_an_attention_broken_in_one_step_gets_a_near_miss_naming_its_block(s: Block) -> None:
    model = attention_block(s)
    block = {node.name for node in model.graph.node}
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    assert done.ops_among(ATTENTION_OPS) == [], f"{s}: {done.ops}"
    about = [m for m in done.result.near_misses if m.pattern.startswith("attention")]
    assert any(block & set(m.nodes) for m in about), f"{s}: {about}"


def test_a_well_spelled_block_fuses_so_the_generator_breaks_only_the_drawn_step() -> None:
    for masked in (False, True):
        done = fuse_quiet(attention_block(Block(2, masked, "none")), exclude=["qkv_merge"])
        assert len(done.ops_among(ATTENTION_OPS)) == 1, done.ops


CLASSIFIERS = {
    "head": ["logits = MatMul (x, w)", "biased = Add (logits, b)", "y = Softmax (biased)"],
    "scaled-head": ["logits = MatMul (x, w)", "t = Div (logits, temp)", "y = Softmax (t)"],
    "gated": [
        "g = Sigmoid (x)",
        "e = Mul (x, g)",
        "logits = MatMul (e, w)",
        "y = Softmax (logits)",
    ],
    "softmax-of-input": ["r = Relu (x)", "y = Softmax (r)"],
}


@SETTINGS
@given(st.sampled_from(sorted(CLASSIFIERS)), st.sampled_from([4, 8]))
def test_a_softmax_that_is_no_attention_gets_no_attention_near_miss(case: str, k: int) -> None:
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, {k}] x) => (float[batch, {k}] y) {{
        {chr(10).join(CLASSIFIERS[case])}
    }}"""
    inits = {
        "w": np.random.default_rng(k).standard_normal((k, k)),
        "b": np.zeros(k),
        "temp": np.array(2.0, np.float32),
    }
    done = fuse_quiet(named(build_model(text, inits)))
    assert done.misses_about("attention") == [], case
