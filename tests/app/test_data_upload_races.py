"""Data uploads under races: what a client that retries while the server still works on
its last request, or a part that went missing, may do to an upload.

A cut connection leaves the server's handler running: it keeps what arrived, while the
client, its HEAD answered before that handler listed the part, sends the same chunk
from the same offset again. Both requests then read the upload at one revision and may
hold byte-for-byte the same part. The loser is 409; the winner's part must stay, and
the rest of the file completes it. A part that is gone from the store anyway is a
409 that starts the file again from 0, never a 500 on every try after.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import AsyncIterator

import numpy as np
import pytest

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import DataUpload
from autofusion.app.services.uploads import ClientGone, IncomingBody, UploadSlots, receive_part
from tests.event_loops import run_coroutine

OCTETS = {"Content-Type": "application/offset+octet-stream"}


def _start(service, data: bytes) -> str:
    body = {"name": "w.data", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    response = service.client.post("/v1/uploads", json=body)
    assert response.status_code == 201, response.text
    return response.headers["Location"]


def _patch(service, location: str, offset: int, content: bytes):
    headers = {**OCTETS, "Upload-Offset": str(offset)}
    return service.client.patch(location, content=content, headers=headers)


def _parts(service, location: str) -> list[dict]:
    with service.db() as session:
        return list(session.get(DataUpload, location.rsplit("/", 1)[1]).parts)


def _send(service, location: str, chunks: AsyncIterator[bytes], length: int):
    """``receive_part`` at offset 0, as the route calls it, for a body of ``chunks``."""
    body = IncomingBody(
        OCTETS["Content-Type"], str(length), chunks, UploadSlots.from_settings(service.settings)
    )
    return receive_part(
        body,
        service.settings,
        service.app.state.store,
        tenant_id=service.settings.default_tenant,
        upload_id=location.rsplit("/", 1)[1],
        offset=0,
    )


async def _same_chunk_twice(service, location: str, chunk: bytes, length: int, cut: bool):
    """Two PATCHes of ``chunk`` at offset 0 that both read the upload before either lists
    its part; the first finishes first. Their outcomes (a result or the exception)."""
    second_read, first_done = asyncio.Event(), asyncio.Event()

    async def first_body() -> AsyncIterator[bytes]:
        await second_read.wait()  # both have read the row: one revision, one header
        yield chunk
        if cut:
            raise ClientGone

    async def second_body() -> AsyncIterator[bytes]:
        second_read.set()
        await first_done.wait()
        yield chunk
        if cut:
            raise ClientGone

    async def first():
        try:
            return await _send(service, location, first_body(), length)
        finally:
            first_done.set()

    second = _send(service, location, second_body(), length)
    return await asyncio.gather(first(), second, return_exceptions=True)


@pytest.mark.parametrize("cut", [True, False], ids=["both-cut", "both-whole"])
def test_the_same_chunk_twice_at_one_offset_keeps_the_winners_part(service, problem, cut):
    data = np.random.default_rng(7).bytes(3000)
    location = _start(service, data)
    chunk = data[:1000]
    # A cut body said the whole chunk and left after 1000 bytes; a whole one is 1000.
    length = 1500 if cut else 1000
    first, second = run_coroutine(_same_chunk_twice(service, location, chunk, length, cut))
    if cut:
        assert isinstance(first, ProblemError) and first.status == 400, first
    else:
        assert not isinstance(first, BaseException) and first.received == 1000, first
    assert isinstance(second, ProblemError), second
    assert (second.status, second.slug) == (409, "upload-offset-mismatch")
    assert second.headers["Upload-Offset"] == "1000"

    [part] = _parts(service, location)
    assert service.app.state.store.exists(part["digest"])  # the loser's drop spared it
    done = _patch(service, location, 1000, data[1000:])
    assert done.status_code == 200, done.text
    assert done.json()["digest"] == hashlib.sha256(data).hexdigest()
    assert service.app.state.store.read_bytes(done.json()["digest"]) == data


def test_a_part_gone_from_the_store_starts_the_file_again_with_a_409(service, problem):
    data = np.random.default_rng(8).bytes(2000)
    location = _start(service, data)
    assert _patch(service, location, 0, data[:700]).status_code == 204
    [part] = _parts(service, location)
    assert service.app.state.store.delete(part["digest"], stored_before=math.inf)

    lost = _patch(service, location, 700, data[700:])
    body = problem(lost, 409, "upload-parts-lost")
    assert lost.headers["Upload-Offset"] == "0" and body["offset"] == 0
    assert "from its start" in body["detail"]
    head = service.client.head(location)
    assert head.headers["Upload-Offset"] == "0" and _parts(service, location) == []
    again = _patch(service, location, 0, data)
    assert again.status_code == 200, again.text
    assert service.app.state.store.read_bytes(again.json()["digest"]) == data
    # Any later PATCH of the complete upload is 409 with its size, not a 500.
    late = _patch(service, location, 700, data[700:])
    assert problem(late, 409, "upload-offset-mismatch")["offset"] == len(data)


def test_a_patch_of_the_last_byte_twice_answers_the_complete_upload(service):
    """The client's retry of the last chunk (its first answer lost) reaches the server
    after the first completed it: 409 with the size, which the client reads as done."""
    data = np.random.default_rng(9).bytes(1500)
    location = _start(service, data)
    assert _patch(service, location, 0, data[:1000]).status_code == 204
    assert _patch(service, location, 1000, data[1000:]).status_code == 200
    retry = _patch(service, location, 1000, data[1000:])
    assert retry.status_code == 409 and retry.headers["Upload-Offset"] == str(len(data))
    empty = _patch(service, location, len(data), b"")
    assert empty.status_code == 200 and empty.json()["status"] == "complete"
    assert empty.json()["digest"] == hashlib.sha256(data).hexdigest()
