"""The service refuses to start on an onnx or onnxruntime older than it requires (issue 26).

An older one fails later and obscurely: an op or an opset it does not know, on some job.
The minimum is read from the installed package's own metadata (``Requires-Dist``, which
pyproject.toml's ``dependencies`` becomes), never written a second time here, and the
installed versions from theirs: nothing is imported, so the API process still loads no
onnx or onnxruntime (tests/app/test_api_imports.py).

A variant build installed under another distribution name (``onnxruntime-gpu`` for the
``onnxruntime`` import package) is found through the import package it provides.
"""

from __future__ import annotations

import importlib.metadata as metadata
import logging

# packaging is always there: onnxruntime, onnx-ir and onnxscript require it.
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

__all__ = ["CHECKED", "RuntimeVersionError", "check_runtime_versions", "runtime_version_refusal"]

logger = logging.getLogger(__name__)

DISTRIBUTION = "autofusion"
# The packages whose minimum is checked: the model runtime and the format library.
CHECKED = ("onnx", "onnxruntime")
ENGINE_EXTRA = "core"  # the extra whose requirements these are
# Specifiers that set a floor: ">=1.23", ">1.2", "~=1.23" (at least 1.23), "==1.23.*".
# Only the floor is checked: a newer release is pip's to refuse, not a reason to stop.
_FLOORS = (">=", ">", "~=", "==")


class RuntimeVersionError(RuntimeError):
    """onnx or onnxruntime is older than this release of autofusion requires."""


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or of the distribution that
    provides the import package ``name``; None when there is none."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
    for provider in metadata.packages_distributions().get(name, []):
        try:
            return metadata.version(provider)
        except metadata.PackageNotFoundError:
            continue
    return None


def required_versions() -> dict[str, Requirement]:
    """autofusion's requirements on the ``CHECKED`` packages, from its metadata; empty when
    autofusion runs uninstalled (from a source tree): then nothing is known to check."""
    try:
        lines = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    found: dict[str, Requirement] = {}
    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name.lower() in CHECKED and _of_the_engine(requirement):
            found[requirement.name.lower()] = requirement
    return found


def _of_the_engine(requirement: Requirement) -> bool:
    """A requirement of the engine: unconditional, or of the ``core`` extra (where onnx
    and onnxruntime are since the base install became the light client; the server extra
    includes it)."""
    marker = requirement.marker
    return marker is None or marker.evaluate({"extra": ENGINE_EXTRA})


def runtime_version_refusal() -> str | None:
    """The one-line reason to refuse to start, or None when every floor is met."""
    problems, fixes = [], []
    for name, requirement in sorted(required_versions().items()):
        installed = installed_version(name)
        floors = [s for s in requirement.specifier if s.operator in _FLOORS]
        if installed is None:
            problems.append(f"{name} is not installed")
        elif any(_below(installed, spec.operator, spec.version) for spec in floors):
            problems.append(f"{name} {installed} is installed")
        else:
            continue
        fixes.append(f"'{name}{requirement.specifier}'")
    if not problems:
        return None
    return (
        f"refusing to start: {', '.join(problems)}, but this release of autofusion requires "
        f"{' and '.join(fixes)}; install those (pip install {' '.join(fixes)})"
    )


def check_runtime_versions() -> None:
    """Log the refusal (one line) and raise RuntimeVersionError, or do nothing."""
    refusal = runtime_version_refusal()
    if refusal is not None:
        logger.error("%s", refusal)
        raise RuntimeVersionError(refusal)


def _below(installed: str, operator: str, floor: str) -> bool:
    """``installed`` is older than the floor ``operator floor`` sets."""
    floor = floor.removesuffix(".*")
    try:
        have, need = Version(installed), Version(floor)
    except InvalidVersion:
        return False  # a version we cannot read: no grounds to refuse
    return have <= need if operator == ">" else have < need
