"""The registry learns from the verdict store (issue 28, item 3), the service itself on
SQLite and PostgreSQL: per pattern and machine class, how it measured (faster, level,
slower, combined); disabling a pattern on one class with the evidence, enabling it
again; what the worker excludes on a class; the automatic rule, off by default."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from verdict_rows import FASTER, LEVEL, SLOWER, T0, machine, record, store

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import PatternClassRule
from autofusion.app.migrate import upgrade
from autofusion.app.services import pattern_class_rules as class_rules
from autofusion.app.services.registry import create_pattern
from autofusion.fusion_core.profiling.verdicts import machine_key

HERE, THERE = machine(threads=1), machine(threads=4)
HERE_KEY, THERE_KEY = machine_key(HERE), machine_key(THERE)


def _spec(name: str) -> dict:
    return {
        "name": name,
        "nodes": [
            {"id": "conv", "op": "Conv"},
            {"id": "act", "op": "Relu", "inputs": {"0": "conv"}},
        ],
        "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path) -> Iterator[str]:
    """A migrated database with three patterns in its registry (no verdict yet)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'rules.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    upgrade(url)
    with session_scope(url) as session:
        for name in ("conv_bn_relu", "other", "mixed"):
            create_pattern(session, _spec(name), "test")
    yield url


def test_stats_count_and_combine_per_machine_class(database) -> None:
    with session_scope(database) as session:
        store(session, [record(FASTER, job="j1"), record(LEVEL, job="j2", minutes=1)], "acme")
        store(session, [record(SLOWER, job="j3", region="r2", minutes=2)], "other-tenant")
        store(session, [record(SLOWER, job="j4", on=THERE, minutes=3)], "acme")
        store(session, [record(FASTER, job="j5", pattern="other")], "acme")
        stats = class_rules.pattern_stats(session, "conv_bn_relu", tenant_id="acme")
        everything = class_rules.pattern_stats(session)

    assert [s.machine_key for s in stats] == [THERE_KEY, HERE_KEY]  # newest first
    there, here = stats
    assert (here.faster, here.level, here.slower, here.measurements) == (1, 1, 1, 3)
    assert here.jobs == 3 and set(here.tenant_jobs) == {"j1", "j2"}  # not the other tenant's
    assert len(here.signatures) == 2 and len(here.verdict_ids) == 3
    assert here.combined.measurements == 3 and not here.combined.agree
    # Faster, level and slower contradict each other: combined, no confident verdict.
    assert here.combined.ratio.low < 1 < here.combined.ratio.high
    assert here.combined.ratio.verdict == "no measurable change"
    assert (there.slower, there.jobs, there.combined.ratio.verdict) == (1, 1, "slower")
    assert there.label == "Test CPU 9000 · 4 threads · ORT_ENABLE_ALL · onnxruntime 1.20.0"
    assert here.evidence_url == f"/v1/verdicts?pattern=conv_bn_relu&machine_key={HERE_KEY}"
    assert {(s.pattern, s.machine_key) for s in everything} == {
        ("conv_bn_relu", HERE_KEY),
        ("conv_bn_relu", THERE_KEY),
        ("other", HERE_KEY),
    }


def test_only_the_version_measured_last_counts(database) -> None:
    with session_scope(database) as session:
        store(session, [record(SLOWER, job=f"old{k}", minutes=k) for k in range(3)])
        store(session, [record(FASTER, job="new", version="v2", minutes=10)])
        (stats,) = class_rules.pattern_stats(session, "conv_bn_relu")
    assert (stats.faster, stats.slower, stats.older_versions, stats.jobs) == (1, 0, 3, 1)
    assert stats.combined.ratio.verdict == "faster"


