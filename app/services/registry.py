"""The pattern registry: patterns as rows, every change a new immutable version.

Each change bumps the registry version (one row in ``registry_state``) and records the
pattern's new state in ``pattern_versions`` stamped with that version. A snapshot at
version V (what a job used) is, for each pattern, its latest row at or before V: jobs
are reproducible, and a change applies to the next job without restarting anything.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import PatternRecord, PatternVersion, RegistryState, utcnow
from autofusion.app.services.versioned import VersionedKind
from autofusion.fusion_core import compile_pattern
from autofusion.fusion_core.catalog import builtin_pattern_data

__all__ = [
    "change_pattern",
    "create_pattern",
    "etag_of",
    "get_pattern",
    "get_pattern_version",
    "list_patterns",
    "pattern_history",
    "registry_version",
    "BuiltinSync",
    "sync_builtins",
    "snapshot",
]


def registry_version(session: Session) -> int:
    state = session.get(RegistryState, 1)
    return state.version if state is not None else 0


def _bump(session: Session) -> int:
    """The next registry version, incremented in the database (``version + 1`` in SQL,
    so two concurrent changes never read the same value and both write it back)."""
    bumped = session.execute(
        update(RegistryState)
        .where(RegistryState.id == 1)
        .values(version=RegistryState.version + 1)
        .returning(RegistryState.version)
        .execution_options(synchronize_session=False)
    ).scalar()
    if bumped is None:  # the first change of an empty registry
        session.add(RegistryState(id=1, version=1))
        session.flush()
        bumped = 1
    return bumped


PATTERNS = VersionedKind(PatternRecord, "pattern", "/v1/patterns")


def etag_of(record: PatternRecord) -> str:
    return PATTERNS.etag(record)


def _record_version(
    session: Session, record: PatternRecord, change: str, registry: int, actor: str | None
) -> None:
    record.updated_at = utcnow()
    session.add(
        PatternVersion(
            name=record.name,
            version=record.version,
            registry_version=registry,
            change=change,
            enabled=record.enabled,
            deleted=record.deleted,
            spec=record.spec,
            created_by=actor,
        )
    )
    session.flush()


# The actor of the versions a release writes: what tells its built-ins from a user's edit.
BUILTIN_ACTOR = "builtin"


class BuiltinSync(NamedTuple):
    """What one start's ``sync_builtins`` changed in the registry."""

    added: int
    updated: int
    retired: int


def sync_builtins(session: Session) -> BuiltinSync:
    """Bring the registry's built-ins to this release's.

    A built-in the registry has never had is inserted (the first start of an empty
    registry inserts them all), so an upgrade brings its new patterns to the service. A
    built-in whose spec only releases have written is updated to this release's; one a
    user has updated or deleted is theirs from then on and left as it is (a disable
    keeps the pattern disabled, with the new spec). A built-in this release no longer
    ships (its spelling now comes from the canonical form, or another pattern took it)
    is retired, deleted by the release, when only releases wrote its spec; a later
    release that ships it again brings it back. All of it is one registry version."""
    records = {r.name: r for r in session.scalars(select(PatternRecord))}
    authors = _spec_authors(session)
    released = {raw["name"]: json.loads(json.dumps(raw)) for raw in builtin_pattern_data()}
    added, updated, revived = [], [], []
    for name, spec in released.items():  # as the JSON column gives it back
        record = records.get(name)
        if record is None:
            added.append(spec)
        elif not (record.builtin and authors.get(name) == BUILTIN_ACTOR):
            continue  # a user's pattern of that name, or a built-in a user edited
        elif record.deleted and _retired(session, name):
            revived.append((record, spec))
        elif not record.deleted and record.spec != spec:
            updated.append((record, spec))
    retired = [
        record
        for name, record in records.items()
        if name not in released
        and record.builtin
        and not record.deleted
        and authors.get(name) == BUILTIN_ACTOR
    ]
    if not added and not updated and not revived and not retired:
        return BuiltinSync(0, 0, 0)
    version = _bump(session)
    for spec in added:
        record = PatternRecord(
            name=spec["name"], version=1, spec=spec, builtin=True, enabled=True, deleted=False
        )
        session.add(record)
        _record_version(session, record, "create", version, BUILTIN_ACTOR)
    changes = [(r, "update", {"spec": spec}) for r, spec in updated]
    changes += [(r, "create", {"spec": spec, "deleted": False}) for r, spec in revived]
    changes += [(r, "delete", {"deleted": True}) for r in retired]
    done: Counter[str] = Counter()
    for record, change, values in changes:
        if _swap(session, record, **values):
            _record_version(session, record, change, version, BUILTIN_ACTOR)
            done[change] += 1
    session.flush()
    return BuiltinSync(len(added) + done["create"], done["update"], done["delete"])


