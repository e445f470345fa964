"""A readable summary of a report, for terminals and CI logs."""

from __future__ import annotations

from typing import Any

from autofusion.fusion_core.report._decisions import decision_source, store_counts
from autofusion.fusion_core.report._folding import left_alone_records
from autofusion.fusion_core.report._footprint import memory_line, size_line
from autofusion.fusion_core.report._growth import growth
from autofusion.fusion_core.report._own_memory import optimize_memory_line
from autofusion.fusion_core.report._reader import BODIES, read_report
from autofusion.fusion_core.report._verdict import PAIRED_WHY, speed_verdict

__all__ = ["fallback_line", "format_summary"]

_MAX_NEAR_MISSES = 10


def format_summary(report: dict[str, Any]) -> str:
    lines = [f"autofusion: {report.get('model') or 'model'} -> target {report['target']}"]
    said = ("upgrade_opset:", "written form:")  # what changes the file beyond the fusions
    lines += [f"  {p}" for p in report.get("prepasses", []) if p.startswith(said)]
    lines += _fusions(report)
    lines += _measurement(report.get("measurement"))
    lines += _ops(report["nodes"])
    lines += _check(report.get("check"))
    lines += _validation_extras(report)
    lines += _near_misses(report["near_misses"])
    lines += [
        f"left alone: {r['what']} ({r['nodes']} nodes): {r['reason']}"
        for r in left_alone_records(report)
    ]
    timings = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in report["timings_s"].items())
    lines.append(f"time per phase: {timings}")
    own = optimize_memory_line(report)
    if own:
        lines.append(f"optimize memory: {own}")
    if report.get("output"):
        lines.append(f"wrote {report['output']}")
    return "\n".join(lines)


