"""meta.json's expected counts: alternatives summed, and ``?`` keys that also count a
place left out because the cost model predicts a loss there."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import _torch_expect
import meta

LOSS = "priority selection: the cost model predicts a loss on target profile 'cpu' (...)"


def _info(expected: dict[str, int]) -> meta.ModelMeta:
    return meta.ModelMeta(
        name="m", family="f", source={"pin": "p"}, exporter="e", opset=17, node_count=1,
        size_bytes=1, expected={"onnxruntime": expected},
    ).validate()  # fmt: skip


def test_a_plain_key_counts_only_fusions() -> None:
    info = _info({"skip_layer_norm|skip_layer_norm_bias": 3})
    misses = [{"pattern": "skip_layer_norm", "reason": LOSS}] * 3
    counts = info.expected_counts("onnxruntime", {"skip_layer_norm_bias": 1}, misses)
    assert counts == {"skip_layer_norm|skip_layer_norm_bias": (3, 1)}


def test_a_question_key_also_counts_predicted_losses_of_its_patterns() -> None:
    info = _info({"?qkv_merge|qkv_bias_merge": 4})
    misses = [
        {"pattern": "qkv_bias_merge", "reason": LOSS},
        {"pattern": "qkv_bias_merge", "reason": LOSS},
        {"pattern": "qkv_merge", "reason": "constraint failed: weights not constant"},
        {"pattern": "attention", "reason": LOSS},  # another pattern: not counted
    ]
    counts = info.expected_counts("onnxruntime", {"qkv_merge": 1}, misses)
    assert counts == {"?qkv_merge|qkv_bias_merge": (4, 3)}


def test_a_question_key_without_near_misses_counts_fusions() -> None:
    info = _info({"?kv_bias_merge": 1})
    assert info.expected_counts("onnxruntime", {"kv_bias_merge": 1}) == {"?kv_bias_merge": (1, 1)}
    assert info.expected_counts("onnxruntime", {}, None) == {"?kv_bias_merge": (1, 0)}


def _ops(expected_ops: dict[str, int]) -> meta.ModelMeta:
    return meta.ModelMeta(
        name="m", family="f", source={"pin": "p"}, exporter="e", opset=17, node_count=1,
        size_bytes=1, expected_ops={"onnxruntime": expected_ops},
    ).validate()  # fmt: skip


def test_expected_ops_plain_keys_are_exact_and_ignore_the_domain() -> None:
    info = _ops({"SkipSimplifiedLayerNormalization": 4, "A|B": 3})
    after = {"com.microsoft::SkipSimplifiedLayerNormalization": 4, "A": 1, "B": 2}
    assert info.op_problems("onnxruntime", after) == []
    assert info.op_problems("onnxruntime", {"A": 4}) == [
        "op SkipSimplifiedLayerNormalization: expected 4, got 0",
        "op A|B: expected 3, got 4",
    ]


def test_expected_ops_question_keys_allow_up_to_the_count() -> None:
    info = _ops({"?RotaryEmbedding": 4})
    assert info.op_problems("onnxruntime", {}) == []
    assert info.op_problems("onnxruntime", {"com.microsoft::RotaryEmbedding": 2}) == []
    assert info.op_problems("onnxruntime", {"com.microsoft::RotaryEmbedding": 5}) == [
        "op ?RotaryEmbedding: at most 4, got 5"
    ]
    assert info.op_problems("generic", {"X": 1}) == []


def test_a_key_written_with_patterns_a_release_merged_counts_the_merged_one() -> None:
    """A cache built before the ten attention patterns became one still checks: its
    key names the old patterns, the report the new one (and no other pattern counts)."""
    old = "attention_mha|attention_mha_no_mask|attention_mha_sdpa_kt"
    info = _info({old: 2, "rotary_embedding_partial": 4})
    fusions = {"attention": 2, "attention_packed_merged": 2, "rotary_embedding": 4}
    counts = info.expected_counts("onnxruntime", fusions)
    assert counts == {old: (2, 2), "rotary_embedding_partial": (4, 4)}
    # every old name is gone from the built-ins, every new one is there
    assert not set(meta.MERGED_INTO) & set(_torch_expect.builtin_names())
    assert set(meta.MERGED_INTO.values()) <= set(_torch_expect.builtin_names())
