"""The pattern registry: patterns as rows, every change a new immutable version.

Each change bumps the registry version (one row in ``registry_state``) and records the
pattern's new state in ``pattern_versions`` stamped with that version. A snapshot at
version V (what a job used) is, for each pattern, its latest row at or before V: jobs
are reproducible, and a change applies to the next job without restarting anything.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from app.core.errors import ProblemError
from app.core.models import PatternRecord, PatternVersion, RegistryState, utcnow
from fusion_core import compile_pattern
from fusion_core.catalog import builtin_pattern_data

__all__ = [
    "change_pattern",
    "create_pattern",
    "etag_of",
    "get_pattern",
    "get_pattern_version",
    "if_match_holds",
    "list_patterns",
    "pattern_history",
    "precondition_required",
    "registry_version",
    "seed_builtins",
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


def etag_of(record: PatternRecord) -> str:
    return f'"{record.name}@{record.version}"'


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


def seed_builtins(session: Session) -> int:
    """Insert the built-in patterns once (the first start of an empty registry)."""
    if session.scalar(select(func.count()).select_from(PatternRecord)):
        return 0
    raws = builtin_pattern_data()
    version = _bump(session)
    for raw in raws:
        record = PatternRecord(
            name=raw["name"], version=1, spec=raw, builtin=True, enabled=True, deleted=False
        )
        session.add(record)
        _record_version(session, record, "create", version, "builtin")
    session.commit()
    return len(raws)


def _validated(spec: dict[str, Any]) -> dict[str, Any]:
    compile_pattern(spec)  # raises PatternError naming the field: 422 problem+json
    return spec


def get_pattern(session: Session, name: str, *, include_deleted: bool = False) -> PatternRecord:
    record = session.get(PatternRecord, name)
    if record is None or (record.deleted and not include_deleted):
        raise ProblemError(
            404, "pattern-not-found", "Pattern not found", f"there is no pattern {name!r}"
        )
    return record


def _exists(name: str) -> ProblemError:
    return ProblemError(
        409,
        "pattern-exists",
        "Pattern exists",
        f"pattern {name!r} already exists; PUT /v1/patterns/{name} (with If-Match: the ETag "
        "from GET) changes it",
    )


def create_pattern(session: Session, spec: dict[str, Any], actor: str | None) -> PatternRecord:
    """A new pattern (or one re-created after a delete). Of two concurrent creates of one
    name, one succeeds and the other is a 409: the primary key (or the swap) decides."""
    name = spec.get("name")
    existing = session.get(PatternRecord, name) if isinstance(name, str) else None
    if existing is not None and not existing.deleted:
        raise _exists(name)
    spec = _validated(spec)
    session.commit()  # end the read: the write below starts its own transaction
    try:
        if existing is None:
            record = PatternRecord(name=name, version=1, spec=spec, enabled=True, deleted=False)
            session.add(record)
            session.flush()  # the INSERT: a concurrent create of this name fails here
        else:  # re-created after a delete: its history continues
            record = existing
            if not _swap(session, record, spec=spec, enabled=True, deleted=False):
                raise _exists(name)
        _record_version(session, record, "create", _bump(session), actor)
        session.commit()
    except IntegrityError:
        session.rollback()
        raise _exists(name) from None
    except ProblemError:
        session.rollback()
        raise
    return record


def _swap(session: Session, record: PatternRecord, **values: Any) -> bool:
    """Compare-and-swap: ``UPDATE ... WHERE name = :name AND version = :read``, with the
    version moved on by one. False (nothing written) when someone changed the pattern
    since ``record`` was read; then ``record`` holds the new values, unflushed."""
    read = record.version
    result = session.execute(
        update(PatternRecord)
        .where(PatternRecord.name == record.name, PatternRecord.version == read)
        .values(**values, version=read + 1, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        return False
    for key, value in {**values, "version": read + 1}.items():
        set_committed_value(record, key, value)
    return True


def list_patterns(session: Session) -> list[PatternRecord]:
    """Every pattern that is not deleted, enabled or not, by name."""
    query = select(PatternRecord).where(PatternRecord.deleted.is_(False))
    return list(session.scalars(query.order_by(PatternRecord.name)))


def if_match_holds(if_match: str | None, etag: str) -> bool:
    """RFC 9110 If-Match: absent, ``*``, or a list holding ``etag`` (strong comparison,
    so a weak ``W/`` tag never matches)."""
    if if_match is None:
        return True
    tags = [tag.strip() for tag in if_match.split(",")]
    return "*" in tags or etag in tags


def precondition_required(kind: str, name: str, path: str) -> ProblemError:
    """428: a change of a versioned resource must say which version it started from."""
    return ProblemError(
        428,
        "precondition-required",
        "Precondition required",
        f"changing {kind} {name!r} needs an If-Match header: send the ETag from "
        f"GET {path} (or '*' to overwrite whatever is there)",
    )


def _stale(record: PatternRecord, if_match: str | None) -> ProblemError:
    return ProblemError(
        412,
        "precondition-failed",
        "Precondition failed",
        f"pattern {record.name!r} changed since you read it (now {etag_of(record)}, "
        f"you sent If-Match {if_match}); GET it again and retry",
    )


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
    disabling a disabled one) changes nothing and makes no new version.
    """
    record = get_pattern(session, name)
    if if_match is None and change in _NEEDS_IF_MATCH:
        raise precondition_required("pattern", name, f"/v1/patterns/{name}")
    if not if_match_holds(if_match, etag_of(record)):
        raise _stale(record, if_match)
    if change in ("enable", "disable") and record.enabled == (change == "enable"):
        return record
    values = _change_values(name, change, spec)
    session.commit()  # end the read: the swap below starts its own transaction
    try:
        if not _swap(session, record, **values):
            session.rollback()
            raise _stale(session.get(PatternRecord, name, populate_existing=True), if_match)
        _record_version(session, record, change, _bump(session), actor)
        session.commit()
    except IntegrityError:  # a version row someone else wrote first: same as a lost swap
        session.rollback()
        raise _stale(session.get(PatternRecord, name, populate_existing=True), if_match) from None
    return record


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
