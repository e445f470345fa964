"""The tiny transformer exports (tests/data/transformers): 5 families x 2 exporters x 2
attention implementations, 2 layers each, fused for onnxruntime with no hints.

In every one, each layer's attention becomes one MultiHeadAttention (and then, except
in GPT-2, one Attention with the merged Q/K/V projection inside), each GELU one
contrib Gelu/FastGelu, every LayerNormalization takes its residual Add (2 per layer and
the final one: SkipLayerNormalization), the Q/K/V projections merge (GPT-2 computes
them in one Gemm already), and the outputs match the original within atol 1e-4
(fp32), also on a batch with a fully masked row and a left-padded row, where the SDPA
exports' NaN guard and GPT-2's causal mask meet.

The block tests price on ``cpu-roofline`` (the roofline alone): they test that every
rewriter applies. The default profile ``cpu`` prices SkipLayerNormalization and the Q/K/V
merge as losses, so that the defaults leave them out (tests/fusion_core/
test_cost_defaults.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize

FOLDER = Path(__file__).resolve().parents[1] / "data" / "transformers"
FILES = sorted(p.stem for p in FOLDER.glob("*.onnx"))
LAYERS = 2
ATOL = 1e-4


def _family(name: str) -> str:
    return name.split("_", 1)[0]


def _count(counts: dict[str, int], prefix: str) -> int:
    return sum(n for pattern, n in counts.items() if pattern.startswith(prefix))


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("name", FILES)
def test_onnxruntime_target(name: str) -> None:
    config = OptimizeConfig(
        target="onnxruntime",
        target_profile="cpu-roofline",
        check=CheckOptions(rtol=0.0, atol=ATOL),
    )
    result = optimize(FOLDER / f"{name}.onnx", config)

    assert result.check is not None and result.check.passed, result.check
    assert result.counts.get("attention", 0) == LAYERS, result.near_misses
    # then packed with its merged projection into one Attention (GPT-2's projection is
    # a Gemm and a Reshape before its Split, which the packing does not read through)
    attention = "MultiHeadAttention" if _family(name) == "gpt2" else "Attention"
    assert result.ops_after[f"com.microsoft::{attention}"] == LAYERS
    assert _count(result.ops_after, "com.microsoft::MultiHeadAttention") in (0, LAYERS)
    assert result.ops_after.get("Softmax", 0) == 0
    assert _count(result.counts, "gelu_") == LAYERS  # one GELU per layer
    assert result.ops_after.get("Erf", 0) == result.ops_after.get("Tanh", 0) == 0
    # GPT-2's Conv1D already computes Q, K and V in one Gemm.
    expected_merges = 0 if _family(name) == "gpt2" else LAYERS
    assert result.counts.get("qkv_bias_merge", 0) == expected_merges
    assert result.ops_after["com.microsoft::SkipLayerNormalization"] == 2 * LAYERS + 1
    assert result.ops_after.get("LayerNormalization", 0) == 0


@pytest.mark.parametrize("name", [n for n in FILES if not n.startswith("vit")])
def test_fully_masked_and_left_padded_rows(name: str) -> None:
    """Row 0 attends to nothing, row 1 is left-padded (GPT-2's first positions then see
    no token at all): where the -inf masks, the NaN guards and MultiHeadAttention differ
    unless the rewrite keeps the guard's meaning."""
    original = onnx.load(FOLDER / f"{name}.onnx")
    result = optimize(FOLDER / f"{name}.onnx", OptimizeConfig(target="onnxruntime"))
    assert result.counts.get("attention", 0) == LAYERS
    fused = ir.serde.serialize_model(result.model)
    rng = np.random.default_rng(0)
    batch, sequence = 3, 7
    mask = np.ones((batch, sequence), np.int64)
    mask[0, :] = 0
    mask[1, :3] = 0
    feeds = {"input_ids": rng.integers(0, 50, (batch, sequence)), "attention_mask": mask}
    expected = _session(original).run(None, feeds)
    actual = _session(fused).run(None, feeds)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, equal_nan=True)


def test_an_unfused_block_is_explained() -> None:
    """A block that does not fuse is named by its nodes, with the constraint that failed."""
    model = onnx.load(FOLDER / "bert_eager_dynamo.onnx")
    softmaxes = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(softmaxes) == LAYERS
    # Softmax over the heads axis: still a valid model, no longer attention.
    for attr in softmaxes[1].attribute:
        if attr.name == "axis":
            attr.i = 1
    result = optimize(model, OptimizeConfig(target="onnxruntime"))
    assert result.check is not None and result.check.passed
    assert result.counts.get("attention") == LAYERS - 1
    (miss,) = [m for m in result.near_misses if m.pattern == "attention"]
    assert softmaxes[1].name in miss.nodes
    assert "softmax" in miss.reason and "axis" in miss.reason, miss.reason


