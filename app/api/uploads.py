"""A request's body as the upload code takes it (``app.services.uploads.IncomingBody``).

The services stream, check and store uploads without knowing what serves HTTP; this
module is the only place that reads a Starlette request for them: its two headers, its
body chunks (a client that leaves becomes ``ClientGone``), and the app's upload slots.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request

from autofusion.app.core.config import Settings
from autofusion.app.services.uploads import ClientGone, IncomingBody, UploadSlots

__all__ = ["incoming"]


def incoming(request: Request, settings: Settings) -> IncomingBody:
    return IncomingBody(
        content_type=request.headers.get("content-type"),
        content_length=request.headers.get("content-length"),
        chunks=_chunks(request),
        slots=_slots(request, settings),
        gone=request.is_disconnected,
        client=request.client.host if request.client else None,
    )


async def _chunks(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise ClientGone from None


def _slots(request: Request, settings: Settings) -> UploadSlots:
    """The app's slots (app/main.py sets them up); a request outside an app (a unit
    test) gets a set of its own."""
    state = getattr(request.scope.get("app"), "state", None)
    slots = getattr(state, "upload_slots", None)
    return slots if slots is not None else UploadSlots.from_settings(settings)
