"""The one way the renderings word the report's ``folding``: what constant folding left
unfolded, and why (fusion_core/prepasses/_fold_budget.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofusion.fusion_core.report._units import bytes_text

__all__ = ["FOLDING_PART", "left_alone_records", "unfolded_text"]

FOLDING_PART = "constant folding"  # the part's name in the "left as it is" lists
_NAMED = 3  # values named in the line; the JSON report lists more


def unfolded_text(folding: Any) -> str | None:
    """One line on the values folding left unfolded; None when it left none."""
    if not isinstance(folding, Mapping) or not folding.get("unfolded_count"):
        return None
    reasons = folding.get("reasons") or {}
    why = []
    if reasons.get("fold_budget"):
        budget = bytes_text(int(folding.get("budget_bytes") or 0))
        why.append(
            f"{reasons['fold_budget']} past the fold budget of {budget} "
            "(fold_growth_ratio, fold_growth_floor_bytes)"
        )
    if reasons.get("tensor_limit"):
        why.append(f"{reasons['tensor_limit']} over fold_output_size_limit")
    named = ", ".join(
        f"{u.get('op_type')} {u.get('name')!r}" for u in (folding.get("unfolded") or [])[:_NAMED]
    )
    never = bytes_text(int(folding.get("unfolded_bytes") or 0))
    return (
        f"{folding['unfolded_count']} value(s) left as the nodes that make them, "
        f"{never} never computed: {'; '.join(why)}; first {named}"
    )


def left_alone_records(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report's ``left_alone``, with what folding left unfolded as one more part:
    what the renderings list under "left as it is"."""
    records = list(report.get("left_alone") or [])
    folding = report.get("folding")
    text = unfolded_text(folding)
    if text is not None:
        records.append({"what": FOLDING_PART, "nodes": folding["unfolded_count"], "reason": text})
    return records
