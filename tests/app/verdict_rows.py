"""Helpers of the pattern-per-machine-class tests: verdicts as ``VerdictRecord`` values
(the file and API form), stored as rows of ``verdicts`` the way the worker stores them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from autofusion.app.services.verdicts import new_row
from autofusion.fusion_core.profiling import PairedRatio, verdict_of
from autofusion.fusion_core.profiling.verdicts import VerdictRecord, machine_key

# Ratios (with the group / without it) and their 95% intervals.
FASTER = (0.80, 0.78, 0.82)
LEVEL = (1.00, 0.98, 1.02)
SLOWER = (1.20, 1.17, 1.23)
T0 = datetime(2026, 12, 1, tzinfo=UTC)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def machine(*, threads: int = 1, cpu: str = "Test CPU 9000", ort: str = "1.20.0") -> dict:
    """A machine class as ``machine_class`` writes it (not this host's)."""
    return {
        "cpu": cpu,
        "isa": ["avx2", "fma"],
        "cpus": 8,
        "machine": "x86_64",
        "onnxruntime": ort,
        "providers": ["CPUExecutionProvider"],
        "level": "ORT_ENABLE_ALL",
        "threads": threads,
    }


def record(
    ratio: tuple[float, float, float],
    *,
    job: str | None,
    pattern: str = "conv_bn_relu",
    on: dict[str, Any] | None = None,
    region: str = "r1",
    version: str = "v1",
    minutes: int = 0,
    with_ms: float | None = None,
    predicted: dict[str, Any] | None = None,
) -> VerdictRecord:
    median, low, high = ratio
    on = on or machine()
    return VerdictRecord(
        signature=sha(f"{pattern}/{version}/{region}"),
        pattern=pattern,
        pattern_hash=sha(f"{pattern}/{version}"),
        group=f"{pattern}[{region}]",
        region={"ops": ["Conv", "BatchNormalization", "Relu"], "fusions": 1, "regions": []},
        machine_key=machine_key(on),
        machine=on,
        target="generic",
        ratio=PairedRatio(median, low, high, 0.95, 20, verdict_of(low, high, median)),
        measured_at=(T0 + timedelta(minutes=minutes)).isoformat(),
        with_ms=with_ms,
        predicted=predicted,
        job_id=job,
    )


def store(session: Session, records: Iterable[VerdictRecord], tenant: str = "default") -> None:
    """The records as rows of ``verdicts`` (the job's tenant set, as the worker does)."""
    for r in records:
        session.add(new_row(r, tenant_id=tenant if r.job_id else None))
    session.flush()
