"""What the client raises: one base class, and the server's refusals with the fields of
its problem+json document (RFC 9457), so a script branches on ``status`` or ``type``
rather than on words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "AutofusionError",
    "RequestRefused",
    "Unreachable",
    "UnexpectedResponse",
    "WaitTimeout",
]


class AutofusionError(Exception):
    """Anything the client could not do; the message says what and where."""


class Unreachable(AutofusionError):
    """The server could not be reached (after retries), or a download broke off."""


class UnexpectedResponse(AutofusionError):
    """The server answered with something other than a JSON object: not an autofusion
    server, or a proxy's error page."""

    def __init__(self, where: str, content_type: str) -> None:
        self.where, self.content_type = where, content_type
        super().__init__(
            f"the server answered {where} with something other than a JSON object "
            f"({content_type}): is the server's URL right?"
        )


class RequestRefused(AutofusionError):
    """The server answered an error status. The problem document's fields are attributes
    (``type``, ``title``, ``detail``, ``instance``; ``problem`` is the whole document,
    extensions such as ``errors`` included); a body that is not one leaves them empty."""

    def __init__(
        self, method: str, path: str, status: int, problem: Mapping[str, Any] | None, text: str
    ) -> None:
        self.method, self.path, self.status = method, path, status
        self.problem: dict[str, Any] = dict(problem or {})
        self.type = str(self.problem.get("type") or "")
        self.title = self.problem.get("title")
        self.detail = self.problem.get("detail")
        self.instance = self.problem.get("instance")
        if problem is not None:
            said = f"{self.title or 'error'}: {self.detail or ''}".rstrip(": ")
        else:
            said = text
        super().__init__(f"the server refused {method} {path} ({status}): {said}")

    @property
    def slug(self) -> str:
        """The problem type's last part (``invalid-config``, ``quota-exceeded``...)."""
        return self.type.rsplit("/", 1)[-1]


class WaitTimeout(AutofusionError):
    """The job was not final when the wait ran out; it goes on on the server."""

    def __init__(self, job: Mapping[str, Any], timeout: float, url: str) -> None:
        self.job, self.timeout, self.url = dict(job), timeout, url
        super().__init__(
            f"job {job.get('id')} is still {job.get('status')} after {timeout:g} s; "
            f"follow it at {url}"
        )
