"""``autofusion calibrate --from-report`` and ``--from-verdicts``: learn the kernel
factors of a target profile from profiled reports (``fusion_core.cost.fit`` says how) or
from a verdicts export (``fit_verdict_factors`` below), and write the base profile with
them."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.fusion_core.cost import TargetProfile, dump_target_profile, load_target_profile
from autofusion.fusion_core.cost.fit import FittedFactor, fit_kernel_factors
from autofusion.fusion_core.errors import ConfigError, FusionError
from autofusion.fusion_core.profiling.verdicts import VerdictRecord, read_verdicts

__all__ = [
    "FACTOR_RANGE",
    "fit_verdict_factors",
    "run_from_reports",
    "run_from_verdicts",
    "write_profile",
]


def run_from_reports(args: argparse.Namespace) -> int:
    reports = []
    for path in args.from_report:
        try:
            reports.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"cannot read the report {path!r}: {exc}") from None
    base = load_target_profile(args.base)
    scale, fitted = fit_kernel_factors(reports)
    factors = {f.key: float(f"{f.factor:.3g}") for f in fitted}
    name = args.name if args.name != "calibrated" else f"{base.name}-kernels"
    profile = base.model_copy(update={"name": name, "kernel_factors": factors})
    header = (
        f"The {base.name!r} profile with kernel factors learned by `autofusion calibrate "
        f"--from-report` from {len(reports)} profiled report(s); machine scale "
        f"(measured / roofline time of unfused nodes) {scale:.3g}."
    )
    path = Path(args.output)
    if not write_profile(path, profile, header):
        return EXIT_USAGE
    print(_table(path, scale, fitted))
    return EXIT_OK


def _table(path: Path, scale: float, fitted: list[FittedFactor]) -> str:
    lines = [
        f"autofusion calibrate: wrote {path}",
        f"  machine scale {scale:.3g} (unfused nodes: measured / roofline time)",
        f"  {'key':<28} {'factor':>8} {'regions':>8}   range",
    ]
    for f in fitted:
        lines.append(f"  {f.key:<28} {f.factor:8.3g} {f.regions:8d}   {f.low:.3g} .. {f.high:.3g}")
    return "\n".join(lines)


def write_profile(path: Path, profile: TargetProfile, header: str) -> bool:
    """Write ``profile`` as YAML after ``header``; False (said on stderr) if it cannot."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump_target_profile(profile, header=header), encoding="utf-8")
    except OSError as exc:
        sys.stderr.write(f"autofusion: error: cannot write {str(path)!r}: {exc.strerror}\n")
        return False
    return True


# A record's factor is clamped to this: one wild measurement (a tiny group on a noisy
# machine) must not price a rewriter out of every model, and the median keeps the rest.
FACTOR_RANGE = (0.05, 20.0)


def fit_verdict_factors(
    records: Iterable[VerdictRecord], base: Mapping[str, float] | None = None
) -> tuple[list[FittedFactor], int]:
    """One kernel factor per ``kernel_factors`` key from measured verdicts, and how many
    records were usable. A verdict's key is the one that priced every fusion of its group
    (``predicted.kernel_factor_key``: ``attention+softcap+cache``), else its rewriter.
    The fitted correction multiplies the factor the prediction was made with: the
    verdict's ``predicted.kernel_factor`` where it names one, else ``base`` (the
    profile's factors) for the key.

    A record holds the cost model's prediction for its group of fusions (``predicted``:
    ``before_us`` of the replaced nodes and ``after_us`` of the fused kernels, roofline
    priced, and the ``rewriter``) and what was measured: the model with the group ran
    ``with_ms`` at ``median`` times the model without it. The time it saved is
    ``with_ms * 1000 * (1 / median - 1)`` µs (negative when slower); assuming the profile
    prices the replaced nodes right (their measured time is ``before_us``), the fused
    kernels took ``before_us - saved`` and the correction that makes the prediction match
    is that over ``after_us``, clamped to ``FACTOR_RANGE``; times the factor ``after_us``
    was predicted with, it is the record's factor. Per key, the median."""
    base = base or {}
    by_key: dict[str, list[float]] = defaultdict(list)
    for record in records:
        found = _verdict_factor(record)
        if found is not None:
            key, correction, priced_with = found
            by_key[key].append(correction * (priced_with or base.get(key, 1.0)))
    fitted = [
        FittedFactor(name, statistics.median(values), len(values), min(values), max(values))
        for name, values in sorted(by_key.items())
    ]
    return fitted, sum(f.regions for f in fitted)


