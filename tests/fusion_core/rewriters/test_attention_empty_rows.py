"""ONNX Attention (the generic target, opset 23) where a query attends to nothing.

onnxruntime 1.32's ONNX Attention gives 0 for a query whose mask row is the lowest float
everywhere; the graph's softmax of those equal scores is uniform, the mean of the values
(as com.microsoft.MultiHeadAttention gives). A left-padded row of a causal decoder is
such a row at its first position, so GPT-2 on the generic target differed from the
original by up to 2.4 in the padded positions' logits (the real positions exact), and
the check (its masks random bits, its seeds' first keys unmasked) passed it. The
rewriter now picks the values' mean for those rows.

Tolerance: rtol = atol = 1e-5 (the fused attention sums in another order: 1e-6 measured).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from test_group_query_attention import ORT, SHAPES, decoder_attention, feeds

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.testing import op_sequence, optimize_quiet, run_both

TRANSFORMERS = Path(__file__).resolve().parents[2] / "data" / "transformers"


def _left_padded(batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(0).integers(3, 100, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[1, :3] = 0  # the second row left-padded: its first query attends to nothing
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize(
    "name", ["gpt2_eager_dynamo", "gpt2_sdpa_torchscript", "bert_eager_dynamo"]
)
def test_generic_attention_keeps_rows_that_attend_to_nothing(name: str) -> None:
    model = onnx.load(TRANSFORMERS / f"{name}.onnx")
    result = optimize(model, OptimizeConfig(target="generic", upgrade_opset=23))
    assert result.check.passed
    fused = result.to_proto()
    assert op_sequence(fused).count("Attention") == 2, op_sequence(fused)
    run_both(model, fused, feeds=_left_padded(2, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_generic_grouped_attention_with_a_finite_mask_keeps_those_rows(cache: bool) -> None:
    """The same on the grouped path (a decoder's repeat_kv, with and without its cache):
    an eager decoder's finite mask, rows with nothing to attend to (left padding reaching
    into the new tokens, random holes) take each query head's mean value over its KV
    head's keys (the cache's too)."""
    model = decoder_attention(cache=cache, eager=True, lowest=float(np.finfo(np.float32).min))
    result = optimize_quiet(model, target="generic", upgrade_opset=23, exclude=ORT["exclude"])
    assert result.counts.get("attention") == 1, result.counts
    fused = result.to_proto()
    assert op_sequence(fused).count("Attention") == 1
    for batch, seq, past in SHAPES:
        for mask in ("left", "random"):
            sample = feeds(batch, seq, past, mask, cache=cache)
            run_both(model, fused, feeds=sample, rtol=1e-5, atol=1e-5)
