"""The ``autofusion`` command line.

Only the command being run is imported: ``autofusion --help``, ``--version`` and the
client commands (``submit``, ``jobs``, ``registry``, ``verdicts``) load no onnx,
onnxruntime or fusion engine (tests/app/test_cli_imports.py and, for ``verdicts``,
tests/app/test_verdicts_api.py hold them to it). A command's module is named in
``COMMANDS`` and imported by ``main`` once the command line names it. A command whose
extra is not installed (the base install is the client: ``autofusion[core]`` adds the
engine, ``autofusion[server]`` the service) says which one to install and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from autofusion.app.cli._exit import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    table_text,
)
from autofusion.app.cli._extras import is_missing_dependency, missing_extra

__all__ = ["COMMANDS", "build_parser", "main", "version"]

# name -> (module, one line for `autofusion --help`), in the order --help lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "optimize": (
        "autofusion.app.cli.optimize",
        "fuse a model and check the result (local, no server)",
    ),
    "compare": ("autofusion.app.cli.compare", "compare two models' outputs and shared tensors"),
    "profile": (
        "autofusion.app.cli.profile",
        "time a model, or an original against its fused model, in onnxruntime",
    ),
    "calibrate": (
        "autofusion.app.cli.calibrate",
        "measure this machine (onnxruntime, CPU): write a target profile for the cost model",
    ),
    "patterns": ("autofusion.app.cli.patterns", "list or check pattern files locally (no server)"),
    "serve": (
        "autofusion.app.cli.serve",
        "run the REST API and dashboard (embedded mode by default)",
    ),
    "worker": ("autofusion.app.cli.worker", "run a job worker (Celery) and the lease reaper"),
    "submit": (
        "autofusion.app.cli.submit",
        "send a model to an autofusion server, wait, download, gate (for CI)",
    ),
    "jobs": (
        "autofusion.app.cli.jobs",
        "follow jobs on a server: list, status, wait, cancel, download",
    ),
    "registry": (
        "autofusion.app.cli.registry",
        "the server's pattern registry and strategies: list, get, create, put, delete",
    ),
    "verdicts": (
        "autofusion.app.cli.verdicts",
        "the server's verdict store (what measured selection learned): list, export, import",
    ),
    "keys": (
        "autofusion.app.cli.keys",
        "create, list and revoke API keys (directly in the database)",
    ),
    "config": (
        "autofusion.app.cli.config",
        "print the settings a service here would run with, secrets masked",
    ),
    "migrate": (
        "autofusion.app.cli.migrate",
        "apply database migrations (and create the S3 bucket), then exit",
    ),
}

_EPILOG = f"""\
exit codes (the same in every command; docs/service.md, "Exit codes"):
{table_text()}

autofusion COMMAND --help shows a command's options."""


def version() -> str:
    """The installed package's version (its metadata), or a word saying there is none."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as metadata_version

    try:
        return metadata_version("autofusion")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _chosen(argv: Sequence[str]) -> str | None:
    """The command the arguments name: the first one that is not an option."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser. Given ``argv``, only the command it names has its options (the others
    are listed with their help line, their modules not imported); without, every one."""
    parser = argparse.ArgumentParser(
        prog="autofusion",
        description="Automatic operator fusion for ONNX models.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"autofusion {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv) if argv is not None else None
    for name, (module, help_line) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(module).add_parser(_Listed(commands, help_line))
        else:
            commands.add_parser(name, help=help_line, add_help=False)
    return parser


class _Listed:
    """The subparsers, handing each command its help line from ``COMMANDS``."""

    def __init__(self, commands: argparse._SubParsersAction, help_line: str) -> None:
        self.commands, self.help_line = commands, help_line

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.commands.add_parser(name, help=self.help_line, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except ModuleNotFoundError as exc:  # the command's module needs an extra
        return _missing_extra(_chosen(argv), exc)
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, as Unix tools do.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - must outlive this function
        return EXIT_OK
    except KeyboardInterrupt:
        sys.stderr.write("autofusion: interrupted\n")
        return EXIT_INTERRUPTED
    except MemoryError:
        sys.stderr.write(
            "autofusion: error: out of memory; try a machine with more memory, "
            "or --no-check to skip running the models\n"
        )
        return EXIT_INTERNAL
    except ModuleNotFoundError as exc:  # a command that imports its extra when it runs
        return _missing_extra(args.command, exc)
    except Exception as exc:
        return _known_error(exc)


def _missing_extra(command: str | None, exc: ModuleNotFoundError) -> int:
    """The extra to install, not a traceback; a module of autofusion missing is a bug."""
    if command is None or not is_missing_dependency(exc):
        return _internal_error(exc)
    sys.stderr.write(missing_extra(command, exc) + "\n")
    return EXIT_USAGE


def _known_error(exc: Exception) -> int:
    """A user's error of the core's vocabulary: one line and its code; else a bug."""
    from autofusion.fusion_core.errors import (
        FusionError,
        ModelLoadError,
        PatternError,
        UnsafeModelError,
    )

    if isinstance(exc, ModelLoadError | UnsafeModelError | PatternError):
        return _fail(exc, EXIT_BAD_INPUT)
    if isinstance(exc, FusionError):  # ConfigError and the rest: the options asked for it
        return _fail(exc, EXIT_USAGE)
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


def _fail(exc: Exception, code: int) -> int:
    sys.stderr.write(f"autofusion: error: {exc}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
