"""Before a child runs and after it: what an attempt runs (the plan) and what the job
row says about the result (the summary).

The plan takes the registry snapshot (a retry reuses the version its first attempt
recorded), merges a named strategy under the job's own options, and checks the result
against the snapshot with fusion_core itself, so a config error fails the job without
starting a process.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.models import Job, Strategy
from autofusion.app.services.pattern_class_rules import excluded_for
from autofusion.app.services.strategies import StrategySpec
from autofusion.fusion_core import FusionError, OptimizeConfig
from autofusion.fusion_core.config import merge_options
from autofusion.fusion_core.pipeline import select_patterns
from autofusion.fusion_core.profiling.verdicts import machine_key, measuring_machine
from autofusion.fusion_core.report import Speed, read_report
from autofusion.fusion_core.rewriters import builtin_rewriters
from autofusion.worker.sandbox import VERDICTS_FILE, describe_validation_error
from autofusion.worker.snapshots import CompiledSnapshot, SnapshotCache

__all__ = [
    "JobConfigError",
    "Plan",
    "attempt_folder",
    "measured_by_pattern",
    "merge_strategy",
    "plan_job",
    "summarize",
]


class JobConfigError(Exception):
    """The job cannot succeed as asked (options, strategy): fail it, with this message."""


@dataclass(frozen=True)
class Plan:
    snapshot: CompiledSnapshot
    config: dict[str, Any]  # an OptimizeConfig, as JSON
    strategy: dict[str, Any] | None  # {"name", "version"} of the strategy merged in
    # Patterns the registry disabled on this worker's machine class, left out of the
    # job: {"machine_key", "patterns": {name: why}} (issue 28; None: none was).
    disabled_on_class: dict[str, Any] | None = None


def merge_strategy(overrides: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A strategy's options under the job's own (``fusion_core.config.merge_options``:
    the job wins, excludes add up). ``overrides`` is ``StrategySpec.config_overrides()``;
    ``config`` holds only the options the job set (stored with ``exclude_unset``)."""
    return merge_options(overrides, config)


def plan_job(
    session: Session, job: Job, cache: SnapshotCache, *, settings: Settings | None = None
) -> Plan:
    """What the attempt runs: snapshot, config (strategy merged in), checked. Raises
    ``JobConfigError`` when the job cannot succeed as asked. With ``settings``, measured
    selection reads the verdicts the worker writes into the attempt's folder
    (``worker.sandbox.VERDICTS_FILE``) and must fit the job's time limit."""
    # A retry keeps the snapshot of the first attempt: one job, one set of patterns.
    snapshot = cache.get(session, job.registry_version)
    config, strategy = dict(job.config or {}), None
    if job.strategy:
        overrides, strategy = _strategy(session, job.strategy, snapshot)
        config = merge_strategy(overrides, config)
    try:
        parsed = OptimizeConfig.model_validate(config)
        select_patterns(parsed, builtin_rewriters(), snapshot.compiled)
        measured = parsed.mode == "measured"  # refuses measured with progressive
    except ValidationError as exc:
        raise JobConfigError(f"invalid options: {describe_validation_error(exc)}") from None
    except FusionError as exc:
        raise JobConfigError(str(exc)) from None
    # --- patterns disabled on this machine class (issue 28, helper C) ---
    parsed, disabled = _exclude_disabled_on_class(session, parsed, snapshot)
    # --- end of the block of issue 28, helper C ---
    if settings is not None and measured:
        parsed = _place_measurement(parsed, settings, attempt_folder(settings, job))
    return Plan(snapshot, parsed.model_dump(mode="json"), strategy, disabled)


def attempt_folder(settings: Settings, job: Job) -> Path:
    """The folder of the job's current attempt (``worker.execute`` prepares it)."""
    return (settings.jobs_dir / job.id / f"attempt-{job.attempts}").resolve()


def _place_measurement(config: OptimizeConfig, settings: Settings, folder: Path) -> OptimizeConfig:
    """Measured selection times models on this worker: it reuses the verdicts the
    worker hands it (the attempt folder's verdicts.json, from the service's store) and
    keeps nothing itself (no ``cache_dir``: a folder every sandbox could write would let
    one job's measurements decide another's unchecked); its budget must leave time to
    build and check the models."""
    budget = config.measure_options.budget_s
    if budget > settings.job_time_limit_s / 2:
        raise JobConfigError(
            f"measure_options.budget_s ({budget:g} s) must be at most half the job time "
            f"limit ({settings.job_time_limit_s} s): measured selection also builds and "
            "checks the models; give a smaller budget"
        )
    update = {
        "cache_dir": None,
        # Beside job.json, not in input/ (the user's files): worker.execute writes it.
        "verdicts_file": str(folder / VERDICTS_FILE),
        "verdict_max_age_days": settings.verdict_max_age_days,
    }
    options = config.measure_options.model_copy(update=update)
    return config.model_copy(update={"measure_options": options})


# --- patterns disabled on this machine class (issue 28, helper C): the block's helper ---
def _exclude_disabled_on_class(
    session: Session, config: OptimizeConfig, snapshot: CompiledSnapshot
) -> tuple[OptimizeConfig, dict[str, Any] | None]:
    """The patterns this job would use that are disabled on the machine class it runs on
    here (this host, the level and threads of its measure_options), added to its
    exclude; measured or not: a pattern measured slower here is not for cost-based
    selection either. With what the summary says about them (None: none was)."""
    options = config.measure_options
    key = machine_key(measuring_machine(options.level, options.threads))
    rules = excluded_for(session, key)
    if not rules:
        return config, None
    # Registry patterns this job would use (a job's own extra patterns are not ruled).
    chosen = {p.name for p in select_patterns(config, builtin_rewriters(), snapshot.compiled)}
    chosen &= {p.name for p in snapshot.compiled}
    disabled = {name: why for name, why in sorted(rules.items()) if name in chosen}
    if not disabled:
        return config, None
    config = config.model_copy(update={"exclude": [*config.exclude, *disabled]})
    return config, {"machine_key": key, "patterns": disabled}


