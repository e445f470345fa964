"""Dashboard pages of the named strategies: list, view, create and edit as YAML."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request

from autofusion.app.api.deps import SessionDep
from autofusion.app.api.schemas.registry import StrategyCreate
from autofusion.app.services import strategies
from autofusion.app.ui.common import UIPrincipal, render, require
from autofusion.app.ui.yaml_forms import YamlEditor, dump_yaml, parse_yaml, version_etag

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


EDITOR = YamlEditor(
    "/ui/strategies", "strategy_form.html", ("strategy-exists", "strategy-name-mismatch")
)


def _spec(text: str) -> StrategyCreate:
    return StrategyCreate.model_validate(parse_yaml(text))


@router.get("/new")
def new_strategy_page(request: Request, principal: UIPrincipal):
    """An empty form (an example to start from)."""
    return EDITOR.new_form(request, _NEW_STRATEGY)


@router.post("/new")
def create_strategy(request: Request, principal: UIPrincipal, session: SessionDep, yaml: YamlField):
    """Create the strategy; every pattern it names must exist."""
    require(principal, "patterns:write")

    def write():
        return strategies.create_strategy(session, _spec(yaml))

    return EDITOR.save(request, session, yaml, write, name=None)


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
    return EDITOR.edit_form(request, strategy.name, strategy.data, strategy.version)


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
    if_match = version_etag(name, version)

    def write():
        return strategies.update_strategy(session, name, _spec(yaml), if_match=if_match)

    at = {"name": name, "version": version or strategy.version}
    return EDITOR.save(request, session, yaml, write, **at)
