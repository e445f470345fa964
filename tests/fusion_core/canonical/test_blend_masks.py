"""Rules ``blend_mask`` and ``bounded_fill`` on generated attention blocks whose causal
mask is a blend (OpenAI GPT's ``w * b + c * (1 - b)``, ``b`` a 0/1 buffer or its slice):
the attention fuses exactly once and computes what the block computes, on padded and
unpadded masks (rtol = atol = 1e-5, as tests/fusion_core/canonical/
test_attention_spellings.py: the fused op rounds its own products and sums).

The generator draws the spellings an exporter writes: each Mul's and the Add's operands
in either order, ``1 - b`` as ``Sub(1, b)`` or ``Add(Neg(b), 1)``, the blend as ``w * b
- d * (1 - b)``, the fills -1e4 (not absorbed by the scores: the bound on the scores
proves the Softmax cannot tell it from -1e30), -1e9 and float32's lowest, ``b`` a
constant or a Slice of a longer buffer, the heads and their size, and a padding mask
``(1 - m) * lowest`` or none. The cases a rule must refuse keep the graph as it was: a
``b`` not proven to hold only 0 and 1 (a graph input, a constant holding 0.5), and
scores that could reach ``-c - 104`` (a norm scaled up, or scores from a graph input).

``AUTOFUSION_SPELLING_EXAMPLES`` sets the example budget (25 in ``make test``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet, op_sequence, run_both
from tests.fusion_core import encoder_text as text
from tests.fusion_core.spelling_settings import EXAMPLES, SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
LOWEST = float(np.finfo(np.float32).min)
BUFFER = 16  # the buffer's rows and columns where b is a slice of it
# the heads' target read from the input's batch and sequence at run time
_SPLIT = [
    "batch_1 = Shape <start = 0, end = 1> (x)",
    "seq_1 = Shape <start = 1, end = 2> (x)",
    "split = Concat <axis = 0> (batch_1, seq_1, heads_size)",
]
EXCLUDE = ["qkv_merge", "kv_merge"]  # the three projections stay three MatMuls


@dataclass(frozen=True)
class Blend:
    heads: int
    size: int
    seq: int  # the sequence length where b is a whole constant (no slice)
    fill: float
    sliced: bool  # b = bias[:, :, :S, :S] of a [1, 1, 16, 16] buffer, else a constant
    scores_first: bool  # Mul(w, b), else Mul(b, w)
    inverse: str  # "sub": Sub(1, b); "neg_add": Add(Neg(b), 1); "add_neg": Add(1, Neg(b))
    fill_first: bool  # Mul(c, 1 - b), else Mul(1 - b, c)
    joined: str  # "add": kept + filled; "add_filled_first": filled + kept; "sub": kept - d(1-b)
    padding: bool
    gamma: float = 1.0  # the norm's scale: large makes the scores' bound too large
    b_source: str = "buffer"  # "input": b a graph input; "half": a constant of 0.5s


@st.composite
def blends(draw) -> Blend:
    return Blend(
        heads=draw(st.sampled_from([1, 2, 4])),
        size=draw(st.sampled_from([4, 8])),
        seq=draw(st.integers(1, 6)),
        fill=draw(st.sampled_from([-1e4, -1e9, LOWEST])),
        sliced=draw(st.booleans()),
        scores_first=draw(st.booleans()),
        inverse=draw(st.sampled_from(["sub", "neg_add", "add_neg"])),
        fill_first=draw(st.booleans()),
        joined=draw(st.sampled_from(["add", "add_filled_first", "sub"])),
        padding=draw(st.booleans()),
    )


def _mask_lines(b: Blend) -> list[str]:
    """``b`` and the blend of ``scores`` with it into ``blended``."""
    lines = []
    if b.sliced:
        lines += [
            "rows = Slice (buffer, zero, seq_1, two)",
            "b = Slice (rows, zero, seq_1, three)",
        ]
    elif b.b_source != "input":
        lines.append("b = Identity (buffer)")
    kept = "Mul (scores, b)" if b.scores_first else "Mul (b, scores)"
    inverse = {
        "sub": ["inv = Sub (one_f, b)"],
        "neg_add": ["neg_b = Neg (b)", "inv = Add (neg_b, one_f)"],
        "add_neg": ["neg_b = Neg (b)", "inv = Add (one_f, neg_b)"],
    }[b.inverse]
    fill = "minus_fill" if b.joined == "sub" else "fill"
    filled = f"Mul ({fill}, inv)" if b.fill_first else f"Mul (inv, {fill})"
    joined = {
        "add": "Add (kept, filled)",
        "add_filled_first": "Add (filled, kept)",
        "sub": "Sub (kept, filled)",
    }[b.joined]
    return [*lines, f"kept = {kept}", *inverse, f"filled = {filled}", f"blended = {joined}"]


def _padding_lines(b: Blend) -> list[str]:
    if not b.padding:
        return []
    return [
        "mask_u = Unsqueeze (attention_mask, pad_axes)",
        "mask_f = Cast <to = 1> (mask_u)",
        "unmasked = Sub (one_f, mask_f)",
        "pad = Mul (unmasked, lowest)",
        "biased = Add (blended, pad)",
    ]


def _inputs(b: Blend, hidden: int) -> str:
    seq = "seq" if b.sliced else str(b.seq)
    inputs = [f"float[batch, {seq}, {hidden}] x"]
    if b.padding:
        inputs.append(f"int64[batch, {seq}] attention_mask")
    if b.b_source == "input":
        inputs.append(f"float[1, 1, {seq}, {seq}] b")
    return ", ".join(inputs)


def _buffer(b: Blend) -> np.ndarray:
    n = BUFFER if b.sliced else b.seq
    causal = np.tril(np.ones((n, n), np.float32)).reshape(1, 1, n, n)
    return np.full_like(causal, 0.5) if b.b_source == "half" else causal


def blend_block(b: Blend, seed: int = 0) -> onnx.ModelProto:
    """A normed input, its q, k and v heads, scores blended with the mask, the context
    projected back: OpenAI GPT's attention as dynamo writes it."""
    hidden = b.heads * b.size
    seq = "seq" if b.sliced else str(b.seq)
    body = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({_inputs(b, hidden)}) => (float[batch, {seq}, {hidden}] y) {{
        {text.lines(text.PROJECTIONS, _SPLIT, text.HEADS, text.SCORES)}
        {chr(10).join(_mask_lines(b) + _padding_lines(b))}
        probs = Softmax <axis = -1> ({"biased" if b.padding else "blended"})
        merge = Concat <axis = 0> (batch_1, seq_1, hidden_1)
        {text.lines(text.CONTEXT)}
    }}"""
    rng = np.random.default_rng(seed)
    weights = {w: rng.standard_normal((hidden, hidden)) / np.sqrt(hidden) for w in "qkvo"}
    inits = {
        "gamma": np.full(hidden, b.gamma) * rng.uniform(0.5, 1.0, hidden),
        "beta": 0.1 * rng.standard_normal(hidden),
        **{f"w{w}": a for w, a in weights.items()},
        "heads_size": np.array([b.heads, b.size], np.int64),
        "hidden_1": np.array([hidden], np.int64),
        "scale": np.array(np.sqrt(b.size), np.float32),
        "one_f": np.array(1.0, np.float32),
        "fill": np.array(b.fill, np.float32),
        "minus_fill": np.array(-b.fill, np.float32),
        "lowest": np.array(LOWEST, np.float32),
        "zero": np.array([0], np.int64),
        "two": np.array([2], np.int64),
        "three": np.array([3], np.int64),
        "pad_axes": np.array([1, 2], np.int64),
    }
    if b.b_source != "input":
        inits["buffer"] = _buffer(b)
    return build_model(body, inits, only_read=True)


def feeds(b: Blend, batch: int, seq: int, *, padded: bool) -> dict[str, np.ndarray]:
    """Inputs of ``seq`` tokens; ``padded``: the first row left-padded (its first
    queries see only padded keys: the rows where a fill that is not absorbed would
    show), the second padded at random."""
    rng = np.random.default_rng(batch * 100 + seq)
    hidden = b.heads * b.size
    out = {"x": rng.standard_normal((batch, seq, hidden)).astype(np.float32)}
    if b.padding:
        mask = np.ones((batch, seq), np.int64)
        if padded:
            mask[0, : max(1, seq // 2)] = 0
            mask[1:] = rng.integers(0, 2, (batch - 1, seq))
        out["attention_mask"] = mask
    return out


def _shapes(b: Blend) -> list[tuple[int, int]]:
    return [(1, 5), (2, 3), (3, BUFFER)] if b.sliced else [(2, b.seq)]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(blends())
def test_every_blend_fuses_into_one_attention_exactly(b: Blend) -> None:
    model = blend_block(b)
    done = fuse_quiet(model, exclude=EXCLUDE)
    fused_attention = done.ops_among(("MultiHeadAttention", "Attention"))
    assert len(fused_attention) == 1, f"{b}: {done.ops}; {done.misses_about('attention')[:3]}"
    assert "Softmax" not in done.ops, b
    onnx.checker.check_model(done.model, full_check=True)
    for batch, seq in _shapes(b):
        for padded in (False, True):
            run_both(model, done.model, feeds=feeds(b, batch, seq, padded=padded), **TOL)


BASE = Blend(
    heads=2, size=4, seq=5, fill=-1e4, sliced=True, scores_first=True, inverse="sub",
    fill_first=False, joined="add", padding=True,
)  # fmt: skip


def _counted(ops: list[str], kinds: tuple[str, ...]) -> dict[str, int]:
    return {kind: ops.count(kind) for kind in kinds}


def _left_as_it_was(b: Blend, target: str = "onnxruntime") -> None:
    """The block does not fuse, its mask comes out with its own ops (the blend's, no
    Where; other rules may make its shape computations constants), and it computes what
    it computed (rtol = atol = 0: nothing of the scores' path is changed)."""
    model = blend_block(b)
    done = fuse_quiet(model, exclude=EXCLUDE, target=target)
    assert not done.ops_among(("MultiHeadAttention", "Attention")), done.ops
    mask_ops = ("Slice", "Mul", "Sub", "Neg", "Add", "Where", "Softmax")
    assert _counted(op_sequence(done.model), mask_ops) == _counted(op_sequence(model), mask_ops)
    for padded in (False, True):
        feed = feeds(b, 2, b.seq, padded=padded)
        if b.b_source == "input":
            feed["b"] = _buffer(replace(b, b_source="buffer"))
        run_both(model, done.model, feeds=feed, rtol=0, atol=0)


def test_a_blend_of_a_graph_input_is_left():
    """``b`` a graph input may hold anything: ``w * b + c * (1 - b)`` is no Where."""
    _left_as_it_was(replace(BASE, sliced=False, b_source="input"))


def test_a_blend_of_halves_is_left():
    """A buffer of 0.5s: ``w / 2 + c / 2`` is neither ``w`` nor ``c``."""
    _left_as_it_was(replace(BASE, b_source="half"))


@pytest.mark.parametrize("padding", [False, True])
def test_a_blend_no_fusion_takes_is_written_back(padding: bool):
    """The generic target at opset 18 has no attention op: every rule applies (the
    padding's sum regrouped by ``one_bias`` too) and each is taken back, the blend with
    its fill -1e4 and its buffer's slices."""
    _left_as_it_was(replace(BASE, padding=padding), target="generic")


def test_scores_that_may_reach_the_fill_keep_it():
    """A norm scaled by 1000: the scores' proven bound passes ``-c - 104`` for ``c =
    -1e4``, a row's kept scores could sit near the fill, and ``exp(c - max)`` would not
    vanish: the fill is not made -1e30, nothing fuses, and the blend is written back."""
    _left_as_it_was(replace(BASE, gamma=1000.0))


def _largest_scores(model: onnx.ModelProto, x: np.ndarray, heads: int) -> float:
    """``max |q . k| / sqrt(H)`` of ``blend_block``'s scores, in float64."""
    arrays = {
        t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer
    }
    centered = x - x.mean(-1, keepdims=True)
    normed = centered / np.sqrt(centered.var(-1, keepdims=True) + 1e-5)
    normed = normed * arrays["gamma"] + arrays["beta"]
    size = x.shape[-1] // heads
    q, k = (
        (normed @ arrays[w]).reshape(*x.shape[:2], heads, size).transpose(0, 2, 1, 3)
        for w in ("wq", "wk")
    )
    return float(np.abs(q @ k.transpose(0, 1, 3, 2)).max() / np.sqrt(size))


@SPELLINGS
@given(gamma=st.floats(1.0, 300.0), spread=st.floats(0.1, 100.0))
def test_a_fill_is_made_absorbed_only_below_its_bound(gamma: float, spread: float) -> None:
    """Where the -1e4 fill fused (the rule proved ``|w| + 104 < 1e4``), no input makes a
    score reach it: inputs of any scale (the norm takes the scale out), their rows
    pushed along one direction so the scores peak."""
    b = replace(BASE, gamma=gamma, padding=False)
    model = blend_block(b)
    fused = fuse_quiet(model, exclude=EXCLUDE).ops_among(("MultiHeadAttention", "Attention"))
    if not fused:
        return
    rng = np.random.default_rng(int(gamma * 1000))
    hidden = b.heads * b.size
    direction = rng.standard_normal(hidden)
    x = spread * (rng.standard_normal((4, BUFFER, hidden)) + 3.0 * direction)
    assert _largest_scores(model, x, b.heads) + 104 < 1e4
