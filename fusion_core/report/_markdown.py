"""A Markdown summary of a report, for CI logs and pull-request comments."""

from __future__ import annotations

import re
from typing import Any

from autofusion.fusion_core.report._decisions import decision_source, store_counts
from autofusion.fusion_core.report._folding import left_alone_records
from autofusion.fusion_core.report._footprint import memory_line, size_line
from autofusion.fusion_core.report._growth import growth
from autofusion.fusion_core.report._own_memory import optimize_memory_line
from autofusion.fusion_core.report._reader import BODIES, read_report
from autofusion.fusion_core.report._units import saved_text
from autofusion.fusion_core.report._verdict import PAIRED_WHY, speed_verdict

__all__ = ["format_markdown"]

_MAX_NEAR_MISSES = 10


def format_markdown(report: dict[str, Any]) -> str:
    """Fusions per pattern, node counts, the check verdict, top near misses, profile."""
    nodes = report.get("nodes") or {}
    lines = [
        f"## autofusion: {_md(report.get('model') or 'model')} -> {_md(report.get('target'))}",
        "",
        f"**Nodes:** {nodes.get('before')} -> {nodes.get('after')}{_bodies(nodes)}  ",
        f"**Check:** {_verdict(report.get('check'))}  ",
        f"**Speed:** {_speed(report)}  ",
        *_medians(report),
        f"**Size:** {_size(report)}  ",
        f"**Peak memory:** {_memory(report)}  ",
        *_own_memory(report),
        *_grew(report),
        "",
    ]
    lines += _fusions(report)
    lines += _measurement(report.get("measurement"))
    lines += _ratios(report.get("profile"))
    lines += _fallback(report.get("fallback"))
    lines += _rollbacks(report.get("rollbacks"))
    lines += _rejected(report.get("rejected") or [])
    lines += _near_misses(report.get("near_misses") or [])
    lines += _left_alone(left_alone_records(report))
    return "\n".join(lines).rstrip() + "\n"


# Markdown that a model's file name, node names or an error text could inject: links and
# images ([..](..), ![..](..)), code spans, emphasis, strikethrough, table cells (|) and
# raw HTML (<img onerror=...>, rendered by GitHub and most viewers). A backslash makes
# each character literal; '<' and '&' become entities. An underscore inside a word is
# left as it is (GFM never emphasizes there), so pattern names stay readable in raw logs.
_MD_SPECIAL = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def _md(value: Any) -> str:
    """Text that renders as itself, on one line, inside a table cell or a heading."""
    text = _CONTROL.sub(" ", str(value))
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def _bodies(nodes: dict[str, Any]) -> str:
    """The If/Loop/Scan bodies' node counts, apart from the main graph's headline."""
    bodies = nodes.get("subgraphs")
    if not isinstance(bodies, dict):
        return ""
    return f" (and {bodies.get('before')} -> {bodies.get('after')} in {BODIES})"


def _verdict(check: dict[str, Any] | None) -> str:
    if check is None:
        return "skipped"
    if check.get("error"):
        return f"**FAILED**: {_md(check['error'])}"
    verdict = "passed" if check.get("passed") else "**FAILED**"
    diff = check.get("max_abs_diff")
    detail = f", max abs diff {diff:.3g}" if isinstance(diff, (int, float)) else ""
    left = check.get("skipped") or []  # sizes the original cannot run at
    detail += f"; not checked at {_md('; '.join(map(str, left)))}" if left else ""
    return f"{verdict} on {check.get('samples')} sample(s){detail}"


def _speed(report: dict[str, Any]) -> str:
    speed = read_report(report).speed
    if speed is None:
        return "not measured"
    if speed.verdict == "faster":
        return f"**{speed.describe()}**"
    if speed.verdict == "slower":
        return f"**SLOWER**: {_md(speed.describe())}"
    return _md(speed.describe())


def _medians(report: dict[str, Any]) -> list[str]:
    """Each model's median run: detail under the verdict, and why it may disagree."""
    verdict = speed_verdict(report)
    if verdict is None or verdict.medians is None:
        return []
    why = f"; {verdict.medians_differ} ({PAIRED_WHY})" if verdict.medians_differ else ""
    return [f"**Each model's median run:** {_md(verdict.medians + why)}  "]


def _grew(report: dict[str, Any]) -> list[str]:
    """Growth the speed did not pay for, each on a line of its own."""
    return [
        f"**Grew:** {_md(f'{g.what} {g.before} -> {g.after} ({g.change}): {g.note}')}  "
        for g in growth(report)
        if g.flagged
    ]


def _size(report: dict[str, Any]) -> str:
    return _md(size_line(report) or "not measured")


def _memory(report: dict[str, Any]) -> str:
    return _md(memory_line(report) or "not measured (not profiled)")


def _own_memory(report: dict[str, Any]) -> list[str]:
    """The optimizing process's own peak, when the report has it."""
    own = optimize_memory_line(report)
    return [f"**Optimize memory:** {_md(own)}  "] if own else []