def test_disable_needs_evidence_refuses_twice_and_enable_reverses_it(database) -> None:
    with session_scope(database) as session:
        store(session, [record(SLOWER, job="j1"), record(SLOWER, job="j2", region="r2")])
    with session_scope(database) as session:
        with pytest.raises(ProblemError) as no_evidence:
            class_rules.disable_on_class(session, "conv_bn_relu", THERE_KEY, by="key:1", reason="x")
        assert (no_evidence.value.status, no_evidence.value.slug) == (422, "no-verdicts")
        with pytest.raises(ProblemError) as unknown:
            class_rules.disable_on_class(session, "nope", HERE_KEY, by="key:1", reason="x")
        assert unknown.value.status == 404
        rule = class_rules.disable_on_class(
            session, "conv_bn_relu", HERE_KEY, by="key:1", reason="slower on this CPU"
        )
        assert (rule.created_by, rule.reason, rule.machine["threads"]) == (
            "key:1",
            "slower on this CPU",
            1,
        )
        assert rule.evidence["combined"]["ratio"]["verdict"] == "slower"
        assert rule.evidence["measurements"] == 2 and len(rule.evidence["verdict_ids"]) == 2
        assert sorted(rule.evidence["combined"]["jobs"]) == ["j1", "j2"]
    with session_scope(database) as session:
        with pytest.raises(ProblemError) as twice:
            class_rules.disable_on_class(session, "conv_bn_relu", HERE_KEY, by="key:2", reason="y")
        assert (twice.value.status, twice.value.slug) == (409, "pattern-rule-exists")
        excluded = class_rules.excluded_for(session, HERE_KEY)
        assert class_rules.excluded_for(session, THERE_KEY) == {}
        assert class_rules.rule_counts(session) == {"conv_bn_relu": 1}
    assert list(excluded) == ["conv_bn_relu"]
    why = excluded["conv_bn_relu"]
    for part in ("by key:1", "slower on this CPU", "ratio 1.2", "2 measurements in 2 jobs"):
        assert part in why, why
    assert f"machine_key={HERE_KEY}" in why
    with session_scope(database) as session:
        class_rules.enable_on_class(session, "conv_bn_relu", HERE_KEY)
    with session_scope(database) as session:
        assert class_rules.excluded_for(session, HERE_KEY) == {}
        with pytest.raises(ProblemError) as none:
            class_rules.enable_on_class(session, "conv_bn_relu", HERE_KEY)
        assert (none.value.status, none.value.slug) == (404, "pattern-rule-not-found")


def _job_slower(
    database: str, job: str, minutes: int, settings: Settings, *, now_days: float = 1
) -> list[str]:
    """A job stored a slower verdict of conv_bn_relu here, then the hook ran, ``now_days``
    after T0 (the verdicts' clock)."""
    now = T0 + timedelta(days=now_days)
    with session_scope(database) as session:
        store(session, [record(SLOWER, job=job, minutes=minutes, region=job)])
        return class_rules.apply_auto_disable(session, settings, ["conv_bn_relu", "other"], now=now)


def test_auto_disable_after_enough_jobs_and_not_before(database, caplog) -> None:
    settings = Settings(verdicts_auto_disable=True, verdicts_auto_disable_min_jobs=3)
    assert _job_slower(database, "j1", 0, settings) == []
    assert _job_slower(database, "j2", 1, settings) == []
    with session_scope(database) as session:  # two jobs: no rule yet
        assert class_rules.rules(session) == []
    with caplog.at_level(logging.WARNING, logger=class_rules.__name__):
        assert _job_slower(database, "j3", 2, settings) == ["conv_bn_relu"]
    assert "disabled automatically" in caplog.text and "conv_bn_relu" in caplog.text
    with session_scope(database) as session:
        (rule,) = class_rules.rules(session)
        assert (rule.pattern, rule.machine_key, rule.created_by) == (
            "conv_bn_relu",
            HERE_KEY,
            "auto",
        )
        assert rule.evidence["jobs"] == 3 and "verdicts_auto_disable" in rule.reason
        assert "conv_bn_relu" in class_rules.excluded_for(session, HERE_KEY)
    assert _job_slower(database, "j4", 3, settings) == []  # the rule is there already


