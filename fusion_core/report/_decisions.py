"""Where each of measured selection's decisions came from, in the words every rendering
uses (report.md, report.html, the terminal summary).

A group is decided from the verdict store (a confident combined verdict of earlier
measurements on this machine class: the report names how many and the service's jobs
that made them), measured in this run, or not measured (the budget did not reach it).
Reports from before the verdict store say ``cached`` instead; they read as "cached".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["decision_source", "store_counts"]

_JOBS_SHOWN = 5


def decision_source(group: Mapping[str, Any]) -> str:
    """``from the verdict store (3 measurements, jobs a1b2c3d4, c3d4e5f6)``, ``measured``,
    ``not measured``."""
    source = group.get("source")
    if source is None:  # an older report
        return "cached" if group.get("cached") else ("measured" if group.get("ratio") else "")
    if source != "store":
        return str(source)
    combined = group.get("combined")
    if not isinstance(combined, Mapping):
        return "from the verdict store"
    count = combined.get("measurements")
    words = f"{count} measurement{'' if count == 1 else 's'}"
    jobs = [str(j)[:8] for j in combined.get("jobs") or []]
    if jobs:
        more = f" and {len(jobs) - _JOBS_SHOWN} more" if len(jobs) > _JOBS_SHOWN else ""
        words += f", job{'s' if len(jobs) > 1 else ''} {', '.join(jobs[:_JOBS_SHOWN])}{more}"
    return f"from the verdict store ({words})"


def store_counts(record: Mapping[str, Any]) -> str:
    """``3 from the verdict store, 5 measured (12 verdicts read, 1 skipped)``; older
    reports: ``cache: 2 hit(s)``."""
    store = record.get("store")
    if not isinstance(store, Mapping):
        hits = (record.get("cache") or {}).get("hits", 0)
        return f"cache: {hits} hit(s)"
    text = f"{store.get('matched', 0)} from the verdict store, {store.get('measured', 0)} measured"
    read = [f"{store.get('read', 0)} verdict(s) read"]
    if store.get("skipped"):
        read.append(f"{store['skipped']} invalid skipped")
    if store.get("unreadable"):
        read.append(f"{store['unreadable']} file(s) unreadable")
    if store.get("written"):
        read.append(f"{store['written']} written")
    return f"{text} ({', '.join(read)})"
