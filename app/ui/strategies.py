"""Dashboard pages of the named strategies: list, view, create and edit as YAML."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse
from pydantic import ValidationError

from app.api.deps import SessionDep
from app.core.errors import ProblemError
from app.schemas.registry import StrategyCreate
from app.services import strategies
from app.ui.common import UIPrincipal, form_errors, render, require
from app.ui.yaml_forms import dump_yaml, parse_yaml, version_etag, version_message

__all__ = ["router"]

router = APIRouter(prefix="/ui/strategies", include_in_schema=False)

YamlField = Annotated[str, Form(max_length=1 << 20)]
VersionField = Annotated[str | None, Form()]
_NEW_STRATEGY = """\
name: acme.mobile
description: What our mobile models need.
patterns: [conv_bn, conv_activation, dwconv_bn]
exclude: []
target: onnxruntime
"""


@router.get("")
def strategies_page(request: Request, principal: UIPrincipal, session: SessionDep):
    """Every named strategy."""
    return render(request, "strategies.html", {"strategies": strategies.list_strategies(session)})


def _form(request: Request, *, action: str, text: str, errors=(), status=200, **extra):
    context = {"action": action, "yaml": text, "errors": list(errors), **extra}
    return render(request, "strategy_form.html", context, status_code=status)


def _spec(text: str) -> StrategyCreate:
    return StrategyCreate.model_validate(parse_yaml(text))


def _failed(request: Request, exc: Exception, text: str, action: str, **extra):
    status, errors = form_errors(exc, "yaml")
    if isinstance(exc, ProblemError) and exc.status in (412, 428):
        errors = [{"field": "version", "message": version_message(exc)}]
    elif isinstance(exc, ProblemError) and exc.slug in (
        "strategy-exists",
        "strategy-name-mismatch",
    ):
        errors = [{"field": "name", "message": exc.detail}]
    return _form(request, action=action, text=text, errors=errors, status=status, **extra)


@router.get("/new")
def new_strategy_page(request: Request, principal: UIPrincipal):
    """An empty form (an example to start from)."""
    return _form(request, action="/ui/strategies/new", text=_NEW_STRATEGY, name=None)


@router.post("/new")
def create_strategy(request: Request, principal: UIPrincipal, session: SessionDep, yaml: YamlField):
    """Create the strategy; every pattern it names must exist."""
    require(principal, "patterns:write")
    try:
        strategy = strategies.create_strategy(session, _spec(yaml))
    except (ProblemError, ValidationError) as exc:
        session.rollback()
        return _failed(request, exc, yaml, "/ui/strategies/new", name=None)
    return RedirectResponse(f"/ui/strategies/{strategy.name}", status_code=303)


@router.get("/{name}")
def strategy_page(name: str, request: Request, principal: UIPrincipal, session: SessionDep):
    """A strategy as YAML, with its versions."""
    strategy = strategies.get_strategy(session, name)
    context = {
        "strategy": strategy,
        "yaml": dump_yaml(strategy.data),
        "versions": strategies.strategy_history(session, name),
    }
    return render(request, "strategy.html", context)


@router.get("/{name}/edit")
def edit_strategy_page(name: str, request: Request, principal: UIPrincipal, session: SessionDep):
    """The current strategy as YAML, with the version it was read at."""
    strategy = strategies.get_strategy(session, name)
    return _form(
        request,
        action=f"/ui/strategies/{strategy.name}/edit",
        text=dump_yaml(strategy.data),
        name=strategy.name,
        version=strategy.version,
    )


@router.post("/{name}/edit")
def edit_strategy(
    name: str,
    request: Request,
    principal: UIPrincipal,
    session: SessionDep,
    yaml: YamlField,
    version: VersionField = None,
):
    """A new version of the strategy, unless someone changed it since."""
    require(principal, "patterns:write")
    strategy = strategies.get_strategy(session, name)
    try:
        strategy = strategies.update_strategy(
            session, name, _spec(yaml), if_match=version_etag(name, version)
        )
    except (ProblemError, ValidationError) as exc:
        session.rollback()
        action = f"/ui/strategies/{name}/edit"
        return _failed(request, exc, yaml, action, name=name, version=version or strategy.version)
    return RedirectResponse(f"/ui/strategies/{strategy.name}", status_code=303)
