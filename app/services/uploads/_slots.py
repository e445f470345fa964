"""How many uploads stream at once in this process, in all and per tenant: a 429 with
Retry-After beyond ``max_concurrent_uploads`` or ``max_concurrent_uploads_per_tenant``."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError

__all__ = ["UploadSlots"]


class UploadSlots:
    """How many uploads stream at once in this process, in all and per tenant."""

    def __init__(self, total: int, per_tenant: int, retry_after_s: int) -> None:
        self.total, self.per_tenant, self.retry_after_s = total, per_tenant, retry_after_s
        self._lock = threading.Lock()
        self._active = 0
        self._by_tenant: Counter[str] = Counter()

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadSlots:
        return cls(
            settings.max_concurrent_uploads,
            settings.max_concurrent_uploads_per_tenant,
            settings.retry_after_s,
        )

    @property
    def active(self) -> int:
        return self._active

    @contextmanager
    def hold(self, tenant: str | None) -> Iterator[None]:
        """One slot for the block; 429 at once when none is free."""
        with self._lock:
            if self._active >= self.total:
                raise self._busy(
                    f"{self._active} uploads are in progress, this server's limit "
                    "(max_concurrent_uploads)"
                )
            if tenant is not None and self._by_tenant[tenant] >= self.per_tenant:
                raise self._busy(
                    f"this tenant has {self.per_tenant} uploads in progress, the limit per "
                    "tenant (max_concurrent_uploads_per_tenant)"
                )
            self._active += 1
            if tenant is not None:
                self._by_tenant[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if tenant is not None:
                    self._by_tenant[tenant] -= 1
                    if self._by_tenant[tenant] <= 0:
                        del self._by_tenant[tenant]

    def _busy(self, detail: str) -> ProblemError:
        return ProblemError(
            429,
            "too-many-uploads",
            "Too many uploads",
            f"{detail}; retry in {self.retry_after_s} s",
            headers={"Retry-After": str(self.retry_after_s)},
        )
