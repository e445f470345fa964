"""Schema of ``GET /v1/info``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from autofusion.app.services.server_info import ServerInfo

__all__ = ["ServerInfoPublic"]


class ServerInfoPublic(BaseModel):
    """What a job submitted now would run with: a client keys its reuse on these."""

    version: str = Field(description="The server's version (the autofusion package's).")
    registry_version: int = Field(
        description="The pattern registry's snapshot: bumped by every pattern change."
    )
    strategies: dict[str, int] = Field(
        description="Each named strategy's current version, by name."
    )

    @classmethod
    def from_info(cls, info: ServerInfo) -> ServerInfoPublic:
        return cls(
            version=info.version,
            registry_version=info.registry_version,
            strategies=dict(info.strategies),
        )
