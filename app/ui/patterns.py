"""Dashboard pages of the pattern registry: list (searched, grouped by family, with each
pattern's usage in the tenant's recent jobs), view (with history), create and edit as
YAML, enable/disable, and try a pattern on an uploaded model (no job is created)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import RedirectResponse
from markupsafe import Markup

from autofusion.app.api.deps import SessionDep, SettingsDep
from autofusion.app.api.schemas.registry import PatternSummary, PatternTestResult
from autofusion.app.api.uploads import incoming
from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import PatternRecord
from autofusion.app.services import registry
from autofusion.app.services.pattern_class_rules import rule_counts
from autofusion.app.services.pattern_trial import trial_upload
from autofusion.app.services.pattern_usage import pattern_usage
from autofusion.app.ui.common import UIPrincipal, form_errors, render, require
from autofusion.app.ui.pattern_classes import class_context
from autofusion.app.ui.pattern_list import family_of, family_slug, group_patterns
from autofusion.app.ui.report_view import MAX_MATCH_PICTURES
from autofusion.app.ui.yaml_forms import YamlEditor, dump_yaml, parse_yaml, version_etag
from autofusion.fusion_core.errors import FusionError

__all__ = ["router"]

router = APIRouter(prefix="/ui/patterns", include_in_schema=False)

YamlField = Annotated[str, Form(max_length=1 << 20)]
VersionField = Annotated[str | None, Form()]
_NEW_PATTERN = """\
name: acme.conv_relu
description: A Relu after a Conv, as one fused op.
priority: 10
targets: [generic, onnxruntime]
nodes:
  - {id: conv, op: Conv}
  - {id: act, op: Relu, inputs: {"0": conv}}
constraints:
  - {kind: attr, node: conv, name: group, eq: 1}
rewriter: {name: fused_region, params: {domain: ai.acme}}
"""


SearchQuery = Annotated[str, Query(max_length=200)]


@router.get("")
def patterns_page(
    request: Request, principal: UIPrincipal, session: SessionDep, q: SearchQuery = ""
):
    """Every pattern (deleted ones excluded) that matches ``q``, by family, with how often
    it fired in the tenant's recent jobs; htmx's live search asks for the results only."""
    records = registry.list_patterns(session)
    usage = pattern_usage(session, principal.tenant_id)
    groups = group_patterns(records, usage, q)
    context = {
        "groups": groups,
        "q": q,
        "shown": sum(len(g.rows) for g in groups),
        "total": len(records),
        "usage": usage,
        "registry_version": registry.registry_version(session),
        "disabled_classes": rule_counts(session),  # issue 28: disabled on some class
    }
    live = request.headers.get("hx-request") and request.headers.get("hx-target") == "results"
    return render(request, "_pattern_results.html" if live else "patterns.html", context)


EDITOR = YamlEditor(
    "/ui/patterns", "pattern_form.html", ("pattern-exists", "pattern-name-mismatch")
)


@router.get("/new")
def new_pattern_page(request: Request, principal: UIPrincipal):
    """An empty form (an example to start from)."""
    return EDITOR.new_form(request, _NEW_PATTERN)


@router.post("/new")
def create_pattern(request: Request, principal: UIPrincipal, session: SessionDep, yaml: YamlField):
    """Register the pattern; errors show next to the text, which is kept."""
    require(principal, "patterns:write")

    def write():
        return registry.create_pattern(session, parse_yaml(yaml), principal.label)

    return EDITOR.save(request, session, yaml, write, name=None)


def _pattern_context(
    session: SessionDep, record: PatternRecord, tenant_id: str, settings: Settings
) -> dict:
    usage = pattern_usage(session, tenant_id)
    summary = PatternSummary.from_record(record)
    family = family_of(summary.rewriter)
    return {
        "pattern": record,
        "yaml": dump_yaml(record.spec),
        "versions": registry.pattern_history(session, record.name),
        "summary": summary,
        "family": family,
        "family_slug": family_slug(family),
        "usage": usage.of(record.name),
        "usage_window": usage,
        **class_context(session, record.name, tenant_id, settings),  # issue 28
    }


@router.get("/{name}")
def pattern_page(
    name: str, request: Request, principal: UIPrincipal, session: SessionDep, settings: SettingsDep
):
    """A pattern: its YAML, history, per machine class, enable/disable, edit, and try on
    a model."""
    record = registry.get_pattern(session, name)
    context = _pattern_context(session, record, principal.tenant_id, settings)
    return render(request, "pattern.html", context)


@router.get("/{name}/edit")
def edit_pattern_page(name: str, request: Request, principal: UIPrincipal, session: SessionDep):
    """The current spec as YAML, with the version it was read at."""
    record = registry.get_pattern(session, name)
    return EDITOR.edit_form(request, record.name, record.spec, record.version)


@router.post("/{name}/edit")
def edit_pattern(
    name: str,
    request: Request,
    principal: UIPrincipal,
    session: SessionDep,
    yaml: YamlField,
    version: VersionField = None,
):
    """A new version of the pattern, unless someone changed it since (then say so)."""
    require(principal, "patterns:write")
    record = registry.get_pattern(session, name)
    if_match = version_etag(name, version)

    def write():
        spec = parse_yaml(yaml)
        return registry.change_pattern(
            session, name, "update", spec=spec, if_match=if_match, actor=principal.label
        )

    return EDITOR.save(request, session, yaml, write, name=name, version=version or record.version)


@router.post("/{name}/toggle")
def toggle_pattern(
    name: str, principal: UIPrincipal, session: SessionDep, version: VersionField = None
):
    """Enable a disabled pattern, or disable an enabled one."""
    require(principal, "patterns:write")
    record = registry.get_pattern(session, name)
    change = "disable" if record.enabled else "enable"
    registry.change_pattern(
        session, name, change, if_match=version_etag(name, version), actor=principal.label
    )
    return RedirectResponse(f"/ui/patterns/{name}", status_code=303)


@router.get("/{name}/versions/{version}")
def pattern_version_page(
    name: str,
    version: Annotated[int, Path(ge=1, le=2**31 - 1)],  # no overflow in the database
    request: Request,
    principal: UIPrincipal,
    session: SessionDep,
):
    """One immutable version of a pattern, as YAML."""
    row = registry.get_pattern_version(session, name, version)
    context = {"row": row, "yaml": dump_yaml(row.spec)}
    return render(request, "pattern_version.html", context)


@router.post("/{name}/try")
async def try_pattern_page(
    name: str, request: Request, principal: UIPrincipal, session: SessionDep, settings: SettingsDep
):
    """Match the pattern on an uploaded model (the API's /test): matches and near misses."""
    record = registry.get_pattern(session, name)
    context = _pattern_context(session, record, principal.tenant_id, settings)
    session.close()  # hold no connection while the upload streams and the trial runs
    try:
        # The model is drawn in the trial's child process too: the API never loads it.
        trial = await trial_upload(
            incoming(request, settings),
            settings,
            record,
            pictures=MAX_MATCH_PICTURES,
            tenant=principal.tenant_id,
        )
    except (ProblemError, FusionError) as exc:
        status, errors = form_errors(exc, "model")
        context["try_errors"] = errors
        return render(request, "pattern.html", context, status_code=status)
    context["trial"] = PatternTestResult.from_trial(trial)
    context["pictures"] = [Markup(svg) for svg in trial.pictures]  # region_svg escapes labels
    return render(request, "pattern.html", context)