# --- end of the block of issue 28, helper C ---


def _strategy(
    session: Session, name: str, snapshot: CompiledSnapshot
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The named strategy's options, and what the summary says about it.

    Patterns it names that this snapshot lacks (disabled or deleted since the strategy
    was written) are dropped, not fatal: disabling a pattern must not break a strategy.
    """
    record = session.get(Strategy, name)
    if record is None:
        raise JobConfigError(
            f"strategy {name!r} does not exist; "
            "GET /v1/strategies lists the strategies, or submit without one"
        )
    try:
        overrides = StrategySpec.model_validate(record.data).config_overrides()
    except ValidationError as exc:
        detail = describe_validation_error(exc)
        raise JobConfigError(f"strategy {name!r} is invalid: {detail}") from None
    available = {p.name for p in snapshot.compiled}
    unavailable: list[str] = []
    for key in ("patterns", "exclude"):
        if isinstance(overrides.get(key), list):
            unavailable += [n for n in overrides[key] if n not in available]
            overrides[key] = [n for n in overrides[key] if n in available]
    info: dict[str, Any] = {"name": record.name, "version": record.version}
    if unavailable:
        info["unavailable_patterns"] = sorted(set(unavailable))
    return overrides, info


def summarize(report: dict[str, Any], plan: Plan, attempts: int, seconds: float) -> dict:
    """The job row's summary (``app.core.job_records.JobSummary``): the report's facts as
    ``fusion_core.report.read_report`` reads them, and what this attempt ran."""
    facts = read_report(report)
    summary: dict[str, Any] = {
        "target": facts.target,
        "registry_version": plan.snapshot.version,
        "strategy": plan.strategy,
        "counts": facts.counts,
        "fusions": facts.fusions,
        "check": None,
        "nodes": {"before": facts.nodes_before, "after": facts.nodes_after},  # main graph
        "timings": {**facts.timings_s, "sandbox": round(seconds, 3)},
        "attempts": attempts,
        "speed": _speed(facts.speed),
    }
    if facts.check_passed is not None:
        summary["check"] = {
            "passed": facts.check_passed,
            "max_abs_diff": _finite(facts.max_abs_diff),
            "failure": facts.check_failure,
            "error": facts.check_error,
            "reason": facts.check_reason,
            "left_out": list(facts.check_left_out),  # sizes the original cannot run at
        }
    if facts.fallback_reason is not None:
        summary["fallback"] = {
            "reason": facts.fallback_reason,
            "dropped": facts.fallback_dropped,
            "unchanged": facts.fallback_unchanged,
        }
    if facts.rejected:
        summary["rejected"] = facts.rejected
    if facts.subgraph_nodes is not None:  # If/Loop/Scan bodies, apart from the main graph
        bodies = {"before": facts.subgraph_nodes_before, "after": facts.subgraph_nodes_after}
        summary["nodes"]["subgraphs"] = bodies
    if plan.snapshot.skipped:
        summary["skipped_patterns"] = sorted(plan.snapshot.skipped)
    measured = measured_by_pattern(report)
    if measured:
        summary["measured"] = measured
    verdicts = _verdicts(report)
    if verdicts is not None:
        summary["verdicts"] = verdicts
    if plan.disabled_on_class:  # issue 28: left out on this machine class, and why
        summary["disabled_on_class"] = plan.disabled_on_class
    return summary


def _verdicts(report: dict[str, Any]) -> dict[str, int] | None:
    """What measured selection took from the verdict store and measured (the report's
    ``measurement.store``); ``stored`` is filled in by the worker (worker/job_verdicts.py)."""
    measurement = report.get("measurement")
    store = measurement.get("store") if isinstance(measurement, dict) else None
    if not isinstance(store, dict):
        return None

    def count(name: str) -> int:
        value = store.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return {"reused": count("matched"), "measured": count("measured"), "stored": 0}


# A group's paired verdict as the summary counts it ("no measurable change" is "level").
_VERDICT_COUNTS = {"faster": "faster", "no measurable change": "level", "slower": "slower"}


def measured_by_pattern(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Measured selection's groups per pattern: how many were kept and dropped, and how
    each measured (faster, level, slower; a group decided by the cache counts too). The
    patterns page sums these over a tenant's jobs, so the report is not read again."""
    measurement = report.get("measurement")
    groups = measurement.get("groups") if isinstance(measurement, dict) else None
    counts: dict[str, dict[str, int]] = {}
    for group in groups if isinstance(groups, list) else []:
        if not isinstance(group, dict) or not isinstance(group.get("pattern"), str):
            continue
        entry = counts.setdefault(group["pattern"], dict.fromkeys(("kept", "dropped"), 0))
        key = "kept" if group.get("kept") else "dropped"
        entry[key] += 1
        ratio = group.get("ratio")
        verdict = _VERDICT_COUNTS.get(ratio.get("verdict")) if isinstance(ratio, dict) else None
        if verdict is not None:
            entry[verdict] = entry.get(verdict, 0) + 1
    return counts


def _speed(speed: Speed | None) -> dict[str, Any] | None:
    if speed is None or _finite(speed.speedup) is None:
        return None
    return {**asdict(speed), "speedup": speed.speedup}


def _finite(value: Any) -> float | None:
    """JSON columns (PostgreSQL's above all) refuse inf and NaN."""
    return value if isinstance(value, int | float) and math.isfinite(value) else None
