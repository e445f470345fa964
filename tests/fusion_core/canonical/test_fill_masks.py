"""The rules of ``fusion_core/canonical/_fill_masks.py`` on generated float masks: each
rewrites exactly when its proof holds, and the rewritten graph computes the same
probabilities, bit for bit (the masks are equal up to the sign of a zero, so the Softmax
reads the same numbers: rtol = atol = 0).

The generator draws the spellings of transformers' older AttentionMaskConverter and the
variations that must not be rewritten: a Trilu offset past the diagonal (``k = 2``
leaves a key the comparison masks unmasked by the Trilu), a fill of -inf (``-inf * 0``
is NaN), a fill too small to be absorbed (-1e4), a float padding mask (``fill + m`` may
not round to the fill), the comparison written either way round, the product's operands
in either order, with and without a past.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import canonical_form
from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses
from autofusion.fusion_core.testing import build_model, run_both

LOWEST = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Mask:
    k: int  # the Trilu's diagonal offset
    fill: float
    greater: bool  # Greater(key, query), else Less(query, key)
    trilu_first: bool  # Mul(Trilu, Cast) or Mul(Cast, Trilu)
    float_padding: bool  # the padding mask a float input
    cache: bool

    @property
    def causal_exact(self) -> bool:
        return self.k <= 1 and bool(np.isfinite(self.fill)) and self.fill <= -1e30

    @property
    def padding_exact(self) -> bool:
        return self.causal_exact and not self.float_padding


@st.composite
def masks(draw) -> Mask:
    return Mask(
        k=draw(st.sampled_from([-1, 0, 1, 2])),
        fill=draw(st.sampled_from([LOWEST, -1e38, -np.inf, -1e4])),
        greater=draw(st.booleans()),
        trilu_first=draw(st.booleans()),
        float_padding=draw(st.booleans()),
        cache=draw(st.booleans()),
    )


def mask_model(m: Mask):
    """Scores ``[B, 1, S, L]`` plus the converter's mask, into a Softmax."""
    past = "Gather <axis = 0> (past_shape, index_2)" if m.cache else "Identity (start)"
    compare = "Greater (kv_pos, q_column)" if m.greater else "Less (q_column, kv_pos)"
    product = "Mul (above, later_f)" if m.trilu_first else "Mul (later_f, above)"
    padding = "float" if m.float_padding else "int64"
    total = '"past + seq"' if m.cache else "seq"
    grid = []
    for axis in range(4):
        grid += [
            f"n_{axis} = Gather <axis = 0> (grid, index_{axis})",
            f"r_{axis} = Range (start, n_{axis}, step)",
            f"c_{axis} = Reshape (r_{axis}, view_{axis})",
            f"e_{axis} = Expand (c_{axis}, grid)",
            f"u_{axis} = Unsqueeze (e_{axis}, last)",
        ]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 1, seq, {total}] scores, {padding}[batch, {total}] attention_mask,
       float[batch, 1, past, 4] past_key) => (float[batch, 1, seq, {total}] probs) {{
        past_shape = Shape (past_key)
        past_len = {past}
        s_shape = Shape (scores)
        seq_len = Gather <axis = 0> (s_shape, index_2)
        total_len = Add (past_len, seq_len)
        q_pos = Range (past_len, total_len, step)
        kv_pos = Range (start, total_len, step)
        seq_1 = Unsqueeze (seq_len, zero)
        total_1 = Unsqueeze (total_len, zero)
        square = Concat <axis = 0> (seq_1, total_1)
        full = ConstantOfShape <value = float[1] {{{m.fill!r}}}> (square)
        above = Trilu <upper = 1> (full, k)
        q_column = Reshape (q_pos, column)
        later = {compare}
        later_f = Cast <to = 1> (later)
        causal_f = {product}
        causal_2 = Unsqueeze (causal_f, zero)
        causal_3 = Unsqueeze (causal_2, one)
        batch_1 = Gather <axis = 0> (s_shape, zero)
        four = Concat <axis = 0> (batch_1, one, seq_1, total_1)
        expanded = Expand (causal_3, four)
        mask_u = Unsqueeze (attention_mask, pad_axes)
        am_f = Cast <to = 1> (mask_u)
        summed = Add (expanded, am_f)
        empty = Equal (summed, zero_f)
        padded = Where (empty, fill_value, expanded)
        grid = Shape (expanded)
        {chr(10).join(grid)}
        indices = Concat <axis = -1> (u_0, u_1, u_2, u_3)
        bias = ScatterND (expanded, indices, padded)
        biased = Add (scores, bias)
        probs = Softmax <axis = -1> (biased)
    }}"""
    inits = {
        "k": np.array(m.k, np.int64),
        "fill_value": np.array(m.fill, np.float32),
        "zero": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "last": np.array([-1], np.int64),
        "pad_axes": np.array([1, 2], np.int64),
        "column": np.array([-1, 1], np.int64),
        "start": np.array(0, np.int64),
        "step": np.array(1, np.int64),
        "zero_f": np.array(0.0, np.float32),
        **{f"index_{k}": np.array(k, np.int64) for k in range(4)},
        **{f"view_{k}": np.array([-1] + [1] * (3 - k), np.int64) for k in range(4)},
    }
    return build_model(text, inits)


def _feeds(m: Mask, batch: int, seq: int, past: int) -> dict:
    rng = np.random.default_rng(batch * 100 + seq * 10 + past)
    total = past + seq if m.cache else seq
    mask = rng.integers(0, 3, (batch, total))  # 0 masks; 1 and 2 let through
    return {
        "scores": rng.standard_normal((batch, 1, seq, total)).astype(np.float32),
        "attention_mask": mask.astype(np.float32 if m.float_padding else np.int64),
        "past_key": np.zeros((batch, 1, past if m.cache else 0, 4), np.float32),
    }


@settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(masks())
def test_a_converter_mask_is_rewritten_exactly_when_proven(m: Mask) -> None:
    original = mask_model(m)
    model = ir.from_proto(original)
    run_prepasses(model, PrepassOptions())
    names = iter(range(1_000_000))
    done = canonical_form(model.graph, lambda prefix: f"{prefix}_{next(names)}")
    assert (done["causal_fill"] == 1) is m.causal_exact, (m, done)
    assert (done["padding_fill"] == 1) is m.padding_exact, (m, done)
    assert done["whole_scatter"] == 1, (m, done)  # the grid covers the whole data
    ops = [node.op_type for node in model.graph]
    if m.padding_exact:  # the mask is Where(allowed, 0, lowest) of two conditions
        assert not {"ScatterND", "Trilu", "Mul", "Equal"} & set(ops), ops
    rewritten = ir.to_proto(model)
    for batch, seq, past in [(1, 3, 2), (2, 4, 3), (2, 1, 5)]:
        run_both(original, rewritten, feeds=_feeds(m, batch, seq, past), rtol=0, atol=0)
