"""Registry snapshots, compiled once per registry version in each worker process.

A registry version names an immutable set of pattern specs (every change bumps the
version), so (database, version) is a perfect cache key: a job on an unchanged registry
costs one version lookup, and a pattern added, changed or disabled through the API gives
a new version that the next job compiles. Nothing needs a restart.

The sandboxed child receives the specs as JSON and compiles them itself (compiled
patterns hold code and do not cross a process boundary); the compiled copy here lets the
worker check a job's config against the snapshot before it starts a child at all.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from autofusion.app.services.registry import registry_version, snapshot
from autofusion.fusion_core import CompiledPattern, PatternError, compile_pattern

__all__ = ["CompiledSnapshot", "SnapshotCache", "default_cache"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompiledSnapshot:
    version: int
    specs: list[dict[str, Any]]
    compiled: list[CompiledPattern]
    # Patterns of the snapshot this fusion_core no longer compiles: left out, not fatal.
    skipped: dict[str, str] = field(default_factory=dict)


class SnapshotCache:
    """An LRU map ``(database, registry version) -> CompiledSnapshot``, thread-safe."""

    def __init__(self, maxsize: int = 8) -> None:
        self.maxsize = maxsize
        self._entries: OrderedDict[tuple[str, int], CompiledSnapshot] = OrderedDict()
        self._lock = threading.Lock()
        self.compilations = 0  # how many versions were compiled (for tests and metrics)

    def versions(self, session: Session) -> list[int]:
        """The registry versions cached for the session's database, oldest use first."""
        database = _database(session)
        with self._lock:
            return [version for db, version in self._entries if db == database]

    def get(self, session: Session, version: int | None = None) -> CompiledSnapshot:
        """The snapshot at ``version`` (default: the registry's version now)."""
        version = registry_version(session) if version is None else version
        key = (_database(session), version)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                return cached
        version, specs = snapshot(session, version)
        compiled = _compile(version, specs)
        with self._lock:
            self._entries[key] = compiled
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
            self.compilations += 1
        return compiled


def _database(session: Session) -> str:
    # Versions count from 1 in every database: a process that talks to several (tests,
    # a second deployment) must not mix their registries up.
    return session.get_bind().url.render_as_string(hide_password=True)


def _compile(version: int, specs: list[dict[str, Any]]) -> CompiledSnapshot:
    good_specs, compiled, skipped = [], [], {}
    for spec in specs:
        try:
            compiled.append(compile_pattern(spec))
        except PatternError as exc:
            # Validated when registered; failing now means fusion_core changed since.
            name = str(spec.get("name", "<unnamed>"))
            logger.warning("registry v%d: pattern %r no longer compiles: %s", version, name, exc)
            skipped[name] = str(exc)
            continue
        good_specs.append(spec)
    logger.info("compiled registry snapshot v%d: %d pattern(s)", version, len(compiled))
    return CompiledSnapshot(version, good_specs, compiled, skipped)


default_cache = SnapshotCache()
