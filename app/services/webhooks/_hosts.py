"""Which callback URLs the service may call: http(s), no credentials in the URL, and a
host the operator allows (``webhook_allowed_hosts``). Checked when a job names a URL (a
422 saying what to do) and again before each delivery (the setting may have changed)."""

from __future__ import annotations

from urllib.parse import urlsplit

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError

__all__ = ["MAX_URL_LENGTH", "callback_problem", "check_callback_url", "url_problem"]

MAX_URL_LENGTH = 2000
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _entry_matches(entry: str, host: str, port: int) -> bool:
    """``entry`` is ``name``, ``name:port`` or ``*.domain`` (its subdomains, any depth)."""
    parts = urlsplit("//" + entry)
    try:
        want_host, want_port = (parts.hostname or ""), parts.port
    except ValueError:  # a port that is not a number: matches nothing
        return False
    if want_port is not None and want_port != port:
        return False
    if want_host.startswith("*."):
        return host.endswith(want_host[1:])
    return host == want_host


def url_problem(url: str, allowed: list[str]) -> str | None:
    """Why the service will not call ``url``, or None when it may."""
    if not allowed:
        return (
            "webhooks are off on this server: its operator allows callback hosts with "
            "webhook_allowed_hosts (AUTOFUSION_WEBHOOK_ALLOWED_HOSTS)"
        )
    if len(url) > MAX_URL_LENGTH:
        return f"is {len(url)} characters long; at most {MAX_URL_LENGTH}"
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS:
        return f"must be an http or https URL, not {parts.scheme or 'one without a scheme'!r}"
    try:
        host, port = (parts.hostname or ""), parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError:
        return "has a port that is not a number"
    if not host:
        return "names no host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (user:password@): the payload is signed instead"
    if not any(_entry_matches(entry, host, port) for entry in allowed):
        return (
            f"host {host!r} (port {port}) is not one this server calls back: its operator "
            f"adds it to webhook_allowed_hosts (AUTOFUSION_WEBHOOK_ALLOWED_HOSTS), which "
            f"allows {', '.join(allowed)}"
        )
    return None


def callback_problem(
    field_name: str, url: str, settings: Settings, *, in_config: bool = True
) -> ProblemError | None:
    """The 422 for a callback URL the service will not call, naming ``field_name``: an
    invalid-config problem for a job's option, invalid-request for anything else."""
    why = url_problem(url, settings.webhook_allowed_hosts)
    if why is None:
        return None
    slug, title = (
        ("invalid-config", "Invalid config")
        if in_config
        else ("invalid-request", "Invalid request")
    )
    return ProblemError(
        422,
        slug,
        title,
        f"{field_name}: {why}",
        errors=[{"field": field_name, "message": why}],
    )


def check_callback_url(
    url: str | None, settings: Settings, field_name: str, *, in_config: bool = True
) -> None:
    """Raise the 422 of ``callback_problem``; None passes."""
    if url is None:
        return
    if problem := callback_problem(field_name, url, settings, in_config=in_config):
        raise problem
