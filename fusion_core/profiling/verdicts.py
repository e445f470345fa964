"""Verdicts: what measured selection learned, in a form any store can keep and share.

A **verdict** is one measured decision on a group of fusions: its region signature
(``pipeline/measured/_signature.py``: the pattern, its spec's hash, the fused ops, and
the regions' op types, attributes and shape classes, never a name or a weight), the
machine class it
was timed on (``machine_class``), and the paired ratio (model with the group / without
it) with its interval and number of runs. Verdicts are never overwritten: the
measurements of one signature on one machine class are combined when read
(``combine_verdicts``), so a contradicting measurement widens the evidence instead of
replacing it.

This module is light on purpose (no onnx, no onnxruntime): the service's API lists,
exports and imports verdicts without loading the optimization pipeline.

The file format (``VERDICTS_FORMAT``) is what the local CLI's store, the sandbox's
input and output, ``autofusion verdicts export/import`` and ``optimize --verdicts`` all
read and write::

    {"format": "autofusion-verdicts/1", "verdicts": [VerdictRecord.to_dict(), ...]}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import Any

from autofusion.fusion_core.profiling.cpus import usable_cpus
from autofusion.fusion_core.profiling.stats import (
    CONFIDENCE,
    FASTER,
    SLOWER,
    VERDICTS,
    PairedRatio,
    verdict_of,
)

__all__ = [
    "CLOCK_SKEW",
    "VERDICTS_FORMAT",
    "CombinedVerdict",
    "VerdictRecord",
    "combine_verdicts",
    "fresh",
    "host_class",
    "onnxruntime_version",
    "machine_class",
    "machine_key",
    "measuring_machine",
    "parse_verdicts",
    "read_verdicts",
    "write_verdicts",
]

VERDICTS_FORMAT = "autofusion-verdicts/1"
# How far in the future a verdict's measured_at may lie and still be reused (another
# machine's clock runs ahead). Past it the record is not fresh: a time far ahead (a
# wrong clock, an edited file) would otherwise keep a verdict from ever ageing out.
CLOCK_SKEW = timedelta(days=1)
_Z = 1.959963984540054  # the normal quantile of a two-sided 95% interval
_HEX64 = frozenset("0123456789abcdef")
# CPU flags that decide which kernels onnxruntime's MLAS picks (x86 and Arm).
_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8",
    "amx_bf16", "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16",
)  # fmt: skip


def host_class() -> dict[str, Any]:
    """What this host is, for timings: CPU model and instruction set, the CPUs this
    process may use (``cpus.usable_cpus``: a container's quota or pinning, not the host's),
    architecture and onnxruntime's version (read from its metadata: onnxruntime itself
    is not imported, so the worker can ask cheaply)."""
    cpu, flags = _cpuinfo()
    return {
        "cpu": cpu,
        "isa": sorted(set(flags) & set(_ISA_FLAGS)),
        "cpus": usable_cpus(),
        "machine": platform.machine(),
        "onnxruntime": onnxruntime_version(),
    }


def onnxruntime_version() -> str:
    """The installed onnxruntime's version: of the ``onnxruntime`` distribution, or of
    the variant build that provides the ``onnxruntime`` import package (onnxruntime-gpu,
    -openvino, -directml...), so a verdict of one version is never reused under another;
    ``"none"`` when there is none."""
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        pass
    for provider in metadata.packages_distributions().get("onnxruntime", []):
        try:
            return metadata.version(provider)
        except metadata.PackageNotFoundError:
            continue
    return "none"


def fresh(when: datetime, now: datetime, max_age_days: float) -> bool:
    """A verdict measured at ``when`` may be reused at ``now``: at most ``max_age_days``
    old, and not further ahead than ``CLOCK_SKEW``."""
    return -CLOCK_SKEW <= now - when <= timedelta(days=max_age_days)


def machine_class(*, level: str, threads: int, providers: Sequence[str]) -> dict[str, Any]:
    """The machine class a timing transfers within: the host and how onnxruntime ran."""
    return {**host_class(), "providers": list(providers), "level": level, "threads": threads}


def measuring_machine(level: str, threads: int) -> dict[str, Any]:
    """The machine class measured selection records its verdicts under on this host
    (``PairedTimer`` runs on onnxruntime's CPU provider), for callers that match
    verdicts or rules before any timing: ``machine_key(measuring_machine(...))``."""
    return machine_class(level=level, threads=threads, providers=("CPUExecutionProvider",))


def machine_key(machine: Mapping[str, Any]) -> str:
    """The sha256 of a machine class: verdicts are looked up by it."""
    text = json.dumps(dict(machine), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _cpuinfo() -> tuple[str, list[str]]:
    model, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Model") and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = value.split()
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


@dataclass(frozen=True)
class VerdictRecord:
    """One measured decision (see the module doc); ``to_dict``/``from_dict`` are the
    file and API form. ``from_dict`` validates: a store's input may come from a file a
    user or a sandbox wrote."""

    signature: str  # sha256 hex of the region signature (_signature.py)
    pattern: str
    pattern_hash: str  # sha256 hex of the pattern's spec: a new version is a new signature
    group: str  # FusionGroup.key, for people
    region: dict[str, Any]  # {"ops": [...], "fusions": N, "shapes": [...], "dtypes": [...]}
    machine_key: str
    machine: dict[str, Any]  # machine_class()
    target: str
    ratio: PairedRatio  # with the group / without it
    measured_at: str  # ISO 8601, UTC
    with_ms: float | None = None  # the median run time of the model with the group
    predicted: dict[str, Any] | None = None  # the cost model's: saved_us, before_us, ...
    job_id: str | None = None
    source: str = "measured"  # or "imported"

    @property
    def when(self) -> datetime:
        return _parse_time(self.measured_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "signature": self.signature,
            "pattern": self.pattern,
            "pattern_hash": self.pattern_hash,
            "group": self.group,
            "region": self.region,
            "machine_key": self.machine_key,
            "machine": self.machine,
            "target": self.target,
            "ratio": self.ratio.to_dict(),
            "measured_at": self.measured_at,
            "with_ms": self.with_ms,
            "predicted": self.predicted,
            "job_id": self.job_id,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Any) -> VerdictRecord:
        """Raises ValueError saying which field is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("a verdict must be an object")
        for name in ("signature", "pattern_hash", "machine_key"):
            value = data.get(name)
            if not (isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64):
                raise ValueError(f"{name} must be 64 lowercase hex digits")
        for name in ("pattern", "group", "target", "measured_at"):
            if not isinstance(data.get(name), str) or not data[name] or len(data[name]) > 500:
                raise ValueError(f"{name} must be a non-empty string of at most 500 characters")
        for name in ("region", "machine"):
            if not isinstance(data.get(name), Mapping):
                raise ValueError(f"{name} must be an object")
        _parse_time(data["measured_at"])
        source = data.get("source", "measured")
        if source not in ("measured", "imported"):
            raise ValueError("source must be 'measured' or 'imported'")
        job_id = data.get("job_id")
        if job_id is not None and (not isinstance(job_id, str) or len(job_id) > 64):
            raise ValueError("job_id must be a string of at most 64 characters")
        return cls(
            signature=data["signature"],
            pattern=data["pattern"],
            pattern_hash=data["pattern_hash"],
            group=data["group"],
            region=dict(data["region"]),
            machine_key=data["machine_key"],
            machine=dict(data["machine"]),
            target=data["target"],
            ratio=_ratio(data.get("ratio")),
            measured_at=data["measured_at"],
            with_ms=_positive_or_none(data.get("with_ms"), "with_ms"),
            predicted=_mapping_or_none(data.get("predicted")),
            job_id=job_id,
            source=source,
        )


def _ratio(data: Any) -> PairedRatio:
    if not isinstance(data, Mapping):
        raise ValueError("ratio must be an object")
    values = {}
    for name in ("median", "low", "high", "confidence"):
        value = data.get(name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"ratio.{name} must be a finite number")
        values[name] = float(value)
    if not 0 < values["low"] <= values["median"] <= values["high"] < 1000:
        raise ValueError("ratio must have 0 < low <= median <= high < 1000")
    if not 0 < values["confidence"] <= 1:
        raise ValueError("ratio.confidence must be in (0, 1]")
    runs = data.get("runs")
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= 1_000_000:
        raise ValueError("ratio.runs must be a whole number from 1 to 1000000")
    verdict = data.get("verdict")
    if verdict not in VERDICTS:
        raise ValueError(f"ratio.verdict must be one of {', '.join(VERDICTS)}")
    return PairedRatio(runs=runs, verdict=verdict, **values)


def _positive_or_none(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ValueError(f"{name} must be a positive number of milliseconds or null")
    return float(value)


def _mapping_or_none(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _parse_time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise ValueError("measured_at must be an ISO 8601 time") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class CombinedVerdict:
    """The measurements of one signature on one machine class, combined.

    On the log of the ratio, each measurement weighted by its precision (its interval's
    width), with the spread between measurements added to each one's variance (the
    DerSimonian-Laird estimate): measurements that contradict each other widen the
    combined interval instead of averaging to a confident "no change". ``agree``: every
    measurement has the same verdict. ``confident``: a decision may be taken from it
    without timing (``decides``)."""

    ratio: PairedRatio
    measurements: int
    agree: bool
    jobs: tuple[str, ...] = field(default=())

    @property
    def confident(self) -> bool:
        """Decisive: the measurements agree, or the combination is beyond the noise
        even with their disagreement counted (faster or slower)."""
        return self.agree or self.ratio.verdict in (FASTER, SLOWER)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio.to_dict(),
            "measurements": self.measurements,
            "agree": self.agree,
            "confident": self.confident,
            "jobs": list(self.jobs),
        }


def combine_verdicts(records: Iterable[VerdictRecord]) -> CombinedVerdict | None:
    """The records' ratios combined (see ``CombinedVerdict``); None without records."""
    records = list(records)
    if not records:
        return None
    if len(records) == 1:
        # One measurement is its own verdict: its order-statistic interval as measured,
        # not the symmetric normal one below (which can turn a lopsided "faster" into
        # "no measurable change" and so decide otherwise than the job that measured it).
        record = records[0]
        jobs = (record.job_id,) if record.job_id else ()
        return CombinedVerdict(record.ratio, 1, agree=True, jobs=jobs)
    logs, variances = [], []
    for record in records:
        r = record.ratio
        half = (math.log(r.high) - math.log(r.low)) / 2
        # A single run's interval is a point: give it the spread of a 1% margin.
        se = max(half / _Z, 0.005)
        logs.append(math.log(r.median))
        variances.append(se * se)
    weights = [1 / v for v in variances]
    mean = sum(w * x for w, x in zip(weights, logs, strict=True)) / sum(weights)
    q = sum(w * (x - mean) ** 2 for w, x in zip(weights, logs, strict=True))
    k = len(records)
    c = sum(weights) - sum(w * w for w in weights) / sum(weights)
    tau2 = max(0.0, (q - (k - 1)) / c) if k > 1 and c > 0 else 0.0
    weights = [1 / (v + tau2) for v in variances]
    mean = sum(w * x for w, x in zip(weights, logs, strict=True)) / sum(weights)
    se = math.sqrt(1 / sum(weights))
    median, low, high = math.exp(mean), math.exp(mean - _Z * se), math.exp(mean + _Z * se)
    ratio = PairedRatio(
        median=median,
        low=low,
        high=high,
        confidence=CONFIDENCE,
        runs=sum(r.ratio.runs for r in records),
        verdict=verdict_of(low, high, median),
    )
    verdicts = {r.ratio.verdict for r in records}
    jobs = tuple(dict.fromkeys(r.job_id for r in records if r.job_id))
    return CombinedVerdict(ratio, k, agree=len(verdicts) == 1, jobs=jobs)


def read_verdicts(path: str | os.PathLike) -> tuple[list[VerdictRecord], list[str]]:
    """The valid records of a verdicts file, and a line per record left out (why).
    Raises ValueError when the file is not a verdicts file at all, OSError when it
    cannot be read."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as exc:
            raise ValueError(f"{os.fspath(path)} is not JSON: {exc}") from None
    try:
        return parse_verdicts(data)
    except ValueError as exc:
        raise ValueError(f"{os.fspath(path)} {exc}") from None


def parse_verdicts(data: Any) -> tuple[list[VerdictRecord], list[str]]:
    """The valid records of a verdicts document (a file's JSON, an import's body), and a
    line per record left out (why). Raises ValueError ("is not a verdicts file ...") when
    the document is not one at all."""
    if not isinstance(data, Mapping) or data.get("format") != VERDICTS_FORMAT:
        raise ValueError(
            f"is not a verdicts file (its format must be {VERDICTS_FORMAT!r}, "
            "as `autofusion verdicts export` writes it)"
        )
    items = data.get("verdicts")
    if not isinstance(items, list):
        raise ValueError("is not a verdicts file: its 'verdicts' must be a list")
    records, skipped = [], []
    for index, item in enumerate(items):
        try:
            records.append(VerdictRecord.from_dict(item))
        except ValueError as exc:
            skipped.append(f"verdict {index}: {exc}")
    return records, skipped


def write_verdicts(path: str | os.PathLike, records: Iterable[VerdictRecord]) -> None:
    """The records as a verdicts file, written whole (a temporary file of its own,
    renamed: two writers never interleave, and a reader never sees half a file)."""
    folder, name = os.path.split(os.path.abspath(path))
    data = {"format": VERDICTS_FORMAT, "verdicts": [r.to_dict() for r in records]}
    # open(..., "x"), not mkstemp: the file gets the umask's mode, as the other files a
    # run writes do (a worker under another user reads what the sandbox wrote)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