@pytest.mark.parametrize("name", FILES)
def test_generic_target_folds_the_scale_and_explains_the_attention(name: str) -> None:
    """Opset 17/18 has no attention op: each block is refused with the reason, and its
    scale (1 / sqrt(16), or 16^-1/4 on Q and on K^T for SDPA) is folded into the
    projections, which then merge. GPT-2's Q comes out of a Gemm and a Split, a path the
    fold patterns do not cover."""
    config = OptimizeConfig(
        target="generic", target_profile="cpu-roofline", check=CheckOptions(rtol=0.0, atol=ATOL)
    )
    result = optimize(FOLDER / f"{name}.onnx", config)
    assert result.check is not None and result.check.passed, result.check
    refusals = [m for m in result.near_misses if "ONNX Attention needs opset 23" in m.reason]
    # Every block is refused once by the attention pattern, which tried MultiHeadAttention
    # and GroupQueryAttention (ONNX Attention for both on this target).
    softmaxes = {
        n.name for n in onnx.load(FOLDER / f"{name}.onnx").graph.node if n.op_type == "Softmax"
    }
    assert len(softmaxes) == LAYERS
    for softmax in softmaxes:
        patterns = [m.pattern for m in refusals if softmax in m.nodes]
        assert any(p.startswith("attention") for p in patterns), (softmax, refusals)
        assert len(patterns) == len(set(patterns)), (softmax, patterns)
    assert all(m.pattern == "attention" for m in refusals), refusals
    # After the fold, the last round's probe also explains each Softmax (the scale it
    # looks for is gone); nothing else is reported for attention.
    others = [
        m for m in result.near_misses if m.pattern.startswith("attention") and m not in refusals
    ]
    # (an unmasked ViT's: the masked pattern gets furthest, and says the mask is absent)
    missing = ("'scale'", "'q_scale'", "'mask'") if _family(name) == "vit" else ("'scale'",)
    assert all(any(word in m.reason for word in missing) for m in others), others
    folds = _count(result.counts, "attention_scale_fold")
    if _family(name) == "gpt2":
        assert folds == 0
    else:
        # one per layer for SDPA too: the canonical form put its split scale on the scores
        assert folds == LAYERS
        assert result.counts["qkv_bias_merge"] == LAYERS


@pytest.mark.parametrize("name", [n for n in FILES if n.endswith("_eager_dynamo")])
def test_generic_target_explains_gelu_needs_opset_20(name: str) -> None:
    result = optimize(FOLDER / f"{name}.onnx", OptimizeConfig(target="generic"))
    assert result.check is not None and result.check.passed
    assert _count(result.counts, "gelu_") == 0
    reasons = [m.reason for m in result.near_misses if m.pattern.startswith("gelu_")]
    assert reasons and all("needs opset 20" in r for r in reasons), reasons


def test_an_attention_no_pattern_binds_is_explained() -> None:
    """Layer 1's scores go through a Sub of 0 between the scale and the mask: no
    attention pattern binds that far (no constraint ever runs), the other layer still
    fuses, and the near miss names the closest pattern and the step that found no node."""
    model = onnx.load(FOLDER / "bert_eager_dynamo.onnx")
    producers = {out: node for node in model.graph.node for out in node.output}
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"][1]
    mask_add = producers[softmax.input[0]]
    (k,) = [k for k, name in enumerate(mask_add.input) if producers[name].op_type == "Mul"]
    scaled = mask_add.input[k]
    zero = onnx.numpy_helper.from_array(np.array(0.0, np.float32), "broken_zero")
    model.graph.initializer.append(zero)
    sub = onnx.helper.make_node("Sub", [scaled, "broken_zero"], ["broken"], name="broken_sub")
    mask_add.input[k] = "broken"
    position = list(model.graph.node).index(mask_add)
    model.graph.node.insert(position, sub)
    result = optimize(model, OptimizeConfig(target="onnxruntime"))
    assert result.check is not None and result.check.passed
    assert result.counts.get("attention", 0) == LAYERS - 1
    (miss,) = [m for m in result.near_misses if m.pattern == "attention"]
    assert miss.pattern == "attention"
    assert miss.nodes == (mask_add.name, softmax.name)
    assert miss.reason == (
        f"expected Mul or Div 'scale' computing input 0 of mask (Add {mask_add.name!r}); "
        "found Sub 'broken_sub'"
    )
