"""The ``autofusion`` command line.

Exit codes of `optimize` and `patterns` (stable, for scripts; `submit` has its own,
see `autofusion submit --help`):
  0 success
  1 the fused model failed the numerical check
  2 usage or config error (bad option, unknown pattern or target)
  3 the input model is missing, not ONNX, malformed or unsafe
  4 a pattern file is invalid
  5 an internal error (a bug in autofusion; AUTOFUSION_DEBUG=1 shows the traceback)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

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
from app.cli._exit import EXIT_CONFIG, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_MODEL, EXIT_PATTERN
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
    except KeyboardInterrupt:
        sys.stderr.write("autofusion: interrupted\n")
        return EXIT_INTERRUPTED
    except MemoryError:
        sys.stderr.write(
            "autofusion: error: out of memory; try a machine with more memory, "
            "or --no-check to skip running the models\n"
        )
        return EXIT_INTERNAL
    except Exception as exc:  # a bug of ours: one line for the user, the traceback on request
        return _internal_error(exc)


def _internal_error(exc: BaseException) -> int:
    """An unexpected error: one line that says what to do, the traceback only on request."""
    if os.environ.get("AUTOFUSION_DEBUG"):
        traceback.print_exception(exc)
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    place = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    sys.stderr.write(
        f"autofusion: internal error: {type(exc).__name__}{place}: {message}\n"
        "autofusion: this is a bug in autofusion, not in your model or options; please "
        "report it with the model (set AUTOFUSION_DEBUG=1 for the traceback)\n"
    )
    return EXIT_INTERNAL


def _fail(exc: FusionError, code: int) -> int:
    sys.stderr.write(f"autofusion: error: {exc}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
