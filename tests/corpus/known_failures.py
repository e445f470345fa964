"""Corpus cases that fail today, each with the one-line reason: the lead deletes an entry
when its fix lands (the xfail is strict, so a fixed case fails until its entry goes).

Keys are (model name, target); target "*" stands for both. Node-test keys use the
test's id (``node/test_scan_sum``) and a target or "*".
"""

from __future__ import annotations

import pytest

_ATTENTION_ORT = "attention: 0 of the expected blocks fused on the onnxruntime target"

MODEL_FAILURES: dict[tuple[str, str], str] = {
    # the torch exports (bench/corpus/export_torch.py, _torch_expect.py)
    ("deberta_v2_eager_dynamo", "onnxruntime"): _ATTENTION_ORT,
    ("deberta_v2_eager_torchscript", "onnxruntime"): _ATTENTION_ORT,
    ("modernbert_eager_dynamo", "onnxruntime"): _ATTENTION_ORT,
    ("modernbert_eager_torchscript", "onnxruntime"): _ATTENTION_ORT,
    ("modernbert_sdpa_dynamo", "onnxruntime"): _ATTENTION_ORT,
    ("modernbert_sdpa_torchscript", "onnxruntime"): _ATTENTION_ORT,
    ("swin_sdpa_torchscript", "onnxruntime"): _ATTENTION_ORT,
    ("t5_encoder_eager_dynamo", "onnxruntime"): _ATTENTION_ORT,
    ("t5_encoder_eager_torchscript", "onnxruntime"): _ATTENTION_ORT,
    ("t5_encoder_sdpa_torchscript", "onnxruntime"): _ATTENTION_ORT,
    ("whisper_encoder_sdpa_dynamo", "onnxruntime"): _ATTENTION_ORT,
}

NODE_FAILURES: dict[tuple[str, str], str] = {}


def _lookup(table: dict[tuple[str, str], str], name: str, target: str) -> str | None:
    return table.get((name, target)) or table.get((name, "*"))


def marks(name: str, target: str) -> list:
    reason = _lookup(MODEL_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def node_marks(name: str, target: str) -> list:
    reason = _lookup(NODE_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
