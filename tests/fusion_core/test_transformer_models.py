"""The tiny transformer exports (tests/data/transformers): what fuses today.

GELU, the Q/K/V projections and the residual LayerNorms (all on the dynamo exports, all
but the embedding one on TorchScript, where whole-graph shape inference gives them
symbolic batch and sequence dims) fuse; whole attention blocks fuse only on the eager
BERT-family dynamo exports and ViT's eager TorchScript export so far. Every fused model
still matches its original.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fusion_core import CheckOptions, OptimizeConfig, optimize

FOLDER = Path(__file__).resolve().parents[1] / "data" / "transformers"
FILES = sorted(p.stem for p in FOLDER.glob("*.onnx"))
LAYERS = 2


def _family(name: str) -> str:
    return name.split("_", 1)[0]


def _count(counts: dict[str, int], prefix: str) -> int:
    return sum(n for pattern, n in counts.items() if pattern.startswith(prefix))


@pytest.mark.parametrize("name", FILES)
def test_onnxruntime_target(name: str) -> None:
    config = OptimizeConfig(target="onnxruntime", check=CheckOptions(rtol=0.0, atol=1e-4))
    result = optimize(FOLDER / f"{name}.onnx", config)

    assert result.check is not None and result.check.passed, result.check
    assert _count(result.counts, "gelu_") == LAYERS  # one GELU per layer
    assert result.ops_after.get("Erf", 0) == result.ops_after.get("Tanh", 0) == 0
    # GPT-2's Conv1D already computes Q, K and V in one Gemm.
    expected_merges = 0 if _family(name) == "gpt2" else LAYERS
    assert result.counts.get("qkv_bias_merge", 0) == expected_merges
    # MultiHeadAttention: the BERT family's dynamo exports, eager and SDPA (one per layer).
    bert_family = _family(name) != "gpt2"
    fuses_eager = name.endswith("_eager_dynamo") and bert_family
    fuses_sdpa = name.endswith("_sdpa_dynamo") and bert_family
    assert result.counts.get("attention_mha", 0) == (LAYERS if fuses_eager else 0)
    assert result.counts.get("attention_mha_sdpa", 0) == (LAYERS if fuses_sdpa else 0)
    if name.endswith("_dynamo"):
        # Every LayerNormalization takes its residual Add (2 per layer + the last one).
        assert result.ops_after["com.microsoft::SkipLayerNormalization"] == 2 * LAYERS + 1
        assert result.ops_after.get("LayerNormalization", 0) == 0
    elif _family(name) == "gpt2":
        # TorchScript GPT-2 (pre-LN): whole-graph shape inference proves 2 residual Adds
        # full-size; the other 3 LayerNorms stay (their Adds are refused with near misses).
        assert result.ops_after["com.microsoft::SkipLayerNormalization"] == 2
    else:
        # TorchScript: every residual LayerNorm in the layers fuses; the embedding one
        # does not, as onnx's inference gives the position embeddings fresh dims
        # ("unk__0") in place of the batch and sequence it cannot prove.
        assert result.ops_after["com.microsoft::SkipLayerNormalization"] == 2 * LAYERS
        assert result.ops_after.get("LayerNormalization", 0) == 1
    if name == "vit_eager_torchscript":
        # With symbolic shapes, ViT's unmasked eager attention fuses on TorchScript too.
        assert result.counts.get("attention_mha_no_mask", 0) == LAYERS


@pytest.mark.parametrize("name", [n for n in FILES if n.endswith("_eager_dynamo")])
def test_generic_target_explains_gelu_needs_opset_20(name: str) -> None:
    result = optimize(FOLDER / f"{name}.onnx", OptimizeConfig(target="generic"))
    assert result.check is not None and result.check.passed
    assert _count(result.counts, "gelu_") == 0
    reasons = [m.reason for m in result.near_misses if m.pattern.startswith("gelu_")]
    assert reasons and all("needs opset 20" in r for r in reasons), reasons
