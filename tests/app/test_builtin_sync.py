"""The registry's built-ins follow the release (``app.services.registry.sync_builtins``).

A service that ran an older release keeps its database: on start the patterns the new
release adds must reach it, the built-ins only releases have written must take the new
release's spec, and those it no longer ships must go, while a user's update or delete of
a built-in stays theirs. Releases
are simulated by replacing ``builtin_pattern_data`` with an edited copy of today's.
"""

from __future__ import annotations

import copy

import pytest
from sqlalchemy import select

from autofusion.app.core.db import session_scope
from autofusion.app.core.models import PatternRecord, PatternVersion
from autofusion.app.migrate import upgrade
from autofusion.app.services import registry
from autofusion.app.services.registry import (
    BUILTIN_ACTOR,
    change_pattern,
    registry_version,
    snapshot,
    sync_builtins,
)
from autofusion.fusion_core.catalog import builtin_pattern_data

NEW = "attention_packed_merged"  # the pattern the "older release" did not have
EDITED = "silu"  # the pattern whose spec the "new release" changes


@pytest.fixture
def url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade(url)
    return url


def release(monkeypatch, raws: list[dict]) -> None:
    monkeypatch.setattr(registry, "builtin_pattern_data", lambda: copy.deepcopy(raws))


def older() -> list[dict]:
    return [raw for raw in builtin_pattern_data() if raw["name"] != NEW]


def newer() -> list[dict]:
    raws = builtin_pattern_data()
    (edited,) = [raw for raw in raws if raw["name"] == EDITED]
    edited["description"] = "the next release's description"
    return raws


def sync(url: str) -> tuple[int, int, int]:
    with session_scope(url) as session:
        return sync_builtins(session)


def record(url: str, name: str) -> tuple[PatternRecord, list[PatternVersion]]:
    with session_scope(url) as session:
        found = session.get(PatternRecord, name)
        history = session.scalars(
            select(PatternVersion).where(PatternVersion.name == name).order_by("version")
        ).all()
        session.expunge_all()
        return found, list(history)


def test_an_empty_registry_gets_every_builtin_in_one_version(url):
    assert sync(url) == (len(builtin_pattern_data()), 0, 0)
    with session_scope(url) as session:
        assert registry_version(session) == 1
        names = {spec["name"] for spec in snapshot(session, 1)[1]}
    assert names == {raw["name"] for raw in builtin_pattern_data()}
    found, history = record(url, EDITED)
    assert found.builtin and [(v.change, v.created_by) for v in history] == [
        ("create", BUILTIN_ACTOR)
    ]


def test_an_upgrade_adds_the_new_builtins_and_updates_unedited_ones(url, monkeypatch):
    release(monkeypatch, older())
    sync(url)
    release(monkeypatch, newer())
    assert sync(url) == (1, 1, 0)
    with session_scope(url) as session:
        assert registry_version(session) == 2
        specs = {spec["name"]: spec for spec in snapshot(session, 2)[1]}
    assert NEW in specs
    assert specs[EDITED]["description"] == "the next release's description"
    found, history = record(url, EDITED)
    assert found.version == 2
    assert [(v.change, v.created_by, v.registry_version) for v in history][-1] == (
        "update",
        BUILTIN_ACTOR,
        2,
    )
    # the job that ran on version 1 still reproduces with the older spec
    with session_scope(url) as session:
        (old,) = [s for s in snapshot(session, 1)[1] if s["name"] == EDITED]
    assert old["description"] != "the next release's description"


def test_a_second_start_of_the_same_release_changes_nothing(url):
    sync(url)
    assert sync(url) == (0, 0, 0)
    with session_scope(url) as session:
        assert registry_version(session) == 1


def test_a_builtin_a_user_updated_stays_theirs(url, monkeypatch):
    release(monkeypatch, older())
    sync(url)
    with session_scope(url) as session:
        current = session.get(PatternRecord, EDITED)
        spec = {**current.spec, "description": "ours"}
        etag = registry.etag_of(current)
        change_pattern(session, EDITED, "update", spec=spec, if_match=etag, actor="alice")
    release(monkeypatch, newer())
    assert sync(url) == (1, 0, 0)
    found, history = record(url, EDITED)
    assert found.spec["description"] == "ours"
    assert [v.created_by for v in history] == [BUILTIN_ACTOR, "alice"]


def test_a_deleted_builtin_is_not_brought_back_and_a_disabled_one_stays_off(url, monkeypatch):
    release(monkeypatch, older())
    sync(url)
    with session_scope(url) as session:
        gone = session.get(PatternRecord, "hard_swish")
        change_pattern(session, "hard_swish", "delete", if_match=registry.etag_of(gone))
        change_pattern(session, EDITED, "disable")
    release(monkeypatch, newer())
    assert sync(url) == (1, 1, 0)
    deleted, _ = record(url, "hard_swish")
    assert deleted.deleted
    disabled, history = record(url, EDITED)
    assert not disabled.enabled
    assert disabled.spec["description"] == "the next release's description"
    assert [v.change for v in history] == ["create", "disable", "update"]


def test_a_restarted_service_lists_the_new_builtin(make_service, tmp_path, monkeypatch):
    shared = {"database_url": f"sqlite:///{tmp_path / 'shared.db'}"}
    release(monkeypatch, older())
    first = make_service(**shared)
    assert first.client.get(f"/v1/patterns/{NEW}").status_code == 404
    release(monkeypatch, newer())
    second = make_service(**shared)
    response = second.client.get(f"/v1/patterns/{NEW}")
    assert response.status_code == 200, response.text
    assert response.json()["builtin"] is True


def test_a_builtin_the_release_no_longer_ships_is_retired_and_can_come_back(url, monkeypatch):
    """The canonical form made some spellings' patterns dead (attention_mha_unscaled):
    a registry upgraded from the release that had them must not keep serving them."""
    release(monkeypatch, builtin_pattern_data())
    sync(url)
    release(monkeypatch, older())  # NEW is gone from this release
    assert sync(url) == (0, 0, 1)
    gone, history = record(url, NEW)
    assert gone.deleted
    assert [(v.change, v.created_by) for v in history][-1] == ("delete", BUILTIN_ACTOR)
    with session_scope(url) as session:
        assert NEW not in {p.name for p in registry.list_patterns(session)}
    assert sync(url) == (0, 0, 0)
    release(monkeypatch, builtin_pattern_data())  # a later release ships it again
    assert sync(url) == (1, 0, 0)
    back, history = record(url, NEW)
    assert not back.deleted and history[-1].change == "create"


def test_a_builtin_a_user_edited_or_deleted_is_not_retired_or_revived(url, monkeypatch):
    release(monkeypatch, builtin_pattern_data())
    sync(url)
    with session_scope(url) as session:
        current = session.get(PatternRecord, NEW)
        spec = {**current.spec, "description": "ours"}
        change_pattern(session, NEW, "update", spec=spec, if_match=registry.etag_of(current))
        gone = session.get(PatternRecord, "hard_swish")
        change_pattern(session, "hard_swish", "delete", if_match=registry.etag_of(gone))
    release(monkeypatch, older())
    assert sync(url) == (0, 0, 0)
    kept, _ = record(url, NEW)
    assert not kept.deleted and kept.spec["description"] == "ours"
    release(monkeypatch, builtin_pattern_data())
    assert sync(url) == (0, 0, 0)
    deleted, _ = record(url, "hard_swish")
    assert deleted.deleted
