"""A quiet start (issue 27): `autofusion serve` says where it serves, the database, the
queue and the workers in a few lines at the default level; the libraries' start and stop
noise (Alembic's plugins and migrations, uvicorn's lifecycle, kombu's host warning) only at
debug level."""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path

import pytest

from autofusion.app.core.logs import configure_logging
from tests.serve_process import free_port, serving

REPO = Path(__file__).resolve().parents[2]
MOST_START_LINES = 6  # the bound: URL, database, broker, workers


def _start_lines(log: str) -> list[str]:
    """The lines before the first one of the stop (uvicorn's 'Shutting down')."""
    lines = [line for line in log.splitlines() if line.strip()]
    stop = next((i for i, line in enumerate(lines) if "Shutting down" in line), len(lines))
    return lines[:stop]


@pytest.mark.slow
def test_serve_starts_in_a_few_lines(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOFUSION_")}
    env = {**clean, "AUTOFUSION_LOG_FORMAT": "text"}
    log = tmp_path / "serve.log"
    port = free_port()
    main = "import sys; from autofusion.app.cli import main; sys.exit(main())"
    cli = [sys.executable, "-c", main]
    command = [*cli, "serve", "--port", port, "--data-dir", tmp_path / "data"]
    with serving(command, env=env, cwd=REPO, log=log):
        pass  # /healthz answered: the migrations ran and the embedded worker started
    lines = _start_lines(log.read_text(encoding="utf-8"))
    assert len(lines) <= MOST_START_LINES, "\n".join(lines)
    text = "\n".join(lines)
    assert f"http://127.0.0.1:{port}" in text
    assert "database: schema migrated from empty to" in text
    for noise in ("alembic", "Uvicorn running", "No hostname", "Running upgrade"):
        assert noise not in text, text


@pytest.mark.parametrize(
    ("level", "passes"),
    [("INFO", False), ("DEBUG", True)],
)
def test_library_noise_shows_at_debug_level_only(level: str, passes: bool) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    # Other tests of this process ran uvicorn and Alembic, which set their loggers' own
    # levels, disabled them or stopped their propagation (uvicorn's default config):
    # let every record reach the root, as in a fresh process.
    names = ["alembic.runtime.migration", "uvicorn.error", "kombu.connection"]
    chain = {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}
    named = [logging.getLogger(n) for n in sorted(chain)]
    kept = [(logger, logger.level, logger.disabled, logger.propagate) for logger in named]
    for logger in named:
        logger.setLevel(logging.NOTSET)
        logger.disabled, logger.propagate = False, True
    try:
        configure_logging(level, "text", stream)
        logging.getLogger("alembic.runtime.migration").info("Running upgrade 0001 -> 0002")
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)
        logging.getLogger("kombu.connection").warning("No hostname was supplied. Reverting")
        # never dropped: an Alembic warning, and uvicorn's other lines
        logging.getLogger("alembic.runtime.migration").warning("a real problem")
        logging.getLogger("uvicorn.error").info("Shutting down")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for logger, level, disabled, propagate in kept:
            logger.setLevel(level)
            logger.disabled, logger.propagate = disabled, propagate
    out = stream.getvalue()
    for noise in ("Running upgrade", "Started server process", "No hostname"):
        assert (noise in out) is passes, out
    assert "a real problem" in out and "Shutting down" in out
