"""Which extra of the package each command needs, and the one line that says so when it
is not installed: the base install (``pip install autofusion``) is the light client
(``submit``, ``jobs``, ``registry``), ``autofusion[core]`` adds the engine and
``autofusion[server]`` the service (pyproject.toml; docs/service.md, "The light client").
"""

from __future__ import annotations

__all__ = ["NEEDS", "is_missing_dependency", "missing_extra"]

# command -> the extra that holds what it imports; a command not named needs the base only.
NEEDS = {
    "optimize": "core",
    "compare": "core",
    "profile": "core",
    "calibrate": "core",
    "patterns": "core",
    "serve": "server",
    "worker": "server",
    "migrate": "server",
    "keys": "server",
    "config": "server",
}


def is_missing_dependency(exc: BaseException) -> bool:
    """An import that failed because a distribution is not installed: a module outside
    autofusion that is not there. A missing module of autofusion itself is a bug."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return False
    return exc.name.partition(".")[0] != "autofusion"


def missing_extra(command: str, exc: ModuleNotFoundError) -> str:
    """What to install for ``command``, and the module this install lacks."""
    extra = NEEDS.get(command, "server")
    return (
        f"autofusion {command} needs the {extra} extra: pip install 'autofusion[{extra}]' "
        f"(this install has no module named {exc.name!r})"
    )
