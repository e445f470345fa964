"""From pattern data to compiled patterns: validate the spec, resolve the rewriter by
name, validate its params, and check the targets it claims.

Every failure is a ``PatternError`` whose ``errors`` name the field that is wrong, so a
pattern that does not compile is rejected at registration time, not at match time.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from autofusion.fusion_core.errors import PatternError, field_errors

if TYPE_CHECKING:
    from autofusion.fusion_core.patterns import PatternSpec
    from autofusion.fusion_core.rewriters import Params, Rewriter, RewriterRegistry

# libyaml's loader when PyYAML was built with it: the same data, parsed 8x faster
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

__all__ = [
    "CompiledPattern",
    "builtin_patterns",
    "compile_pattern",
    "load_pattern_file",
    "parse_pattern_text",
]


@dataclass(frozen=True)
class CompiledPattern:
    spec: PatternSpec
    rewriter: Rewriter
    params: Params

    @property
    def name(self) -> str:
        return self.spec.name

    def params_for(self, pattern: PatternSpec) -> Params:
        """The rewriter's params for a match of ``pattern``: this pattern, or one of its
        variants without some optional group (whose params name no absent node)."""
        if pattern is self.spec:
            return self.params
        return self.rewriter.validate_params(pattern.rewriter.params, pattern)


def compile_pattern(
    raw: dict[str, Any] | PatternSpec, registry: RewriterRegistry | None = None
) -> CompiledPattern:
    """Validate one pattern and bind its rewriter; raise PatternError naming the field."""
    # The pattern models and the rewriters (onnx_ir, so onnx) load on the first compile:
    # the API reads the built-ins' data at start (``builtin_pattern_data``) and no more.
    from autofusion.fusion_core.patterns import PatternSpec
    from autofusion.fusion_core.rewriters import builtin_rewriters

    registry = registry or builtin_rewriters()
    spec = raw if isinstance(raw, PatternSpec) else _validated(raw)
    rewriter = registry.get(spec.rewriter.name)
    if rewriter is None:
        raise PatternError(
            f"pattern {spec.name!r} is invalid",
            errors=[
                (
                    "rewriter.name",
                    f"unknown rewriter {spec.rewriter.name!r}; known: {registry.names()}",
                )
            ],
        )
    unsupported = sorted(set(spec.targets) - rewriter.targets)
    if unsupported:
        raise PatternError(
            f"pattern {spec.name!r} is invalid",
            errors=[("targets", f"rewriter {rewriter.name!r} does not emit for {unsupported}")],
        )
    try:
        params = rewriter.validate_params(spec.rewriter.params, spec)
        for variant in spec.variants()[1:]:  # a rewriter may need a node a group holds
            rewriter.validate_params(variant.rewriter.params, variant)
    except ValidationError as exc:
        errors = [(f"rewriter.params.{path}", msg) for path, msg in _field_errors(exc)]
        raise PatternError(f"pattern {spec.name!r} is invalid", errors=errors) from None
    except ValueError as exc:
        path, _, msg = str(exc).partition(": ")
        raise PatternError(f"pattern {spec.name!r} is invalid", errors=[(path, msg)]) from None
    return CompiledPattern(spec, rewriter, params)


def _validated(raw: dict[str, Any]) -> PatternSpec:
    """The pattern's spec, or a PatternError naming the field that is wrong."""
    from autofusion.fusion_core.patterns import PatternSpec

    try:
        return PatternSpec.model_validate(raw)
    except ValidationError as exc:
        label = raw.get("name", "<unnamed>")
        raise PatternError(f"pattern {label!r} is invalid", errors=_field_errors(exc)) from None


def _field_errors(exc: ValidationError) -> list[tuple[str, str]]:
    errors = []
    for path, message in field_errors(exc):
        if not path:
            # Whole-pattern checks say "nodes.1.inputs.0: message": split the path off.
            prefix, sep, rest = message.partition(": ")
            path, message = (prefix, rest) if sep and " " not in prefix else ("<pattern>", message)
        errors.append((path, message))
    return errors


def parse_pattern_text(text: str, origin: str = "<text>") -> list[dict[str, Any]]:
    """YAML or JSON holding one pattern, a list of them, or ``{patterns: [...]}``."""
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise PatternError(f"{origin} is not valid YAML or JSON: {exc}") from None
    if isinstance(data, dict) and "patterns" in data and "nodes" not in data:
        data = data["patterns"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise PatternError(
            f"{origin} holds no pattern",
            hint="write a mapping with name, nodes and rewriter, or a list of them",
        )
    return data


def load_pattern_file(
    path: str | os.PathLike, registry: RewriterRegistry | None = None
) -> list[CompiledPattern]:
    """Load and compile every pattern in a YAML or JSON file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PatternError(f"cannot read pattern file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PatternError(f"pattern file {str(path)!r} is not UTF-8 text") from None
    return compile_all(parse_pattern_text(text, str(path)), registry)


def compile_all(
    raws: Iterable[dict[str, Any] | PatternSpec], registry: RewriterRegistry | None = None
) -> list[CompiledPattern]:
    return [compile_pattern(raw, registry) for raw in raws]


def _builtin_folder() -> Traversable:
    return resources.files("autofusion.fusion_core.patterns") / "builtin"


def _builtin_texts() -> tuple[tuple[str, str], ...]:
    """(file name, text) of every built-in pattern file, in name order. Reading them is
    cheap; parsing them is not (a second of YAML), so the texts are the cache's key: an
    edited file, whatever its timestamp says, is parsed again."""
    return tuple(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in sorted(_builtin_folder().iterdir(), key=lambda e: e.name)
        if entry.name.endswith((".yaml", ".yml", ".json"))
    )


@functools.lru_cache(maxsize=4)
def _parsed_builtins(texts: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], ...]:
    """The raw data of the built-ins; callers get copies (``builtin_pattern_data``)."""
    return tuple(raw for name, text in texts for raw in parse_pattern_text(text, name))


@functools.lru_cache(maxsize=4)
def _builtin_specs(texts: tuple[tuple[str, str], ...]) -> tuple[PatternSpec, ...]:
    """The built-ins validated once per process (per content of their files). Shared by
    every call and thread, so nothing may change them: no code assigns to a spec, and
    the one thing a spec builds lazily, its variants, is built here, before sharing."""
    specs = tuple(_validated(raw) for raw in _parsed_builtins(texts))
    for spec in specs:
        for variant in spec.variants():
            variant.variants()
    return specs


def builtin_pattern_data() -> list[dict[str, Any]]:
    """The raw data of the patterns shipped in ``fusion_core/patterns/builtin`` (a copy
    the caller may change)."""
    return copy.deepcopy(list(_parsed_builtins(_builtin_texts())))


def builtin_patterns(registry: RewriterRegistry | None = None) -> list[CompiledPattern]:
    """The built-ins compiled against ``registry``: their specs are parsed and validated
    once (``_builtin_specs``); binding the rewriters is redone on every call, since each
    optimize call has a registry of its own. User patterns (the registry's database,
    ``OptimizeConfig.extra_patterns``) are compiled by their callers, fresh."""
    from autofusion.fusion_core.rewriters import builtin_rewriters

    registry = registry or builtin_rewriters()
    return compile_all(_builtin_specs(_builtin_texts()), registry)


def pattern_to_json(pattern: CompiledPattern) -> str:
    return json.dumps(pattern.spec.model_dump(mode="json", by_alias=True, exclude_none=True))
