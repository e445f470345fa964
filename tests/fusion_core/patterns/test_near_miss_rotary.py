"""Every rotary embedding left unfused gets a near miss naming a node of it (issue 24);
an Add of products that is no rotary's gets none.

A generator (hypothesis) writes Llama's rotary ``y = x * cos + rotate_half(x) * sin``
(``rotate_half(x) = Concat(-x[..., h:], x[..., :h])``) on heads ``x[B, 4, S, 16]``, on
every feature or on the first 8 (the rest concatenated back), its tables the Cos and
Sin of ``Range(0, S)`` angles or constant ``[1, 1, S, r]`` caches (what constant folding
leaves), with one step of the rotation spelled in a way no rule takes, drawn among: the
Neg an Abs, the halves concatenated in the wrong order, the low half through a Sin; and
GPT-J's rotate_every_two, its Neg an Abs or its pairs concatenated the wrong way round.
Nothing may fuse into a RotaryEmbedding, and a near miss of a rotary pattern must name
a node of the block. Before the probe ``rotary_product`` and the patterns' ``explain``,
none of them had one.

The false alarms, Adds of two products whose factors are no cos and sin tables of one
set of heads: a weighted sum of two inputs, a norm's affine tail, a gated blend, the
same ``x`` twice, ``x`` and an activation of it; none gets a rotary near miss.
``AUTOFUSION_SPELLING_EXAMPLES`` sets the example budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet
from tests.fusion_core.decoder_text import FREQ_TABLES
from tests.fusion_core.rewriters.test_rotary import rotary_constants
from tests.fusion_core.rewriters.test_rotary_interleaved import gptj_block
from tests.fusion_core.spelling_settings import SPELLINGS as SETTINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

SEQ = 5
BROKEN = ["neg_abs", "concat_order", "low_sin"]


@dataclass(frozen=True)
class Rotary:
    partial: bool
    constant_tables: bool
    broken: str  # one of BROKEN, or "" for the well-spelled block


def named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Each node named after its first output, so a near miss can name it."""
    for node in model.graph.node:
        node.name = node.name or node.output[0]
    return model


def _tables(s: Rotary, rotary: int, inits: dict) -> list[str]:
    """``cos_u``, ``sin_u``: ``[1, 1, S, rotary]``."""
    inv_freq = 1.0 / (10000 ** (np.arange(0, rotary, 2) / rotary))
    if s.constant_tables:
        angles = np.arange(SEQ)[:, None] * inv_freq[None, :]
        emb = np.concatenate([angles, angles], axis=-1)[None, None]
        inits["cos_u"], inits["sin_u"] = np.cos(emb), np.sin(emb)
        return []
    inits["inv_freq"] = inv_freq
    return [
        "x_shape = Shape (x)",
        "seq_len = Gather <axis = 0> (x_shape, index_2)",
        "ar = Range (start, seq_len, step)",
        "ar_f = Cast <to = 1> (ar)",
        "ar_u = Unsqueeze (ar_f, axis_last)",
        "freqs_2d = Mul (ar_u, inv_freq)",
        "freqs = Unsqueeze (freqs_2d, zero)",
        *FREQ_TABLES,
    ]


def _rotation(broken: str, rotated: str) -> list[str]:
    """``rot``, ``rotate_half(rotated)`` but for the ``broken`` step."""
    neg = "Abs" if broken == "neg_abs" else "Neg"
    low = "lo"
    body = [
        f"lo = Slice ({rotated}, zero, half, last)",
        f"hi = Slice ({rotated}, half, end, last)",
        f"neg = {neg} (hi)",
    ]
    if broken == "low_sin":
        body.append("lo_odd = Sin (lo)")
        low = "lo_odd"
    halves = f"{low}, neg" if broken == "concat_order" else f"neg, {low}"
    return [*body, f"rot = Concat <axis = -1> ({halves})"]


