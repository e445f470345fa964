"""What the pattern registry and the named strategies share: resources kept as a current
row plus immutable version rows, read with an ETag and changed by compare-and-swap.

Both tables have a ``name`` primary key and a ``version`` counter. The ETag is
``"name@version"``; a change must name the version it starts from (``If-Match``), and
the write is ``UPDATE ... WHERE name = :name AND version = :read``, so of two changes
sent with the same ETag one succeeds and the other is a 412. The problems they answer
(404, 409, 412, 428) are worded once here, with the resource's kind and path in them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import utcnow

__all__ = ["VersionedKind", "if_match_holds"]

T = TypeVar("T")


def if_match_holds(if_match: str | None, etag: str) -> bool:
    """RFC 9110 If-Match: absent, ``*``, or a list holding ``etag`` (strong comparison,
    so a weak ``W/`` tag never matches)."""
    if if_match is None:
        return True
    tags = [tag.strip() for tag in if_match.split(",")]
    return "*" in tags or etag in tags


@dataclass(frozen=True)
class VersionedKind:
    """One kind of versioned resource: its ORM class, its name in messages and its path."""

    model: type  # an ORM class with ``name`` (primary key), ``version`` and ``updated_at``
    kind: str  # "pattern", "strategy": how messages and problem slugs name it
    collection: str  # "/v1/patterns"

    def etag(self, row: Any) -> str:
        return f'"{row.name}@{row.version}"'

    def not_found(self, name: str) -> ProblemError:
        title, detail = f"{self.kind.capitalize()} not found", f"there is no {self.kind} {name!r}"
        return ProblemError(404, f"{self.kind}-not-found", title, detail)

    def exists(self, name: str) -> ProblemError:
        return ProblemError(
            409,
            f"{self.kind}-exists",
            f"{self.kind.capitalize()} exists",
            f"{self.kind} {name!r} already exists; PUT {self.collection}/{name} (with If-Match: "
            "the ETag from GET) changes it",
        )

    def stale(self, row: Any, if_match: str | None) -> ProblemError:
        return ProblemError(
            412,
            "precondition-failed",
            "Precondition failed",
            f"{self.kind} {row.name!r} changed since you read it (now {self.etag(row)}, "
            f"you sent If-Match {if_match}); GET it again and retry",
        )

    def check_if_match(self, row: Any, if_match: str | None, *, required: bool) -> None:
        """428 when a required If-Match is absent, 412 when it names another version."""
        if if_match is None and required:
            raise ProblemError(
                428,
                "precondition-required",
                "Precondition required",
                f"changing {self.kind} {row.name!r} needs an If-Match header: send the ETag "
                f"from GET {self.collection}/{row.name} (or '*' to overwrite whatever is there)",
            )
        if not if_match_holds(if_match, self.etag(row)):
            raise self.stale(row, if_match)

    def swap(self, session: Session, name: str, read: int, **values: Any) -> bool:
        """The compare-and-swap: False (nothing written) when the version moved on."""
        model = self.model
        result = session.execute(
            update(model)
            .where(model.name == name, model.version == read)
            .values(**values, version=read + 1, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )
        return result.rowcount == 1

    def write_after_read(
        self,
        session: Session,
        name: str,
        write: Callable[[Session], T | None],
        *,
        if_match: str | None = None,
        conflict: ProblemError | None = None,
    ) -> T:
        """Commit the read, run ``write`` in a transaction of its own, commit it.

        Why the read is ended first: on SQLite a read transaction that later writes fails
        with "database is locked" when another writer committed in between; a fresh
        transaction waits for the lock instead. ``write`` returns None for a lost swap: a
        412 naming the version there now. A duplicate key (a concurrent create, a version
        row someone wrote first) is ``conflict``, or a lost swap when that is None.
        """
        session.commit()
        try:
            result = write(session)
            if result is None:
                session.rollback()
                raise self.stale(self.reread(session, name), if_match)
            session.commit()
        except IntegrityError:
            session.rollback()
            raise (conflict or self.stale(self.reread(session, name), if_match)) from None
        except ProblemError:
            session.rollback()
            raise
        return result

    def write_current(self, session: Session, write: Callable[[Session], T]) -> T:
        """Commit the read, run ``write`` in a transaction of its own, commit it: for a
        change that names no version (it applies to the current one in one statement, so
        it has no race to lose and no 412). The read ends first as in ``write_after_read``.
        """
        session.commit()
        try:
            result = write(session)
            session.commit()
        except Exception:
            session.rollback()
            raise
        return result

    def reread(self, session: Session, name: str) -> Any:
        """The row as the database has it now (after a lost swap)."""
        return session.get(self.model, name, populate_existing=True)
