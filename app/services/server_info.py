"""What a client learns of this server before it uploads (``GET /v1/info``): the
server's version, the registry snapshot and each named strategy's version a job made now
would use. ``autofusion submit`` puts them in its Idempotency-Key, so an earlier job is
reused only while all three are what it ran with (docs/service.md, "Honest reuse")."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from sqlalchemy.orm import Session

from autofusion.app.services.registry import registry_version
from autofusion.app.services.strategies import list_strategies

__all__ = ["ServerInfo", "server_info", "server_version"]


def server_version() -> str:
    """The installed package's version; "unknown" in a checkout that was not installed."""
    try:
        return version("autofusion")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ServerInfo:
    version: str
    registry_version: int
    strategies: dict[str, int]  # name -> version


def server_info(session: Session) -> ServerInfo:
    """Two small reads: the registry's version row and the strategies' names."""
    return ServerInfo(
        version=server_version(),
        registry_version=registry_version(session),
        strategies={s.name: s.version for s in list_strategies(session)},
    )