def _retired(session: Session, name: str) -> bool:
    """Whether the latest change of a deleted pattern was a release's retirement (not a
    user's delete, which stays theirs)."""
    latest = session.scalars(
        select(PatternVersion)
        .where(PatternVersion.name == name)
        .order_by(PatternVersion.version.desc())
        .limit(1)
    ).first()
    return latest is not None and latest.change == "delete" and latest.created_by == BUILTIN_ACTOR


def _spec_authors(session: Session) -> dict[str, str | None]:
    """Who wrote each pattern's current spec: the actor of its latest create or update."""
    rows = session.execute(
        select(PatternVersion.name, PatternVersion.created_by)
        .where(PatternVersion.change.in_(("create", "update")))
        .order_by(PatternVersion.name, PatternVersion.version)
    )
    return {name: actor for name, actor in rows}  # the latest version of each wins


def _validated(spec: dict[str, Any]) -> dict[str, Any]:
    compile_pattern(spec)  # raises PatternError naming the field: 422 problem+json
    return spec


def get_pattern(session: Session, name: str, *, include_deleted: bool = False) -> PatternRecord:
    record = session.get(PatternRecord, name)
    if record is None or (record.deleted and not include_deleted):
        raise PATTERNS.not_found(name)
    return record


def create_pattern(session: Session, spec: dict[str, Any], actor: str | None) -> PatternRecord:
    """A new pattern (or one re-created after a delete). Of two concurrent creates of one
    name, one succeeds and the other is a 409: the primary key (or the swap) decides."""
    name = spec.get("name")
    existing = session.get(PatternRecord, name) if isinstance(name, str) else None
    if existing is not None and not existing.deleted:
        raise PATTERNS.exists(name)
    spec = _validated(spec)

    def write(session: Session) -> PatternRecord:
        if existing is None:
            record = PatternRecord(name=name, version=1, spec=spec, enabled=True, deleted=False)
            session.add(record)
            session.flush()  # the INSERT: a concurrent create of this name fails here
        else:  # re-created after a delete: its history continues
            record = existing
            if not _swap(session, record, spec=spec, enabled=True, deleted=False):
                raise PATTERNS.exists(name)
        _record_version(session, record, "create", _bump(session), actor)
        return record

    return PATTERNS.write_after_read(session, name, write, conflict=PATTERNS.exists(name))


def _swap(session: Session, record: PatternRecord, **values: Any) -> bool:
    """The compare-and-swap on the version ``record`` was read at; on success ``record``
    holds the new values."""
    read = record.version
    if not PATTERNS.swap(session, record.name, read, **values):
        return False
    for key, value in {**values, "version": read + 1}.items():
        set_committed_value(record, key, value)
    return True


def list_patterns(session: Session) -> list[PatternRecord]:
    """Every pattern that is not deleted, enabled or not, by name."""
    query = select(PatternRecord).where(PatternRecord.deleted.is_(False))
    return list(session.scalars(query.order_by(PatternRecord.name)))


# Changes that must name the version they start from (enable/disable set a state and
# are idempotent, so If-Match is honoured there but not required).
_NEEDS_IF_MATCH = ("update", "delete")


