"""Named strategies: which patterns a job uses, for which target, checked how.

A strategy is data (``StrategySpec``), stored like a pattern: the current state in
``strategies`` and every change as an immutable row in ``strategy_versions``. The
pattern names it lists must exist in the registry when it is written. A job that names
a strategy gets ``spec.config_overrides()`` merged into its ``OptimizeConfig``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import PatternRecord, Strategy, StrategyVersion, utcnow
from autofusion.app.services.versioned import VersionedKind
from autofusion.fusion_core import CheckOptions
from autofusion.fusion_core.catalog import builtin_pattern_data
from autofusion.fusion_core.config import MeasureOptions, Selection, Switch
from autofusion.fusion_core.targets import TargetName

__all__ = [
    "PRESETS",
    "StrategySpec",
    "create_strategy",
    "get_strategy",
    "list_strategies",
    "seed_strategies",
    "strategy_etag",
    "strategy_history",
    "update_strategy",
]

_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class StrategySpec(BaseModel):
    """What a named strategy selects: ``patterns`` (None: all), minus ``exclude``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME_PATTERN, max_length=200)
    description: str = ""
    patterns: list[str] | None = Field(
        default=None, description="Only these patterns, by name; null means all of them."
    )
    exclude: list[str] = Field(default_factory=list)
    target: TargetName | None = Field(
        default=None, description="The target a job uses unless it names its own."
    )
    check: CheckOptions | None = None
    # Cost-based choice among overlapping fusions (docs/cost.md); unset: the job's own.
    selection: Selection | None = None
    # Measured selection on this worker (docs/measured.md); the worker picks the cache.
    measure: bool | None = None
    measure_options: MeasureOptions | None = None
    target_profile: str | None = Field(default=None, max_length=200)
    # What the fused model declares of its intermediate values; unset: the profile's.
    value_info: Literal["all", "none"] | None = None
    cost_threshold: float | None = Field(default=None, gt=0)
    memory_limit: int | None = Field(default=None, ge=0)
    # Patterns turned off or on by the job's input shapes (docs/cost.md).
    switches: list[Switch] = Field(default_factory=list, max_length=64)
    # Progressive mode and its stages (lists of pattern-name globs; docs/validation.md).
    progressive: bool | None = None
    stages: list[list[str]] | None = Field(default=None, min_length=1, max_length=32)
    # The precision the fused model will run in: fp16 adds the range analysis.
    precision: Literal["fp32", "fp16"] | None = None

    @field_validator("measure_options")
    @classmethod
    def _no_cache_folder(cls, options: MeasureOptions | None) -> MeasureOptions | None:
        if options is not None and options.cache_dir is not None:
            raise ValueError("measure_options.cache_dir is chosen by each worker; leave it out")
        if options is not None and options.verdicts_file is not None:
            raise ValueError("measure_options.verdicts_file is the worker's; leave it out")
        return options

    def config_overrides(self) -> dict[str, Any]:
        """The ``OptimizeConfig`` fields this strategy sets (what it leaves unset is absent)."""
        overrides: dict[str, Any] = {"patterns": self.patterns, "exclude": list(self.exclude)}
        if self.target is not None:
            overrides["target"] = self.target
        if self.check is not None:
            overrides["check"] = self.check.model_dump()
        if self.switches:
            overrides["switches"] = [s.model_dump() for s in self.switches]
        if self.measure_options is not None:
            overrides["measure_options"] = self.measure_options.model_dump(exclude_unset=True)
        for name in _OPTIONAL_FIELDS:
            if getattr(self, name) is not None:
                overrides[name] = getattr(self, name)
        return overrides


_OPTIONAL_FIELDS = (
    "selection",
    "measure",
    "target_profile",
    "value_info",
    "cost_threshold",
    "memory_limit",
    "progressive",
    "stages",
    "precision",
)


_NLP_PREFIXES = (
    "attention",
    "qkv_",
    "kv_",
    "layer_norm",
    "rms_norm",
    "skip_layer_norm",
    "gelu_",
)
BUILTIN_PATTERN_NAMES = sorted(p["name"] for p in builtin_pattern_data())

PRESETS = (
    StrategySpec(
        name="default",
        description=(
            "Every pattern in the registry; the cost model's auto strategy chooses among "
            "overlapping fusions."
        ),
        selection="auto",
    ),
    StrategySpec(
        name="vision",
        description=(
            "Convolutional networks: conv, batch-norm, pooling and padding fusions, the "
            "exact (dp) choice where conv+bn+relu and conv+add paths compete."
        ),
        selection="dp",
        patterns=[
            "conv_bn_relu",
            "conv_bn_add_relu",
            "dwconv_bn",
            "pool_bn",
            "conv_bn",
            "conv_add",
            "conv_mul",
            "conv_activation",
            "pad_conv",
        ],
    ),
    StrategySpec(
        name="nlp",
        description=(
            "Transformers and MLPs: attention, Q/K/V merges, layer and RMS norms with their "
            "residuals, GELU, and matmul/gemm epilogues; the exact (dp) choice between a "
            "whole attention block and its pieces."
        ),
        selection="dp",
        patterns=[
            name
            for name in BUILTIN_PATTERN_NAMES
            if name.startswith(_NLP_PREFIXES) or name in ("matmul_add", "gemm_activation")
        ],
    ),
)