def _verdict_factor(record: VerdictRecord) -> tuple[str, float, float | None] | None:
    """The record's key, its correction of the prediction (clamped) and the factor the
    prediction was made with (None: not recorded); None when the record is not usable."""
    predicted = record.predicted or {}
    rewriter, before, after = (predicted.get(k) for k in ("rewriter", "before_us", "after_us"))
    numbers = (before, after, record.with_ms)
    if not isinstance(rewriter, str) or not rewriter:
        return None
    if not all(_positive(n) for n in numbers):
        return None
    key = predicted.get("kernel_factor_key")
    key = key if isinstance(key, str) and key else rewriter
    priced_with = predicted.get("kernel_factor")
    saved_us = record.with_ms * 1000.0 * (1.0 / record.ratio.median - 1.0)
    low, high = FACTOR_RANGE
    correction = min(max((before - saved_us) / after, low), high)
    return key, correction, float(priced_with) if _positive(priced_with) else None


def _positive(value: object) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def run_from_verdicts(args: argparse.Namespace) -> int:
    """``--from-verdicts FILE``: the base profile with the factors fitted from the export
    (the base's own factors kept for keys the verdicts do not name). A verdict that does
    not record the factor it was predicted with is taken to be the base profile's
    (``cpu``, the default, is what a job predicts with unless its config names another
    ``target_profile``)."""
    records = _read_exports(args.from_verdicts)
    if records is None:
        return EXIT_USAGE
    if args.machine_key:
        records = [r for r in records if r.machine_key == args.machine_key]
    try:
        base = load_target_profile(args.base)
    except FusionError as exc:
        return _usage(str(exc))
    fitted, used = fit_verdict_factors(records, base.kernel_factors)
    if not fitted:
        return _usage(
            f"no usable verdict in {', '.join(args.from_verdicts)}"
            + (f" on machine class {args.machine_key}" if args.machine_key else "")
            + ": each needs the model's time with its group (with_ms) and the cost model's "
            "prediction (predicted before_us, after_us and rewriter), which measured "
            "selection records; export them with `autofusion verdicts export`"
        )
    factors = {**base.kernel_factors, **{f.key: float(f"{f.factor:.3g}") for f in fitted}}
    name = args.name if args.name != "calibrated" else f"{base.name}-verdicts"
    profile = base.model_copy(update={"name": name, "kernel_factors": factors})
    classes = len({r.machine_key for r in records if _verdict_factor(r) is not None})
    header = (
        f"The {base.name!r} profile with kernel factors fitted by `autofusion calibrate "
        f"--from-verdicts` from {used} measured verdict(s) on {classes} machine class(es); "
        "it assumes that its roofline prices the replaced nodes right, and that verdicts "
        "which do not record their kernel factor were predicted with this profile."
    )
    path = Path(args.output)
    if not write_profile(path, profile, header):
        return EXIT_USAGE
    print(_verdict_table(path, used, classes, fitted))
    return EXIT_OK


def _read_exports(paths: list[str]) -> list[VerdictRecord] | None:
    records: list[VerdictRecord] = []
    for path in paths:
        try:
            found, skipped = read_verdicts(path)
        except OSError as exc:
            _usage(f"cannot read the verdicts file {path!r}: {exc.strerror or exc}")
            return None
        except (UnicodeDecodeError, ValueError) as exc:
            _usage(str(exc))
            return None
        if skipped:
            sys.stderr.write(
                f"autofusion: {path}: {len(skipped)} invalid verdict(s) left out "
                f"(first: {skipped[0]})\n"
            )
        records += found
    return records


def _usage(message: str) -> int:
    sys.stderr.write(f"autofusion: error: {message}\n")
    return EXIT_USAGE


def _verdict_table(path: Path, used: int, classes: int, fitted: list[FittedFactor]) -> str:
    lines = [
        f"autofusion calibrate: wrote {path}",
        f"  {used} verdict(s) with a prediction, {classes} machine class(es)",
        f"  {'key':<28} {'factor':>8} {'verdicts':>8}   range",
    ]
    for f in fitted:
        lines.append(f"  {f.key:<28} {f.factor:8.3g} {f.regions:8d}   {f.low:.3g} .. {f.high:.3g}")
    return "\n".join(lines)
