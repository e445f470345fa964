"""Whose upload slots an upload takes (issue 26, item 5): on a server without keys every
request is the default tenant, so slow uploads from one client held everyone's slots."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.uploads import IncomingBody, UploadSlots
from autofusion.app.services.uploads._receive import _slot_owner


async def _nothing() -> AsyncIterator[bytes]:
    yield b""


def _body(client: str | None) -> IncomingBody:
    return IncomingBody("multipart/form-data; boundary=x", None, _nothing(), None, client=client)


@pytest.mark.parametrize("client", ["10.0.0.1", "10.0.0.2"])
def test_an_anonymous_upload_takes_its_client_addresses_slots(tmp_path, client) -> None:
    settings = Settings(data_dir=tmp_path, require_api_keys=False)
    assert _slot_owner("default", _body(client), settings) == f"default@{client}"


def test_a_keyed_upload_takes_its_tenants_slots(tmp_path) -> None:
    keyed = Settings(data_dir=tmp_path, require_api_keys=True)
    assert _slot_owner("default", _body("10.0.0.1"), keyed) == "default"
    open_server = Settings(data_dir=tmp_path, require_api_keys=False)
    assert _slot_owner("alice", _body("10.0.0.1"), open_server) == "alice"


def test_one_clients_slow_uploads_leave_another_clients_slot_free(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path)
    slots = UploadSlots(total=16, per_tenant=1, retry_after_s=1)
    first, second = (_slot_owner("default", _body(c), settings) for c in ("10.0.0.1", "10.0.0.2"))
    with slots.hold(first):
        with pytest.raises(ProblemError) as busy, slots.hold(first):
            pass
        assert busy.value.status == 429
        with slots.hold(second):  # another client: its own slot
            assert slots.active == 2