STRATEGIES = VersionedKind(Strategy, "strategy", "/v1/strategies")


def strategy_etag(strategy: Strategy) -> str:
    return STRATEGIES.etag(strategy)


def seed_strategies(session: Session) -> int:
    """Insert the presets that are missing (all of them on the first start), and bring
    a preset nobody changed (still at version 1) to this release's: its pattern list
    follows the built-ins (one ``attention`` pattern replaced ten). A preset changed
    through the API (version 2 on) stays the user's. Returns how many were written."""
    seeded = 0
    for preset in PRESETS:
        stored = session.get(Strategy, preset.name)
        if stored is None:
            _store(session, Strategy(name=preset.name, version=1), preset)
            seeded += 1
        elif stored.version == 1 and stored.data != preset.model_dump(mode="json"):
            _refresh_first_version(session, stored, preset)
            seeded += 1
    session.flush()
    return seeded


def _refresh_first_version(session: Session, stored: Strategy, preset: StrategySpec) -> None:
    data = preset.model_dump(mode="json")
    stored.data, stored.updated_at = data, utcnow()
    first = session.scalars(
        select(StrategyVersion).where(
            StrategyVersion.name == stored.name, StrategyVersion.version == 1
        )
    ).first()
    if first is not None:
        first.data = data


def list_strategies(session: Session) -> list[Strategy]:
    return list(session.scalars(select(Strategy).order_by(Strategy.name)))


def get_strategy(session: Session, name: str) -> Strategy:
    strategy = session.get(Strategy, name)
    if strategy is None:
        raise STRATEGIES.not_found(name)
    return strategy


def create_strategy(session: Session, spec: StrategySpec) -> Strategy:
    """A new strategy. Of two concurrent creates of one name, one succeeds and the other
    is a 409: the primary key decides."""
    if session.get(Strategy, spec.name) is not None:
        raise STRATEGIES.exists(spec.name)
    _check_pattern_names(session, spec)

    def write(session: Session) -> Strategy:
        return _store(session, Strategy(name=spec.name, version=1), spec)

    exists = STRATEGIES.exists(spec.name)
    return STRATEGIES.write_after_read(session, spec.name, write, conflict=exists)


def update_strategy(
    session: Session, name: str, spec: StrategySpec, *, if_match: str | None
) -> Strategy:
    """Replace the strategy's data with ``spec``: a new version.

    ``if_match`` is required (428 without it); the write is a compare-and-swap on the
    version that was read and matched, so of two updates sent with the same ETag one
    succeeds and the other is a 412.
    """
    strategy = get_strategy(session, name)
    STRATEGIES.check_if_match(strategy, if_match, required=True)
    if spec.name != name:
        raise ProblemError(
            422,
            "strategy-name-mismatch",
            "Name mismatch",
            f"the strategy is named {spec.name!r} but the URL names {name!r}",
        )
    _check_pattern_names(session, spec)
    read, data = strategy.version, spec.model_dump(mode="json")

    def write(session: Session) -> bool | None:
        if not STRATEGIES.swap(session, name, read, data=data):
            return None
        session.add(StrategyVersion(name=name, version=read + 1, data=data))
        return True

    STRATEGIES.write_after_read(session, name, write, if_match=if_match)
    return STRATEGIES.reread(session, name)


def strategy_history(session: Session, name: str) -> list[StrategyVersion]:
    get_strategy(session, name)
    query = select(StrategyVersion).where(StrategyVersion.name == name)
    return list(session.scalars(query.order_by(StrategyVersion.version)))


def _store(session: Session, strategy: Strategy, spec: StrategySpec) -> Strategy:
    data = spec.model_dump(mode="json")
    strategy.data, strategy.updated_at = data, utcnow()
    session.add(strategy)
    session.add(StrategyVersion(name=strategy.name, version=strategy.version, data=data))
    session.flush()
    return strategy


def _check_pattern_names(session: Session, spec: StrategySpec) -> None:
    """Every pattern the strategy names must exist (enabled or not, but not deleted)."""
    known = set(session.scalars(select(PatternRecord.name).where(PatternRecord.deleted.is_(False))))
    errors = [
        {"field": f"{field}.{i}", "message": f"unknown pattern {name!r}"}
        for field, names in (("patterns", spec.patterns or []), ("exclude", spec.exclude))
        for i, name in enumerate(names)
        if name not in known
    ]
    if errors:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise ProblemError(
            422,
            "invalid-strategy",
            "Invalid strategy",
            f"strategy {spec.name!r} names patterns the registry does not have: {detail} "
            "(GET /v1/patterns lists them)",
            errors=errors,
        )
