"""The ``autofusion`` command line.

Exit codes of `optimize` and `patterns` (stable, for scripts; `submit` has its own,
see `autofusion submit --help`):
  0 success
  1 the fused model failed the numerical check
  2 usage or config error (bad option, unknown pattern or target)
  3 the input model is missing, not ONNX, malformed or unsafe
  4 a pattern file is invalid
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app.cli import calibrate as calibrate_cmd
from app.cli import compare as compare_cmd
from app.cli import keys as keys_cmd
from app.cli import migrate as migrate_cmd
from app.cli import optimize as optimize_cmd
from app.cli import patterns as patterns_cmd
from app.cli import profile as profile_cmd
from app.cli import serve as serve_cmd
from app.cli import submit as submit_cmd
from app.cli import worker as worker_cmd
from app.cli._exit import EXIT_CONFIG, EXIT_MODEL, EXIT_PATTERN
from fusion_core.errors import (
    ConfigError,
    FusionError,
    ModelLoadError,
    PatternError,
    UnsafeModelError,
)

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autofusion",
        description="Automatic operator fusion for ONNX models.",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands_in_order = (
        optimize_cmd,
        compare_cmd,
        profile_cmd,
        calibrate_cmd,
        patterns_cmd,
        serve_cmd,
        worker_cmd,
        submit_cmd,
        keys_cmd,
        migrate_cmd,
    )
    for command in commands_in_order:
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ModelLoadError, UnsafeModelError) as exc:
        return _fail(exc, EXIT_MODEL)
    except PatternError as exc:
        return _fail(exc, EXIT_PATTERN)
    except ConfigError as exc:
        return _fail(exc, EXIT_CONFIG)
    except FusionError as exc:
        return _fail(exc, EXIT_CONFIG)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - must outlive this function
        return 0


def _fail(exc: FusionError, code: int) -> int:
    sys.stderr.write(f"autofusion: error: {exc}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
