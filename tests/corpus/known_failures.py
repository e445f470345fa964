"""Corpus cases that fail today, each with the one-line reason: the lead deletes an entry
when its fix lands (the xfail is strict, so a fixed case fails until its entry goes).

Keys are (model name, target); target "*" stands for both. ``MODEL_FAILURES`` marks
``test_model`` (exit, check, expected fusions), ``DECODE_FAILURES`` an LLM's
``test_decode`` (an expected fusion missing is not a wrong decode). Node-test keys use
the test's id (``node/test_scan_sum``) and a target or "*".
"""

from __future__ import annotations

import pytest

# optimum's Falcon: a float mask built by Trilu and ScatterND, with -inf where masked,
# which the causal proof does not read
_FALCON_KV = "attention: Falcon's Trilu/ScatterND -inf mask is not proven causal (issue 24)"

MODEL_FAILURES: dict[tuple[str, str], str] = {
    # issue 24's decoder families (bench/corpus/_llm_families.py NEW_FAMILIES): what the
    # architecture has (_llm_expect.py) and autofusion does not fuse yet
    ("llm_falcon_optimum_kv", "onnxruntime"): _FALCON_KV,
}

# an LLM whose optimized model is not written cannot decode either
DECODE_FAILURES: dict[tuple[str, str], str] = {}

NODE_FAILURES: dict[tuple[str, str], str] = {}


def _lookup(table: dict[tuple[str, str], str], name: str, target: str) -> str | None:
    return table.get((name, target)) or table.get((name, "*"))


def marks(name: str, target: str) -> list:
    reason = _lookup(MODEL_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def decode_marks(name: str, target: str) -> list:
    reason = _lookup(DECODE_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def node_marks(name: str, target: str) -> list:
    reason = _lookup(NODE_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
