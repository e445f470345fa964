"""Rule ``sink_scale`` on small generated graphs: Granite-SWA's attention sinks,

    C = (Softmax(s) @ V) * Unsqueeze(Sigmoid(ReduceLogSumExp(s) - b), -1)

become gpt-oss's ``Slice(Softmax(Concat(s, E)), :-1) @ V``, which the attention pattern
reads. The two normalize once rather than twice, so they agree to float32 rounding:
rtol = 1e-5, atol = 1e-6 on onnxruntime (its optimizations off), with scores up to 30
in size and whole rows of keys masked to the lowest float. A hypothesis generator draws
the shapes, the logits' layout, the Mul's operand order, TorchScript's identity Casts
and the opset (axes as attributes or inputs); the budget is
``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``). Before the rule the graph keeps
its ReduceLogSumExp (the attention pattern's near miss: a Mul after the context). What
no fusion took is put back by ``undo_unused``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import build_model, canonical_twice, op_sequence, run_both
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

CLOSE = dict(rtol=1e-5, atol=1e-6)
HEADS, HEAD_DIM = 4, 8


def scaled_context(
    *,
    logits: tuple[int, ...] = (1, HEADS, 1),
    swap: bool = False,
    casts: bool = False,
    opset: int = 18,
    shared_softmax: bool = False,
) -> onnx.ModelProto:
    """Granite-SWA's eager attention after the scores ``s``; ``logits`` the shape of
    ``b`` (a graph input, so that it stays computed), ``swap`` the Mul's operand order,
    ``casts`` TorchScript's float-to-float Casts, ``shared_softmax`` the weights as a
    second output too."""
    axes = "<axes = [-1], keepdims = 0>" if opset < 18 else "<keepdims = 0>"
    lse_in = "(s)" if opset < 18 else "(s, last)"
    unsq = "<axes = [-1]> (gate)" if opset < 13 else "(gate, last)"
    product = "y = Mul (gate_u, context)" if swap else "y = Mul (context, gate_u)"
    extra = ", float[batch, 4, seq, seq] weights" if shared_softmax else ""
    gate_in, probs_in = ("shifted_c", "probs_c") if casts else ("shifted", "probs")
    body = [
        f"lse = ReduceLogSumExp {axes} {lse_in}",
        "shifted = Sub (lse, b)",
        f"gate = Sigmoid ({gate_in})",
        f"gate_u = Unsqueeze {unsq}",
        "probs = Softmax <axis = -1> (s)",
        f"context = MatMul ({probs_in}, v)",
        product,
    ]
    if casts:  # float to float, as TorchScript writes ``.to(torch.float32)``
        body[2:2] = ["shifted_c = Cast <to = 1> (shifted)"]
        body[6:6] = ["probs_c = Cast <to = 1> (probs)"]
    if shared_softmax:
        body.append("weights = Identity (probs)")
    dims = ", ".join(map(str, logits))
    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
    g (float[batch, 4, seq, seq] s, float[batch, 4, seq, {HEAD_DIM}] v, float[{dims}] b)
      => (float[batch, 4, seq, {HEAD_DIM}] y{extra}) {{
        {chr(10).join(body)}
    }}"""
    inits = {"last": np.array([-1], np.int64)} if opset >= 13 else {}
    return build_model(text, inits)


def _feeds(logits: tuple[int, ...], batch: int, seq: int, spread: float, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    scores = (rng.standard_normal((batch, HEADS, seq, seq)) * spread).astype(np.float32)
    scores[0, :, 0, : max(1, seq // 2)] = np.finfo(np.float32).min  # masked keys
    return {
        "s": scores,
        "v": rng.standard_normal((batch, HEADS, seq, HEAD_DIM)).astype(np.float32),
        "b": (rng.standard_normal(logits) * 2).astype(np.float32),
    }


@SPELLINGS
@given(
    logits=st.sampled_from([(1, HEADS, 1), (HEADS, 1), (1,), (1, 1, 1)]),
    swap=st.booleans(),
    casts=st.booleans(),
    opset=st.sampled_from([11, 17, 18]),
    spread=st.sampled_from([1.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_a_context_scaled_by_the_sinks_share_becomes_a_sink_column(
    logits, swap, casts, opset, spread, seed
) -> None:
    model = scaled_context(logits=logits, swap=swap, casts=casts, opset=opset)
    canonical, done, again, work = canonical_twice(model)
    assert done.get("sink_scale") == 1 and again == 0, done
    ops = op_sequence(canonical)
    assert "ReduceLogSumExp" not in ops and "Sigmoid" not in ops, ops
    assert ops.count("Softmax") == 1 and "Slice" in ops and "Expand" in ops, ops
    for batch, seq in ((1, 1), (2, 5), (1, 9)):
        run_both(model, canonical, feeds=_feeds(logits, batch, seq, spread, seed), **CLOSE)
    # no fusion took it: the scale comes back, with the same values
    assert undo_unused(work.graph)["sink_scale"] == 1
    undone = ir.to_proto(work)
    onnx.checker.check_model(undone, full_check=True)
    ops = op_sequence(undone)
    assert "ReduceLogSumExp" in ops and "Concat" not in ops, ops
    run_both(model, undone, feeds=_feeds(logits, 2, 5, spread, seed), **CLOSE)


def test_logits_per_position_or_weights_read_elsewhere_stay() -> None:
    """A ``b`` that varies along the queries is no sink; weights the graph also returns
    would change for their other reader."""
    for model in (
        scaled_context(logits=(1, HEADS, 5)),
        scaled_context(logits=(2, HEADS, 1)),
        scaled_context(shared_softmax=True),
    ):
        canonical, done, _again, _work = canonical_twice(model)
        assert "sink_scale" not in done, done
        assert "ReduceLogSumExp" in op_sequence(canonical)
