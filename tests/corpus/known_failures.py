"""Corpus cases that fail today, each with the one-line reason: the lead deletes an entry
when its fix lands (the xfail is strict, so a fixed case fails until its entry goes).

Keys are (model name, target); target "*" stands for both. Node-test keys use the
test's id without the target (``node/test_scan_sum``).
"""

from __future__ import annotations

import pytest

MODEL_FAILURES: dict[tuple[str, str], str] = {}

NODE_FAILURES: dict[tuple[str, str], str] = {}


def _lookup(table: dict[tuple[str, str], str], name: str, target: str) -> str | None:
    return table.get((name, target)) or table.get((name, "*"))


def marks(name: str, target: str) -> list:
    reason = _lookup(MODEL_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def node_marks(name: str, target: str) -> list:
    reason = _lookup(NODE_FAILURES, name, target)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
