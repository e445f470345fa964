"""``merge_options`` and ``read_options_file``: see the package's docstring."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from autofusion.fusion_core.errors import ConfigError

__all__ = ["SECTIONS", "STRATEGY_ONLY_FIELDS", "merge_options", "read_options_file"]

# A named strategy's document carries these beside the config fields it sets.
STRATEGY_ONLY_FIELDS = ("name", "description")
SECTIONS = ("check", "measure_options")  # merged key by key


def merge_options(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Config options in layers, each later one winning: a strategy's options under a
    job's, or a strategy file's under the command line's. ``exclude`` lists add up (a
    strategy that leaves a pattern out keeps it out); ``check`` and ``measure_options``
    merge key by key. The one merge the CLI, the CI client and the worker all use."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key == "exclude" and isinstance(value, list):
                merged[key] = list(dict.fromkeys([*(merged.get(key) or []), *value]))
            elif key in SECTIONS and isinstance(value, dict):
                merged[key] = {**(merged.get(key) or {}), **value}
            else:
                merged[key] = value
    return merged


def read_options_file(path: str | os.PathLike) -> dict[str, Any]:
    """The config fields of a strategy file (YAML or JSON; a named strategy's document
    too, its name and description dropped), not yet validated field by field."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))  # JSON is YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the strategy file {str(path)!r}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(
            f"{path} must hold a mapping of config fields (patterns, selection...)",
            hint="see docs/cost.md, 'Strategy configs'",
        )
    return {k: v for k, v in document.items() if k not in STRATEGY_ONLY_FIELDS}
