"""The pattern page's machine classes: how the pattern measured on each (faster, level,
slower, the combined ratio and its interval, the jobs), the classes it is disabled on
(who, when, why, the evidence), and the buttons that disable it on a class or enable it
again (``app.services.pattern_class_rules``; the API's ``/v1/patterns/{name}/rules``)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Path
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from autofusion.app.api.deps import SessionDep, SettingsDep
from autofusion.app.api.schemas.pattern_rules import MACHINE_KEY_PATTERN
from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services import pattern_class_rules as class_rules
from autofusion.app.ui.common import UIPrincipal, require
from autofusion.fusion_core.profiling import SLOWER

__all__ = ["class_context", "router"]

router = APIRouter(prefix="/ui/patterns", include_in_schema=False)

MachineKey = Annotated[str, Path(pattern=MACHINE_KEY_PATTERN)]
ReasonField = Annotated[str, Form(max_length=2000)]
ANCHOR = "machine-classes"


def class_context(
    session: Session, name: str, tenant_id: str, settings: Settings
) -> dict[str, Any]:
    """The page's per-class table and rules (when an automatic one lapses); a reason to
    start from for each class. With ``verdicts_shared`` off, the tenant's own verdicts."""
    only = None if settings.verdicts_shared else tenant_id
    stats = class_rules.pattern_stats(session, name, tenant_id=tenant_id, only_tenant=only)
    rules = class_rules.rules(session, name)
    return {
        "class_stats": stats,
        "class_rules": rules,
        "rule_lapses": {
            rule.machine_key: lapses
            for rule in rules
            if (lapses := class_rules.lapses_at(rule, settings)) is not None
        },
        "suggested_reasons": {s.machine_key: _suggested_reason(s) for s in stats},
        "slower": SLOWER,
        "class_label": class_rules.class_label,
        "evidence_url": class_rules.evidence_url,
    }


def _suggested_reason(stats: class_rules.ClassStats) -> str:
    ratio = stats.combined.ratio
    return (
        f"{ratio.verdict} on this class: combined ratio {ratio.median:.3f} "
        f"({ratio.low:.3f}-{ratio.high:.3f}) over {stats.measurements} measurements "
        f"in {stats.jobs} jobs"
    )


@router.post("/{name}/classes/{machine_key}/disable")
def disable_on_class(
    name: str,
    machine_key: MachineKey,
    principal: UIPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    reason: ReasonField = "",
):
    """Disable the pattern on this machine class (it must have verdicts there)."""
    require(principal, "patterns:write")
    if not reason.strip():
        raise ProblemError(
            422,
            "invalid-request",
            "Invalid request",
            "say why the pattern is disabled on this class (the reason field): the next "
            "person who reads the rule needs it",
            field="reason",
        )
    only = None if settings.verdicts_shared else principal.tenant_id
    class_rules.disable_on_class(
        session, name, machine_key, by=principal.label, reason=reason.strip(), only_tenant=only
    )
    session.commit()
    return RedirectResponse(f"/ui/patterns/{quote(name, safe='')}#{ANCHOR}", status_code=303)


@router.post("/{name}/classes/{machine_key}/enable")
def enable_on_class(
    name: str, machine_key: MachineKey, principal: UIPrincipal, session: SessionDep
):
    """Enable the pattern again on this machine class (its rule is deleted)."""
    require(principal, "patterns:write")
    class_rules.enable_on_class(session, name, machine_key)
    session.commit()
    return RedirectResponse(f"/ui/patterns/{quote(name, safe='')}#{ANCHOR}", status_code=303)