def _fusions(report: dict[str, Any]) -> list[str]:
    fusions = report.get("fusions") or {}
    total = sum(fusions.values())
    lines = [f"### Fusions: {total} in {report.get('rounds')} round(s)", ""]
    if not fusions:
        return lines + ["none", ""]
    predicted: dict[str, float] = {}  # the cost model's time saved per run (µs), per pattern
    for fusion in report.get("applied") or []:
        saved = (fusion.get("predicted_gain") or {}).get("saved_us")
        if isinstance(saved, (int, float)):
            predicted[fusion["pattern"]] = predicted.get(fusion["pattern"], 0.0) + saved
    lines += ["| pattern | count | predicted time per run |", "|---|---:|---:|"]
    for name, count in sorted(fusions.items(), key=lambda kv: (-kv[1], kv[0])):
        saved = saved_text(predicted[name]) if name in predicted else "n/a"
        lines.append(f"| {_md(name)} | {count} | {saved} |")
    return lines + [""]


def _ratios(profile: dict[str, Any] | None) -> list[str]:
    """fused / original median latency per onnxruntime level, and per pattern."""
    if not isinstance(profile, dict):
        return []
    rows = [
        (c.get("level"), (c.get("paired") or {}).get("median", c.get("ratio")))
        for c in profile.get("latency") or []
    ]
    rows += [(f"pattern {p.get('pattern')}", p.get("ratio")) for p in profile.get("patterns") or []]
    if not rows:
        return []
    lines = ["### Profile: fused / original time", "", "| measure | ratio |", "|---|---:|"]
    for name, value in rows:
        shown = f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"
        lines.append(f"| {_md(name)} | {shown} |")
    return lines + [""]


def _measurement(record: dict[str, Any] | None) -> list[str]:
    if not isinstance(record, dict):
        return []
    lines = [
        f"### Measured selection: {record.get('level')}, {record.get('threads')} thread(s), "
        f"{record.get('seconds')} s",
        "",
        f"Decisions: {_md(store_counts(record))}.",
        "",
        "| group | fusions | with / without | kept | decided |",
        "|---|---:|---:|---|---|",
    ]
    for g in record.get("groups") or []:
        ratio = g.get("ratio")
        shown = "n/a"
        if ratio:
            shown = f"{ratio['median']:.3f} ({ratio['low']:.3f}-{ratio['high']:.3f})"
        kept = "yes" if g.get("kept") else "no"
        source = _md(decision_source(g) or "not measured")
        lines.append(
            f"| {_md(g.get('group'))} | {g.get('fusions')} | {shown} | {kept} | {source} |"
        )
    if record.get("fallback"):
        lines += ["", _md(record["fallback"])]
    return lines + [""]


def _rollbacks(rollbacks: list[dict[str, Any]] | None, title: str = "Rolled back") -> list[str]:
    if not rollbacks:
        return []
    lines = [
        f"### {title}: {len(rollbacks)}",
        "",
        "| pattern | nodes | error |",
        "|---|---|---|",
    ]
    for r in rollbacks:
        nodes = ", ".join(r.get("nodes") or [])
        lines.append(f"| {_md(r.get('pattern'))} | {_md(nodes)} | {_md(r.get('error'))} |")
    return lines + [""]


def _fallback(fallback: dict[str, Any] | None) -> list[str]:
    if not fallback:
        return []
    if fallback.get("unchanged"):
        kept = "no set of fusions passed, so the model is written as it came"
    else:
        kept = f"{fallback.get('kept')} of the fusions passed and are kept"
    lines = [
        "### Fell back after a failed check",
        "",
        f"{_md(fallback.get('reason'))}: {kept}.",
        "",
    ]
    dropped = fallback.get("dropped") or []
    if dropped:
        lines += _rollbacks(dropped, title="Dropped")
    return lines


def _rejected(records: list[dict[str, Any]]) -> list[str]:
    if not records:
        return []
    lines = [
        f"### Taken back as bugs of autofusion: {len(records)}",
        "",
        "The run went on without these steps; please report them with the model.",
        "",
        "| step | name | what failed |",
        "|---|---|---|",
    ]
    for r in records:
        lines.append(f"| {_md(r.get('step'))} | {_md(r.get('name'))} | {_md(r.get('failed'))} |")
    return lines + [""]


def _left_alone(records: list[dict[str, Any]]) -> list[str]:
    if not records:
        return []
    lines = ["### Left as it is", "", "| part | nodes | why |", "|---|---|---|"]
    for r in records:
        lines.append(f"| {_md(r.get('what'))} | {r.get('nodes')} | {_md(r.get('reason'))} |")
    return lines + [""]


def _near_misses(misses: list[dict[str, Any]]) -> list[str]:
    if not misses:
        return []
    lines = [f"### Near misses: {len(misses)}", "", "| pattern | nodes | reason |", "|---|---|---|"]
    for m in misses[:_MAX_NEAR_MISSES]:
        nodes = ", ".join(m.get("nodes") or [])
        lines.append(f"| {_md(m.get('pattern'))} | {_md(nodes)} | {_md(m.get('reason'))} |")
    if len(misses) > _MAX_NEAR_MISSES:
        lines.append(f"\n{len(misses) - _MAX_NEAR_MISSES} more in the JSON report.")
    return lines + [""]
