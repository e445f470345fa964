"""Target profiles: what a machine costs, as data (YAML, like patterns).

The shipped profiles live in ``fusion_core/target_profiles/*.yaml``; ``autofusion
calibrate`` measures one for the machine it runs on. A profile prices the cost model's
counts: seconds = max(bytes / bandwidth, FLOPs / peak) + launches * launch overhead.
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autofusion.fusion_core.errors import ConfigError, describe_fields, field_errors

__all__ = [
    "KERNEL_FACTOR_KEY",
    "PROFILE_NAME_PATTERN",
    "Calibration",
    "TargetProfile",
    "dump_target_profile",
    "load_target_profile",
    "shipped_profiles",
]

_PACKAGE_FOLDER = "target_profiles"
PROFILE_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
# A kernel factor's key: a rewriter or pattern name, then up to two words joined by "+"
# (an optional group of the pattern, a mode of the kernel: attention+softcap+cache).
KERNEL_FACTOR_KEY = r"[A-Za-z0-9_.-]+(\+[A-Za-z0-9_.-]+){0,2}"


class Calibration(BaseModel):
    """How a measured profile was measured (absent from hand-written profiles)."""

    model_config = ConfigDict(extra="forbid")
    tool: str = "autofusion calibrate"
    threads: int = Field(ge=1)
    repeats: int = Field(ge=1)
    quick: bool = False
    onnxruntime: str = ""
    measured_at: str = ""  # ISO 8601, UTC


class TargetProfile(BaseModel):
    """The prices of one machine class. Sizes in bytes, times in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=PROFILE_NAME_PATTERN)
    description: str = ""
    memory_bandwidth_bytes_per_s: float = Field(gt=0, description="sustained main-memory bytes/s")
    launch_overhead_s: float = Field(gt=0, description="seconds per kernel (node) launch")
    peak_flops_per_s: float = Field(gt=0, description="attainable FLOP/s of a large MatMul")
    l1_cache_bytes: int = Field(gt=0, description="bytes of L1 data cache per core")
    l2_cache_bytes: int = Field(gt=0, description="bytes of L2 cache per core")
    fusion_buffer_bytes: int = Field(
        gt=0, description="bytes a fused kernel's working set should fit in (fast memory)"
    )
    memory_pool_bytes: int = Field(gt=0, description="bytes of memory the runtime may allocate")
    # The roofline prices every kernel alike; a runtime's fused kernels are not all as good
    # as its plain ones (onnxruntime's CPU SkipLayerNormalization is slower than the Add
    # and LayerNormalization it replaces). Per key (KERNEL_FACTOR_KEY: a rewriter or
    # pattern name, optionally + one of the pattern's optional groups, optionally + a mode
    # the rewriter states its kernel runs in): the measured time of the kernel(s) it emits
    # over the roofline's prediction, relative to the unfused nodes' (learned from profiled
    # reports by `autofusion calibrate --from-report`; 1 if absent).
    kernel_factors: dict[str, float] = Field(default_factory=dict)
    # What a fused model written for this runtime declares of its intermediate values
    # (ONNX value_info): "all" their inferred types and shapes, "none" only the graph's
    # interface, the rest left to the runtime's own inference (an exporter's file is
    # mostly so). A runtime's optimizer fuses by the shapes it can prove, not always into
    # faster kernels (fusion_core/pipeline/written.py).
    value_info: Literal["all", "none"] = "all"
    calibration: Calibration | None = None

    @field_validator("kernel_factors")
    @classmethod
    def _valid_factors(cls, factors: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in factors.items() if not v > 0}
        if bad:
            raise ValueError(f"kernel factors must be positive: {bad}")
        malformed = [k for k in factors if not re.fullmatch(KERNEL_FACTOR_KEY, k)]
        if malformed:
            raise ValueError(
                f"kernel factor keys {malformed} are not name[+group][+mode] (a rewriter or "
                "pattern name, then up to two words, each letters, digits, '_', '.' or '-')"
            )
        return factors

    def kernel_factor(
        self,
        rewriter: str,
        pattern: str | None = None,
        groups: tuple[str, ...] = (),
        modes: tuple[str, ...] = (),
    ) -> float:
        """The factor that prices the kernel (``priced_by`` says which key gives it)."""
        key = self.priced_by(rewriter, pattern, groups, modes)
        return 1.0 if key is None else self.kernel_factors[key]

    def priced_by(
        self,
        rewriter: str,
        pattern: str | None = None,
        groups: tuple[str, ...] = (),
        modes: tuple[str, ...] = (),
    ) -> str | None:
        """The profile's key for a kernel, the most specific first (None: no factor).

        ``pattern+group+mode`` (one of the pattern's optional groups in one mode of the
        kernel: ``attention+softcap+cache``), ``pattern+group`` (``attention+softcap``),
        ``pattern+mode``, ``pattern``, ``rewriter+mode``, ``rewriter``; groups and modes
        in the order given."""
        specific: list[str] = []
        if pattern is not None:
            specific += [f"{pattern}+{g}+{m}" for g in groups for m in modes]
            specific += [f"{pattern}+{g}" for g in groups]
        for name in (pattern, rewriter):
            if name is not None:
                specific += [f"{name}+{m}" for m in modes] + [name]
        return next((key for key in specific if key in self.kernel_factors), None)

    def seconds(self, *, bytes_moved: float, flops: float, launches: float) -> float:
        """Roofline time of ``launches`` kernels moving ``bytes_moved`` and computing."""
        memory = bytes_moved / self.memory_bandwidth_bytes_per_s
        compute = flops / self.peak_flops_per_s
        return max(memory, compute) + launches * self.launch_overhead_s


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with autofusion."""
    folder = resources.files("autofusion.fusion_core") / _PACKAGE_FOLDER
    return sorted(
        entry.name.rsplit(".", 1)[0]
        for entry in folder.iterdir()
        if entry.name.endswith((".yaml", ".yml"))
    )


def load_target_profile(name_or_path: str | os.PathLike) -> TargetProfile:
    """A shipped profile by name (``cpu``, ``gpu``) or a YAML/JSON file by path.

    Raises ConfigError: an unknown name lists the shipped ones; an invalid file names
    the field that is wrong.
    """
    text, origin = _read(name_or_path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"target profile {origin} is not valid YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"target profile {origin} holds no mapping",
            hint="write the fields name, memory_bandwidth_bytes_per_s, launch_overhead_s, ...",
        )
    try:
        return TargetProfile.model_validate(data)
    except ValidationError as exc:
        problems = describe_fields(field_errors(exc, default="<profile>"))
        raise ConfigError(f"target profile {origin} is invalid: {problems}") from None


def _read(name_or_path: str | os.PathLike) -> tuple[str, str]:
    text_name = os.fspath(name_or_path)
    shipped = shipped_profiles()
    if text_name in shipped:
        folder = resources.files("autofusion.fusion_core") / _PACKAGE_FOLDER
        return (folder / f"{text_name}.yaml").read_text(encoding="utf-8"), repr(text_name)
    path = Path(text_name)
    looks_like_path = path.suffix in (".yaml", ".yml", ".json") or os.sep in text_name
    if not looks_like_path and not path.is_file():
        raise ConfigError(
            f"unknown target profile {text_name!r}",
            hint=f"shipped profiles: {shipped}; or give the path of a YAML file",
        )
    try:
        return path.read_text(encoding="utf-8"), repr(text_name)
    except OSError as exc:
        raise ConfigError(
            f"cannot read target profile {text_name!r}: {exc.strerror}",
            hint=f"shipped profiles: {shipped}",
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"target profile {text_name!r} is not UTF-8 text") from None


def dump_target_profile(profile: TargetProfile, *, header: str = "") -> str:
    """The profile as YAML (fields in declaration order), optionally after comments."""
    data: dict[str, Any] = profile.model_dump(mode="json", exclude_none=True)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.safe_dump(data, sort_keys=False)
