"""One public module per registered rewriter name (docs/architecture.md, "Where things go").

``fusion_core.rewriters.<name>`` (a module, or for ``attention`` a package) holds the
built-in rewriter registered as ``<name>`` and no other; what several rewriters share
lives in private ``_modules``, which hold no rewriter. (Named test_modules.py, not
test_layout.py: tests/ has no ``__init__.py``, so two test files may not share a name.)
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import autofusion.fusion_core.rewriters as rewriters_package
from autofusion.fusion_core.rewriters import Rewriter, builtin_rewriters

PREFIX = "autofusion.fusion_core.rewriters."


def _modules() -> list[ModuleType]:
    """Every module under fusion_core/rewriters, packages' submodules included."""
    infos = pkgutil.walk_packages(rewriters_package.__path__, PREFIX)
    return [importlib.import_module(info.name) for info in infos]


def _rewriters_defined_in(module: ModuleType) -> list[type[Rewriter]]:
    return [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, Rewriter)
        and not inspect.isabstract(cls)
        and cls.__module__ == module.__name__
    ]


def test_every_builtin_rewriter_lives_in_the_module_of_its_name() -> None:
    registry = builtin_rewriters()
    wrong = []
    for name in registry.names():
        home = PREFIX + name
        module = type(registry.get(name)).__module__
        if module != home and not module.startswith(home + "."):
            wrong.append(f"{name!r} is defined in {module}, expected {home}")
    assert not wrong, "\n".join(wrong)


def test_no_module_holds_a_rewriter_of_another_name() -> None:
    wrong = []
    for module in _modules():
        top = module.__name__.removeprefix(PREFIX).split(".")[0]
        for cls in _rewriters_defined_in(module):
            if top.startswith("_"):
                wrong.append(f"private {module.__name__} holds rewriter {cls.name!r}")
            elif cls.name != top:
                wrong.append(f"{module.__name__} holds rewriter {cls.name!r}")
    assert not wrong, "\n".join(wrong)


def test_every_public_module_is_a_registered_name() -> None:
    names = set(builtin_rewriters().names())
    public = {
        info.name
        for info in pkgutil.iter_modules(rewriters_package.__path__)
        if not info.name.startswith("_")
    }
    assert public == names, f"modules without a rewriter: {sorted(public - names)}"


def test_attention_is_a_package_exposing_its_rewriter() -> None:
    attention = importlib.import_module(PREFIX + "attention")
    assert hasattr(attention, "__path__"), "fusion_core.rewriters.attention is not a package"
    assert attention.__all__ == [
        "AttentionParams",
        "FuseAttention",
        "grouped_multi_head_attention",
        "multi_head_attention",
    ]
    assert attention.FuseAttention.name == "attention"
