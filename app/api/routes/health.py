"""Routes: liveness (``/healthz``) and readiness (``/readyz``). No auth: probes call them."""

from __future__ import annotations

from fastapi import APIRouter, Request

from autofusion.app.api.deps import SettingsDep
from autofusion.app.api.problems import ProblemError, problem_responses
from autofusion.app.api.schemas.health import HealthPublic, ReadinessPublic
from autofusion.app.services.health import readiness

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthPublic, operation_id="getHealth")
def healthz() -> HealthPublic:
    """The process is up and answering."""
    return HealthPublic()


@router.get(
    "/readyz",
    response_model=ReadinessPublic,
    operation_id="getReadiness",
    responses=problem_responses(503),
)
def readyz(request: Request, settings: SettingsDep) -> ReadinessPublic:
    """Database, broker and artifact store reachable, a worker alive (503 problem if not)."""
    results = readiness(settings, getattr(request.app.state, "local_worker", None))
    failures = {name: reason for name, reason in results.items() if reason is not None}
    if failures:
        raise ProblemError(
            503,
            "not-ready",
            "Not ready",
            "; ".join(failures.values()),
            checks={name: reason or "ok" for name, reason in results.items()},
        )
    return ReadinessPublic(checks=dict.fromkeys(results, "ok"))