def change_pattern(
    session: Session,
    name: str,
    change: str,
    *,
    spec: dict[str, Any] | None = None,
    if_match: str | None = None,
    actor: str | None = None,
) -> PatternRecord:
    """Apply ``update`` (with ``spec``), ``enable``, ``disable`` or ``delete``.

    ``update`` and ``delete`` need ``if_match`` (428 without it). The write is a
    compare-and-swap on the version that was read and matched: of two changes sent with
    the same ETag, one succeeds and the other is a 412. Enabling an enabled pattern (or
    disabling a disabled one) changes nothing and makes no new version; without If-Match
    (or with ``*``) it applies to whatever version is current (``_set_state``).
    """
    record = get_pattern(session, name)
    PATTERNS.check_if_match(record, if_match, required=change in _NEEDS_IF_MATCH)
    if change in ("enable", "disable") and record.enabled == (change == "enable"):
        return record
    if change in ("enable", "disable") and (if_match is None or if_match.strip() == "*"):
        return _set_state(session, record, change, actor)
    values = _change_values(name, change, spec)

    def write(session: Session) -> PatternRecord | None:
        if not _swap(session, record, **values):
            return None
        _record_version(session, record, change, _bump(session), actor)
        return record

    return PATTERNS.write_after_read(session, name, write, if_match=if_match)


def _set_state(
    session: Session, record: PatternRecord, change: str, actor: str | None
) -> PatternRecord:
    """Enable or disable, naming no version: never a 412 (issue 26).

    The caller named no version, so a change someone committed since the read is no
    conflict. One conditional UPDATE (``WHERE enabled <> wanted``, ``version + 1`` in
    SQL) has nothing to lose a race to: the database orders concurrent writers on the row
    (PostgreSQL re-checks the condition on the row the other committed; SQLite has one
    writer at a time), and a writer that finds the state already set writes nothing.
    """
    wanted = change == "enable"

    def write(session: Session) -> PatternRecord | None:
        written = session.execute(
            update(PatternRecord)
            .where(
                PatternRecord.name == record.name,
                PatternRecord.deleted.is_(False),
                PatternRecord.enabled.is_not(wanted),
            )
            .values(enabled=wanted, version=PatternRecord.version + 1, updated_at=utcnow())
            .returning(PatternRecord.version, PatternRecord.spec)
            .execution_options(synchronize_session=False)
        ).first()
        if written is None:
            return None
        for key, value in {"enabled": wanted, "version": written[0], "spec": written[1]}.items():
            set_committed_value(record, key, value)
        _record_version(session, record, change, _bump(session), actor)
        return record

    changed = PATTERNS.write_current(session, write)
    if changed is None:  # already in that state, or deleted meanwhile (a 404)
        PATTERNS.reread(session, record.name)
        return get_pattern(session, record.name)
    return changed


def _change_values(name: str, change: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    if change == "update":
        assert spec is not None
        if spec.get("name") != name:
            raise ProblemError(
                422,
                "pattern-name-mismatch",
                "Name mismatch",
                f"the spec is named {spec.get('name')!r} but the URL names {name!r}",
            )
        return {"spec": _validated(spec)}
    if change in ("enable", "disable"):
        return {"enabled": change == "enable"}
    assert change == "delete", change
    return {"deleted": True}


def pattern_history(session: Session, name: str) -> list[PatternVersion]:
    get_pattern(session, name, include_deleted=True)
    return list(
        session.scalars(
            select(PatternVersion)
            .where(PatternVersion.name == name)
            .order_by(PatternVersion.version)
        )
    )


def get_pattern_version(session: Session, name: str, version: int) -> PatternVersion:
    get_pattern(session, name, include_deleted=True)
    row = session.scalars(
        select(PatternVersion).where(PatternVersion.name == name, PatternVersion.version == version)
    ).first()
    if row is None:
        raise ProblemError(
            404,
            "pattern-version-not-found",
            "Pattern version not found",
            f"pattern {name!r} has no version {version}; "
            f"GET /v1/patterns/{name}/versions lists them",
        )
    return row


def snapshot(session: Session, version: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """The enabled patterns' specs as of registry ``version`` (default: now)."""
    version = registry_version(session) if version is None else version
    latest = (
        select(PatternVersion.name, func.max(PatternVersion.version).label("version"))
        .where(PatternVersion.registry_version <= version)
        .group_by(PatternVersion.name)
        .subquery()
    )
    rows = session.scalars(
        select(PatternVersion)
        .join(
            latest,
            (PatternVersion.name == latest.c.name) & (PatternVersion.version == latest.c.version),
        )
        .order_by(PatternVersion.name)
    ).all()
    return version, [row.spec for row in rows if row.enabled and not row.deleted]
