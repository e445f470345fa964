"""When a stored verdict is timed again instead of reused: it was measured under another
onnxruntime (any build of it: onnxruntime-gpu and the other variants included) or
another machine class, it is older than ``verdict_max_age_days``, or it is dated ahead
of the clock by more than ``CLOCK_SKEW`` (which would otherwise never age out).

Reuse across versions, thread counts, patterns and age through a real measured run is
tests/fusion_core/test_measured_verdicts.py's; these are the record-level rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import metadata

from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.pipeline.measured import VerdictStore
from autofusion.fusion_core.profiling import PairedRatio
from autofusion.fusion_core.profiling import verdicts as verdicts_module
from autofusion.fusion_core.profiling.verdicts import (
    CLOCK_SKEW,
    VerdictRecord,
    fresh,
    host_class,
    machine_key,
    write_verdicts,
)

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
KEY = "2" * 64


def _record(measured_at: datetime, n: int = 0) -> VerdictRecord:
    return VerdictRecord(
        signature=f"{n:064x}", pattern="p", pattern_hash="1" * 64, group="p -> X", region={},
        machine_key=KEY, machine={}, target="generic",
        ratio=PairedRatio(0.8, 0.78, 0.82, 0.95, 20, "faster"),
        measured_at=measured_at.isoformat(),
    )  # fmt: skip


@given(
    age_hours=st.floats(-24 * 1000, 24 * 1000, allow_nan=False),
    max_age_days=st.floats(0.01, 365, allow_nan=False),
)
def test_fresh_is_within_the_age_limit_and_not_ahead_past_the_skew(age_hours, max_age_days):
    when = NOW - timedelta(hours=age_hours)
    expected = -CLOCK_SKEW <= timedelta(hours=age_hours) <= timedelta(days=max_age_days)
    assert fresh(when, NOW, max_age_days) is expected


def test_the_store_reuses_no_record_dated_far_ahead(tmp_path):
    ahead, near, old = NOW + timedelta(days=400), NOW + timedelta(hours=3), NOW - timedelta(days=31)
    path = tmp_path / "verdicts.json"
    write_verdicts(path, [_record(ahead, 1), _record(near, 2), _record(old, 3)])
    store = VerdictStore([path], machine_key=KEY, max_age_days=30, now=NOW)
    assert store.records_for(f"{1:064x}") == []  # would have been reused until 2028
    assert [r.measured_at for r in store.records_for(f"{2:064x}")] == [near.isoformat()]
    assert store.records_for(f"{3:064x}") == []  # older than the limit
    assert store.read == 3


def _variant_build(monkeypatch, version: str) -> None:
    """onnxruntime installed as onnxruntime-gpu ``version``: no ``onnxruntime``
    distribution, the import package provided by another."""
    real = metadata.version

    def fake_version(name: str) -> str:
        if name == "onnxruntime":
            raise metadata.PackageNotFoundError(name)
        return version if name == "onnxruntime-gpu" else real(name)

    monkeypatch.setattr(verdicts_module.metadata, "version", fake_version)
    monkeypatch.setattr(
        verdicts_module.metadata,
        "packages_distributions",
        lambda: {"onnxruntime": ["onnxruntime-gpu"]},
    )


def test_a_variant_build_of_onnxruntime_is_its_own_version(monkeypatch):
    _variant_build(monkeypatch, "1.19.2")
    old = host_class()
    assert old["onnxruntime"] == "1.19.2"
    _variant_build(monkeypatch, "1.20.0")
    new = host_class()
    assert new["onnxruntime"] == "1.20.0"
    assert machine_key(old) != machine_key(new)  # its verdicts are timed again


def test_without_onnxruntime_the_version_says_none(monkeypatch):
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(verdicts_module.metadata, "version", missing)
    monkeypatch.setattr(verdicts_module.metadata, "packages_distributions", lambda: {})
    assert host_class()["onnxruntime"] == "none"
