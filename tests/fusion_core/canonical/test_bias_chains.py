"""Rule ``one_bias`` on generated chains of biases: ``(((scores + b1) + b2) + ...)``
with 2 to 4 biases, the general ones (``2 * Tanh(p)`` of a graph input, a position or
token-type score) and at most one mask in any place of the chain: ``Where(keep, 0, f)``
or BERT's ``(1 - Cast(m)) * f`` with ``f`` -inf (Where only: ``0 * -inf`` is NaN),
-1e30, -1e6 (Funnel's) or -1e4.

The chain folds into one bias, and the attention fuses exactly once, where the module
says it may: always for general biases and absorbing masks, and for a finite fill only
where the scores are proven small enough (``2 B + 104 < -f``): a norm of scale 1 (every
fill), of scale 100 (``B`` 3.3e4 and 1.1e5 for one and two heads: -1e6 yes, -1e4 no),
or of a scale that is a graph input (nothing proven: no finite fill). Where it is refused nothing
fuses and the block computes what it did bit for bit.

Tolerance of a fused case: the fused op and the regrouped sums round each logit by a
few units in the last place of the logits' magnitude ``M`` (``|q| |k| / sqrt(H)`` plus
the biases' bounds, computed from the inputs in float64); a probability moves by at
most twice a logit's change, so ``atol = 2 * 16 * 2**-24 * M`` (at least 1e-5, the
attention tests' tolerance), rtol = 1e-5. Every row keeps its first key: in a row with
no kept key both spellings round ``s + f`` to units of ``|f|``, as the module says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet, run_both
from tests.fusion_core import encoder_text as text
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

EXCLUDE = ["qkv_merge", "kv_merge"]  # the three projections stay three MatMuls
ATTENTION = ("MultiHeadAttention", "Attention")
GENERAL_SCALE = 2.0  # each general bias is 2 * Tanh(p): at most 2 in magnitude
SCALES = {"small": 1.0, "large": 100.0, "input": None}  # None: gamma is a graph input


@dataclass(frozen=True)
class Chain:
    heads: int
    seq: int
    generals: int
    mask: str | None  # "where", "bert" or None
    fill: float
    at: int  # the mask's place among the biases
    scale: str  # a key of SCALES

    @property
    def hidden(self) -> int:
        return self.heads * 4

    def fuses(self) -> bool:
        """What the module promises (see the docstring's regimes)."""
        if self.mask is None or self.fill <= -1e30:
            return True
        return self.scale == "small" or (self.scale == "large" and self.fill <= -1e6)


@st.composite
def chains(draw) -> Chain:
    mask = draw(st.sampled_from([None, "where", "bert"]))
    generals = draw(st.integers(2 if mask is None else 1, 4 if mask is None else 3))
    fills = [-np.inf, -1e30, -1e6, -1e4] if mask == "where" else [-1e30, -1e6, -1e4]
    return Chain(
        heads=draw(st.sampled_from([1, 2])),
        seq=draw(st.integers(2, 5)),
        generals=generals,
        mask=mask,
        fill=draw(st.sampled_from(fills)),
        at=draw(st.integers(0, generals)),
        scale=draw(st.sampled_from(sorted(SCALES))),
    )


def _bias_lines(c: Chain) -> tuple[list[str], list[str]]:
    """The lines computing each bias, and the biases in the chain's order."""
    lines, names = [], []
    for i in range(c.generals):
        lines += [f"tanh_{i} = Tanh (p_{i})", f"g_{i} = Mul (tanh_{i}, general_scale)"]
        names.append(f"g_{i}")
    if c.mask == "where":
        lines += [
            "keep_u = Unsqueeze (attention_mask, pad_axes)",
            "keep = Cast <to = 9> (keep_u)",
            "mask = Where (keep, zero_f, fill)",
        ]
    elif c.mask == "bert":
        lines += [
            "mask_u = Unsqueeze (attention_mask, pad_axes)",
            "mask_f = Cast <to = 1> (mask_u)",
            "inverted = Sub (one_f, mask_f)",
            "mask = Mul (inverted, fill)",
        ]
    if c.mask is not None:
        names.insert(c.at, "mask")
    return lines, names


def chain_block(c: Chain, seed: int = 0) -> onnx.ModelProto:
    """A normed input, its q, k and v heads, the scaled scores plus the chain, the
    context projected back."""
    lines, names = _bias_lines(c)
    chain, last = [], "scores"
    for i, name in enumerate(names):
        chain.append(f"sum_{i} = Add ({last}, {name})")
        last = f"sum_{i}"
    inputs = [f"float[batch, {c.seq}, {c.hidden}] x", f"int64[batch, {c.seq}] attention_mask"]
    inputs += [f"float[1, {c.heads}, {c.seq}, {c.seq}] p_{i}" for i in range(c.generals)]
    if SCALES[c.scale] is None:
        inputs.append(f"float[{c.hidden}] gamma")
    body = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({", ".join(inputs)}) => (float[batch, {c.seq}, {c.hidden}] y) {{
        {text.lines(text.PROJECTIONS, text.HEADS, text.SCORES, lines, chain)}
        probs = Softmax <axis = -1> ({last})
        {text.lines(text.CONTEXT)}
    }}"""
    rng = np.random.default_rng(seed)
    inits = {w: rng.standard_normal((c.hidden, c.hidden)) / np.sqrt(c.hidden) for w in _W}
    if SCALES[c.scale] is not None:
        inits["gamma"] = np.full(c.hidden, SCALES[c.scale])
    inits |= {
        "beta": 0.1 * rng.standard_normal(c.hidden),
        "split": np.array([0, c.seq, c.heads, 4], np.int64),
        "merge": np.array([0, c.seq, c.hidden], np.int64),
        "scale": np.array(2.0, np.float32),  # sqrt(4)
        "one_f": np.array(1.0, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "fill": np.array(c.fill, np.float32),
        "general_scale": np.array(GENERAL_SCALE, np.float32),
        "pad_axes": np.array([1, 2], np.int64),
    }
    return build_model(body, inits, only_read=True)


_W = ("wq", "wk", "wv", "wo")


def feeds(c: Chain, batch: int = 2, seed: int = 1) -> dict[str, np.ndarray]:
    """Random inputs; the padding masks keys at random but never a row's first key."""
    rng = np.random.default_rng(seed)
    mask = rng.integers(0, 2, (batch, c.seq)).astype(np.int64)
    mask[:, 0] = 1
    out = {"x": rng.standard_normal((batch, c.seq, c.hidden)).astype(np.float32)}
    out["attention_mask"] = mask
    for i in range(c.generals):
        out[f"p_{i}"] = rng.standard_normal((1, c.heads, c.seq, c.seq)).astype(np.float32)
    if SCALES[c.scale] is None:
        out["gamma"] = np.ones(c.hidden, np.float32)
    return out


def _logit_scale(model: onnx.ModelProto, c: Chain, feed: dict[str, np.ndarray]) -> float:
    """``max |q| |k| / sqrt(H)`` over the heads' rows, plus the general biases' bound,
    in float64 from the inputs."""
    arrays = {
        t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer
    }
    gamma = arrays.get("gamma", feed.get("gamma"))
    x = feed["x"].astype(np.float64)
    centered = x - x.mean(-1, keepdims=True)
    normed = centered / np.sqrt(centered.var(-1, keepdims=True) + 1e-5) * gamma + arrays["beta"]
    norms = [
        np.linalg.norm((normed @ arrays[w]).reshape(*x.shape[:2], c.heads, 4), axis=-1).max()
        for w in ("wq", "wk")
    ]
    return float(norms[0] * norms[1] / 2.0 + GENERAL_SCALE * c.generals)


@SPELLINGS
@given(chains())
def test_a_chain_folds_and_fuses_once_where_the_module_says(c: Chain) -> None:
    model = chain_block(c)
    done = fuse_quiet(model, exclude=EXCLUDE)
    fused = done.ops_among(ATTENTION)
    feed = feeds(c)
    if not c.fuses():
        assert not fused, f"{c}: {done.ops}"
        run_both(model, done.model, feeds=feed, rtol=0, atol=0)
        return
    assert len(fused) == 1, f"{c}: {done.ops}; {done.misses_about('attention')[:3]}"
    assert "Softmax" not in done.ops, c
    onnx.checker.check_model(done.model, full_check=True)
    atol = max(1e-5, 2 * 16 * 2.0**-24 * _logit_scale(model, c, feed))
    run_both(model, done.model, feeds=feed, rtol=1e-5, atol=atol)
