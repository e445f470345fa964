"""Routes: what the registry learned from the verdict store. A pattern's measurements
per machine class, and disabling a pattern on one class (and enabling it again)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from autofusion.app.api.deps import PrincipalDep, SessionDep, SettingsDep, require_scope
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.pattern_rules import (
    MACHINE_KEY_PATTERN,
    PatternClassRuleCreate,
    PatternClassRulePublic,
    PatternClassRulesPublic,
    PatternClassVerdictsPublic,
    PatternVerdictsPublic,
)
from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services import pattern_class_rules as class_rules
from autofusion.app.services.auth import Principal
from autofusion.app.services.registry import pattern_history

__all__ = ["router"]

router = APIRouter(tags=["patterns"])

PatternWriter = Annotated[Principal, Depends(require_scope("patterns:write"))]
MachineKey = Annotated[
    str, Path(pattern=MACHINE_KEY_PATTERN, description="the machine class's sha256")
]


def _only(settings: Settings, principal: Principal) -> str | None:
    """Whose verdicts a tenant sees: everyone's, unless ``verdicts_shared`` is off."""
    return None if settings.verdicts_shared else principal.tenant_id


@router.get(
    "/v1/patterns/{name}/verdicts",
    response_model=PatternVerdictsPublic,
    responses=problem_responses(404),
    operation_id="getPatternVerdicts",
)
def read_pattern_verdicts(
    name: str, session: SessionDep, principal: PrincipalDep, settings: SettingsDep
) -> PatternVerdictsPublic:
    """How a pattern measured per machine class (faster, level, slower; combined), and
    the classes it is disabled on."""
    stats = class_rules.pattern_stats(
        session, name, tenant_id=principal.tenant_id, only_tenant=_only(settings, principal)
    )
    if not stats and not pattern_history(session, name):
        raise ProblemError(
            404,
            "pattern-not-found",
            "Pattern not found",
            f"there is no pattern {name!r} and no verdict of one; GET /v1/patterns lists them",
        )
    return PatternVerdictsPublic(
        pattern=name,
        classes=[PatternClassVerdictsPublic.from_stats(s, settings) for s in stats],
        rules=[
            PatternClassRulePublic.from_rule(r, settings) for r in class_rules.rules(session, name)
        ],
    )


@router.get(
    "/v1/pattern-rules",
    response_model=PatternClassRulesPublic,
    operation_id="listPatternRules",
)
def list_pattern_rules(
    session: SessionDep,
    _: PrincipalDep,
    settings: SettingsDep,
    pattern: Annotated[str | None, Query(max_length=200)] = None,
) -> PatternClassRulesPublic:
    """The patterns disabled per machine class (all, or one pattern's)."""
    found = class_rules.rules(session, pattern)
    return PatternClassRulesPublic(
        rules=[PatternClassRulePublic.from_rule(r, settings) for r in found]
    )


@router.post(
    "/v1/patterns/{name}/rules",
    status_code=201,
    response_model=PatternClassRulePublic,
    responses=problem_responses(404, 409, 422),
    operation_id="disablePatternOnClass",
)
def disable_pattern_on_class(
    name: str,
    body: PatternClassRuleCreate,
    session: SessionDep,
    principal: PatternWriter,
    settings: SettingsDep,
) -> PatternClassRulePublic:
    """Disable a pattern on one machine class, on the evidence of its verdicts there."""
    rule = class_rules.disable_on_class(
        session,
        name,
        body.machine_key,
        by=principal.label,
        reason=body.reason,
        only_tenant=_only(settings, principal),
    )
    public = PatternClassRulePublic.from_rule(rule, settings)
    session.commit()
    return public


@router.delete(
    "/v1/patterns/{name}/rules/{machine_key}",
    status_code=204,
    response_model=None,
    responses=problem_responses(404),
    operation_id="enablePatternOnClass",
)
def enable_pattern_on_class(
    name: str, machine_key: MachineKey, session: SessionDep, _: PatternWriter
) -> None:
    """Enable a pattern again on a machine class it was disabled on."""
    class_rules.enable_on_class(session, name, machine_key)
    session.commit()
