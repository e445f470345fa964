"""``autofusion calibrate --from-report``: learn the kernel factors of a target profile
from profiled reports (``fusion_core.cost.fit`` says how) and write the base profile
with them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.fusion_core.cost import TargetProfile, dump_target_profile, load_target_profile
from autofusion.fusion_core.cost.fit import FittedFactor, fit_kernel_factors
from autofusion.fusion_core.errors import ConfigError

__all__ = ["run_from_reports", "write_profile"]


def run_from_reports(args: argparse.Namespace) -> int:
    reports = []
    for path in args.from_report:
        try:
            reports.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ConfigError(f"cannot read the report {path!r}: {exc}") from None
    base = load_target_profile(args.base)
    scale, fitted = fit_kernel_factors(reports)
    factors = {f.rewriter: float(f"{f.factor:.3g}") for f in fitted}
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
        f"  {'rewriter':<28} {'factor':>8} {'regions':>8}   range",
    ]
    for f in fitted:
        lines.append(
            f"  {f.rewriter:<28} {f.factor:8.3g} {f.regions:8d}   {f.low:.3g} .. {f.high:.3g}"
        )
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