def test_auto_disable_is_off_by_default_and_never_on_faster_or_mixed(database) -> None:
    assert Settings().verdicts_auto_disable is False
    off = Settings()
    for k in range(4):
        assert _job_slower(database, f"j{k}", k, off) == []
    on = Settings(verdicts_auto_disable=True, verdicts_auto_disable_min_jobs=1)
    with session_scope(database) as session:
        store(
            session,
            [record(FASTER, job=f"f{k}", pattern="other", region=f"f{k}") for k in range(3)],
        )
        assert class_rules.apply_auto_disable(session, on, ["other"]) == []
        # Two jobs measured it slower, a third level: contradicting, no confident verdict.
        slower = [record(SLOWER, job=f"s{k}", pattern="mixed", region=f"s{k}") for k in range(2)]
        store(session, [*slower, record(LEVEL, job="l", pattern="mixed", minutes=1)])
        assert class_rules.apply_auto_disable(session, on, ["mixed"]) == []
        assert class_rules.rules(session) == []
        # A job's own extra pattern (not in the registry) is not the registry's to rule.
        store(session, [record(SLOWER, job="x", pattern="acme.private")])
        assert class_rules.apply_auto_disable(session, on, ["acme.private"]) == []
        assert session.query(PatternClassRule).count() == 0


def test_settings_refuse_a_threshold_below_one() -> None:
    with pytest.raises(ValueError, match="verdicts_auto_disable_min_jobs"):
        Settings(verdicts_auto_disable_min_jobs=0)


def test_auto_disable_counts_only_fresh_verdicts(database) -> None:
    """Two jobs measured slower long ago and one now: the old two are not reused, so
    they are no evidence either (three jobs needed, one fresh)."""
    settings = Settings(
        verdicts_auto_disable=True, verdicts_auto_disable_min_jobs=3, verdict_max_age_days=30
    )
    day = 24 * 60
    assert _job_slower(database, "j1", 0, settings, now_days=0) == []
    assert _job_slower(database, "j2", 1, settings, now_days=0) == []
    assert _job_slower(database, "j3", 40 * day, settings, now_days=40) == []
    with session_scope(database) as session:
        assert class_rules.rules(session) == []
    assert _job_slower(database, "j4", 40 * day + 1, settings, now_days=40) == []
    assert _job_slower(database, "j5", 40 * day + 2, settings, now_days=40) == ["conv_bn_relu"]


def _rule_made(database: str, by: str, pattern: str, days: float) -> None:
    with session_scope(database) as session:
        store(session, [record(SLOWER, job=f"{by}-{pattern}", pattern=pattern)])
        if by == class_rules.AUTO:
            on = Settings(verdicts_auto_disable=True, verdicts_auto_disable_min_jobs=1)
            now = T0 + timedelta(days=days)
            assert class_rules.apply_auto_disable(session, on, [pattern], now=now) == [pattern]
        else:
            class_rules.disable_on_class(session, pattern, HERE_KEY, by=by, reason="slower")
        rule = next(r for r in class_rules.rules(session, pattern))
        rule.created_at = T0 + timedelta(days=days)


def test_an_automatic_rule_lapses_with_its_evidence_a_persons_stays(database, caplog) -> None:
    """While a rule stands nothing measures the pattern on its class: an automatic rule
    lapses once its evidence is older than verdicts are reused; a person's stays."""
    settings = Settings(verdict_max_age_days=30)
    _rule_made(database, class_rules.AUTO, "conv_bn_relu", days=0)
    _rule_made(database, "key:1", "other", days=0)
    with session_scope(database) as session:
        assert class_rules.lapse_auto_rules(session, settings, now=T0 + timedelta(days=29)) == []
    with (
        session_scope(database) as session,
        caplog.at_level(logging.WARNING, logger=class_rules.__name__),
    ):
        lapsed = class_rules.lapse_auto_rules(session, settings, now=T0 + timedelta(days=31))
    assert lapsed == [("conv_bn_relu", HERE_KEY)]
    assert "automatic rule lapsed" in caplog.text
    with session_scope(database) as session:
        assert [r.pattern for r in class_rules.rules(session)] == ["other"]
        assert set(class_rules.excluded_for(session, HERE_KEY)) == {"other"}