def rotary_block(s: Rotary) -> onnx.ModelProto:
    rotary = 8 if s.partial else 16
    inits = {
        **rotary_constants(rotary),
    }
    body = _tables(s, rotary, inits)
    rotated = "xr" if s.partial else "x"
    if s.partial:
        body += ["xr = Slice (x, zero, rdim, last)", "xp = Slice (x, rdim, end, last)"]
    body += [
        *_rotation(s.broken, rotated),
        f"c = Mul ({rotated}, cos_u)",
        "s = Mul (rot, sin_u)",
        "sum = Add (c, s)" if s.partial else "y = Add (c, s)",
    ]
    if s.partial:
        body.append("y = Concat <axis = -1> (sum, xp)")
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 4, {SEQ}, 16] x) => (float[batch, 4, {SEQ}, 16] y) {{
        {chr(10).join(body)}
    }}"""
    return named(build_model(text, inits))


@SETTINGS
@given(st.booleans(), st.booleans(), st.sampled_from(BROKEN))
def test_a_rotary_broken_in_one_step_gets_a_near_miss_naming_it(partial, constant, broken):
    s = Rotary(partial, constant, broken)
    model = rotary_block(s)
    block = {node.name for node in model.graph.node}
    done = fuse_quiet(model)
    assert "RotaryEmbedding" not in done.ops, f"{s}: {done.ops}"
    about = [m for m in done.result.near_misses if m.pattern.startswith("rotary")]
    assert any(block & set(m.nodes) for m in about), f"{s}: {about}"


@SETTINGS
@given(st.booleans(), st.booleans(), st.sampled_from(["neg_abs", "pairs_swapped"]))
def test_a_gptj_rotary_broken_in_one_step_gets_a_near_miss_naming_it(partial, gathered, broken):
    """GPT-J's rotate_every_two (tests/fusion_core/rewriters/test_rotary_interleaved.py's
    block, which fuses as written), its Neg an Abs or its pairs concatenated the other
    way round."""
    model = named(gptj_block(partial=partial, gathered=gathered))
    for node in model.graph.node:
        if broken == "neg_abs" and node.op_type == "Neg":
            node.op_type = "Abs"
        if broken == "pairs_swapped" and node.name == "pairs":
            node.input[:] = list(reversed(node.input))
    block = {node.name for node in model.graph.node}
    done = fuse_quiet(model)
    assert "RotaryEmbedding" not in done.ops, f"{broken}: {done.ops}"
    about = [m for m in done.result.near_misses if m.pattern.startswith("rotary")]
    assert any(block & set(m.nodes) for m in about), f"{partial, gathered, broken}: {about}"


def test_the_well_spelled_rotary_fuses_so_the_generator_breaks_only_the_drawn_step() -> None:
    for partial in (False, True):
        for constant in (False, True):
            done = fuse_quiet(rotary_block(Rotary(partial, constant, "")))
            assert done.ops.count("RotaryEmbedding") == 1, (partial, constant, done.ops)


NOT_ROTARY = {
    "weighted-sum": ["p = Mul (x, a)", "q = Mul (z, b)", "y = Add (p, q)"],
    "norm-tail": ["p = Mul (x, a)", "y = Add (p, b)"],
    "gated-blend": [
        "g = Sigmoid (z)",
        "h = Sub (one, g)",
        "p = Mul (x, g)",
        "q = Mul (z, h)",
        "y = Add (p, q)",
    ],
    "same-x": ["p = Mul (x, a)", "q = Mul (x, b)", "y = Add (p, q)"],
    "x-and-relu": ["r = Relu (x)", "p = Mul (x, a)", "q = Mul (r, b)", "y = Add (p, q)"],
}


@SETTINGS
@given(st.sampled_from(sorted(NOT_ROTARY)), st.sampled_from([4, 16]))
def test_an_add_of_products_that_is_no_rotary_gets_no_rotary_near_miss(case, width):
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, {width}] x, float[batch, {width}] z) => (float[batch, {width}] y) {{
        {chr(10).join(NOT_ROTARY[case])}
    }}"""
    rng = np.random.default_rng(width)
    inits = {
        "a": rng.standard_normal(width),
        "b": rng.standard_normal(width),
        "one": np.array(1.0, np.float32),
    }
    done = fuse_quiet(named(build_model(text, inits)))
    assert done.misses_about("rotary") == [], case
