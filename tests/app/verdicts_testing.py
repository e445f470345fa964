"""What the verdict store's tests share: a valid verdict in the file form (``record``) and a
stored row with every column chosen (``row``); imported as ``tests.app.verdicts_testing``."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from autofusion.app.core.models import Verdict
from autofusion.app.services.verdicts import new_row
from autofusion.fusion_core.profiling.verdicts import VerdictRecord, machine_key

NOW = datetime.now(UTC).replace(microsecond=123456)
MACHINE = {
    "cpu": "Test CPU 9000",
    "isa": ["avx2"],
    "cpus": 2,
    "machine": "x86_64",
    "onnxruntime": "1.23.0",
    "providers": ["CPUExecutionProvider"],
    "level": "ORT_ENABLE_ALL",
    "threads": 1,
}
KEY = machine_key(MACHINE)
LISTED = ("id", "job_visible")  # what a listed verdict has besides the file form


def record(n: int = 0, *, machine: dict | None = None, **fields: Any) -> dict[str, Any]:
    """A valid verdict in the file form; ``fields`` replace its fields (``median`` and
    ``verdict`` its ratio's)."""
    median = fields.pop("median", 0.9)
    verdict = fields.pop("verdict", "faster")
    machine = machine or MACHINE
    when = fields.pop("measured_at", NOW)
    return {
        "signature": hashlib.sha256(f"signature {n}".encode()).hexdigest(),
        "pattern": "conv_bn_relu",
        "pattern_hash": "a" * 64,
        "group": "conv_bn_relu -> FusedConv",
        "region": {"ops": ["FusedConv"], "fusions": 2, "regions": ["Conv 3x3 f32 [N,C,H,W]"]},
        "machine_key": machine_key(machine),
        "machine": machine,
        "target": "onnxruntime",
        "ratio": {
            "median": median,
            "low": median - 0.02,
            "high": median + 0.02,
            "confidence": 0.95,
            "runs": 20,
            "verdict": verdict,
        },
        "measured_at": when.isoformat() if isinstance(when, datetime) else when,
        "with_ms": 3.5,
        "predicted": {"saved_us": 12.0, "before_us": 40.0, "after_us": 28.0, "fusions": 2},
        "job_id": None,
        "source": "measured",
        **fields,
    }


def row(n: int = 0, *, job_id=None, tenant_id=None, source="measured", **fields) -> Verdict:
    """A stored verdict, written straight to the table (every column chosen)."""
    r = VerdictRecord.from_dict(record(n, **fields))
    return new_row(r, job_id=job_id, tenant_id=tenant_id, source=source)