def _fusions(report: dict[str, Any]) -> list[str]:
    fusions = report["fusions"]
    if not fusions:
        return ["fusions applied: none"]
    total = sum(fusions.values())
    lines = [f"fusions applied: {total} in {report['rounds']} round(s)"]
    width = max(len(name) for name in fusions)
    for name, count in sorted(fusions.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {name:<{width}}  {count:>5}")
    return lines


def _ops(nodes: dict[str, Any]) -> list[str]:
    """The main graph's op counts; the If/Loop/Scan bodies' after them, apart."""
    lines = _op_table("nodes", nodes)
    if nodes.get("subgraphs"):
        lines += _op_table(f"nodes in {BODIES}", nodes["subgraphs"])
    return lines


def _op_table(title: str, nodes: dict[str, Any]) -> list[str]:
    before, after = nodes["by_op_before"], nodes["by_op_after"]
    ops = sorted(set(before) | set(after), key=lambda op: (-before.get(op, 0), op))
    width = max([len(op) for op in ops] + [7])
    lines = [
        f"{title}: {nodes['before']} -> {nodes['after']}",
        f"  {'op type':<{width}}  before  after",
    ]
    for op in ops:
        b, a = before.get(op, 0), after.get(op, 0)
        lines.append(f"  {op:<{width}}  {b:>6}  {a:>5}")
    return lines


def _check(check: dict[str, Any] | None) -> list[str]:
    if check is None:
        return ["check: skipped (--no-check)"]
    if check.get("error"):
        return [f"check: FAILED: {check['error']}"]
    verdict = "passed" if check["passed"] else "FAILED"
    lines = [
        f"check: {verdict} on {check['samples']} sample(s), max abs diff "
        f"{check['max_abs_diff']:.3g} (onnxruntime, graph optimizations disabled)"
    ]
    for output in check["outputs"]:
        if not output["passed"]:
            lines.append(f"  output {output['name']!r}: {output['detail']}")
    for left in check.get("skipped") or []:  # sizes the original cannot run at
        lines.append(f"  not checked at {left}")
    return lines


def _near_misses(misses: list[dict[str, Any]]) -> list[str]:
    if not misses:
        return []
    lines = [f"near misses (did not fuse): {len(misses)}"]
    for miss in misses[:_MAX_NEAR_MISSES]:
        kind = miss.get("kind", "constraint")
        where = ", ".join(miss["nodes"])
        lines.append(f"  {miss['pattern']} at {where} [{kind}]: {miss['reason']}")
    if len(misses) > _MAX_NEAR_MISSES:
        lines.append(f"  ... {len(misses) - _MAX_NEAR_MISSES} more in the JSON report")
    return lines


def _validation_extras(report: dict[str, Any]) -> list[str]:
    """The drifting region, rollbacks, structural problems, fp16 flags, profile ratios."""
    lines = []
    drift = (report.get("regions") or {}).get("first_drift")
    if drift:
        lines.append(
            f"first fused region that drifts: {drift['pattern']} (replaced "
            f"{', '.join(drift['replaced_nodes'][:5])}), max abs diff {drift['max_abs_diff']}"
        )
    fallback = report.get("fallback")
    if fallback:
        lines.append(fallback_line(fallback))
    for rollback in report.get("rollbacks") or (fallback or {}).get("dropped") or []:
        lines.append(
            f"rolled back: {rollback['pattern']} at {', '.join(rollback['nodes'][:5])}: "
            f"{rollback['error']}"
        )
    for step in report.get("rejected") or []:
        lines.append(
            f"rejected as a bug: {step['step']} {step['name']!r}: {step['failed']} "
            "(please report it)"
        )
    lines += [f"structure: {problem}" for problem in report.get("structure") or []]
    precision = report.get("precision")
    if precision:
        for flag in precision["flags"]:
            lines.append(
                f"fp16 {flag['problem']}: {flag['pattern']} tensor {flag['tensor']!r} "
                f"(max |x| {flag['max_abs']:.3g})"
            )
        lines.append(f"keep in fp32 for float16: {len(precision['fp32_nodes'])} fused node(s)")
    lines += _speed(report)
    lines += _footprint(report)
    return lines


def fallback_line(fallback: dict[str, Any]) -> str:
    """One line on a fallback: what failed, and what the model written holds instead."""
    if fallback.get("unchanged"):
        kept = "no set of fusions passed: the model is written as it came"
    else:
        dropped = len(fallback.get("dropped") or [])
        kept = f"kept {fallback.get('kept')} fusion(s), dropped {dropped}"
    return f"warning: {fallback.get('reason')}; fell back: {kept}"


def _footprint(report: dict[str, Any]) -> list[str]:
    """Size on disk, and peak memory when profiled, before -> after."""
    size, memory = size_line(report), memory_line(report)
    lines = ([f"size: {size}"] if size else []) + ([f"peak memory: {memory}"] if memory else [])
    return lines + [
        f"warning: {g.note}: {g.before} -> {g.after} ({g.change})"
        for g in growth(report)
        if g.flagged
    ]


def _speed(report: dict[str, Any]) -> list[str]:
    """The verdict at the deployment level in plain words, then the other levels."""
    speed = read_report(report).speed
    if speed is None:
        return []
    lines = [f"speed: {speed.describe()}"]
    verdict = speed_verdict(report)
    if verdict is not None and verdict.medians:
        why = f"; {verdict.medians_differ} ({PAIRED_WHY})" if verdict.medians_differ else ""
        lines.append(f"  each model's median run: {verdict.medians}{why}")
    if speed.verdict == "no measurable change":
        lines.append("  the fused model is not measurably faster than the original on this machine")
    elif speed.verdict == "slower":
        lines.append(
            "  the fused model is SLOWER than the original on this machine: "
            "--selection measured keeps only the fusions that measure faster"
        )
    for level in (report.get("profile") or {}).get("latency") or []:
        paired = level.get("paired")
        if level.get("level") == speed.level or not paired:
            continue
        lines.append(
            f"  at {level['level']}: fused/original {paired['median']:.3f} "
            f"(interval {paired['low']:.3f}-{paired['high']:.3f}): {paired['verdict']}"
        )
    return lines


def _measurement(record: dict[str, Any] | None) -> list[str]:
    """Measured selection: each group, kept or not, with its paired ratio."""
    if not record:
        return []
    groups = record.get("groups") or []
    kept = sum(1 for g in groups if g.get("kept"))
    lines = [
        f"measured selection: kept {kept} of {len(groups)} group(s) in {record['seconds']:.1f} s "
        f"({record['level']}, {record['threads']} thread(s); {store_counts(record)})"
    ]
    for group in groups:
        ratio = group.get("ratio")
        shown = f"with/without {ratio['median']:.3f}, " if ratio else ""
        mark = "kept" if group["kept"] else "left out"
        where = decision_source(group) or "not measured"
        lines.append(f"  {mark:<8}  {group['group']} x{group['fusions']}: {shown}{where}")
    if record.get("fallback"):
        lines.append(f"  {record['fallback']}")
    if record.get("error"):
        lines.append(f"  {record['error']}")
    return lines
