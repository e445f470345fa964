"""The options of one optimization, as data (the service receives them as JSON)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.options import STRATEGY_ONLY_FIELDS, merge_options, read_options_file
from autofusion.fusion_core.targets import TargetName

__all__ = [
    "FOLD_GROWTH_FLOOR_BYTES",
    "FOLD_GROWTH_RATIO",
    "MODES",
    "SELECTIONS",
    "STRATEGY_ONLY_FIELDS",
    "Selection",
    "CheckOptions",
    "MeasureOptions",
    "Mode",
    "OptimizeConfig",
    "Proposer",
    "Switch",
    "merge_options",
    "read_strategy_file",
]

# How overlapping candidates are chosen (fusion_core/strategies; docs/cost.md): the
# one spelling of the names, which the CLI's choices and the service's schemas take.
Selection = Literal["priority", "greedy", "dp", "genetic", "auto", "measured"]
SELECTIONS: tuple[str, ...] = get_args(Selection)
# What picks the candidates in each pass: every selection but "measured", which names a
# mode (the machine decides) and leaves the proposing to priority.
Proposer = Literal["priority", "greedy", "dp", "genetic", "auto"]
# How ``optimize`` runs (fusion_core/pipeline/modes.py): ``OptimizeConfig.mode``.
Mode = Literal["plain", "progressive", "measured"]
MODES: tuple[str, ...] = get_args(Mode)

# What constant folding may add beyond the model's own constants: the ratio lets every
# weight take a form as large again (a Cast of fp16 weights to fp32 adds their size once);
# the floor is one float32 tensor at the per-tensor limit (fold_output_size_limit, 8M
# elements), and fits the masks and tables small models fold. Issue 26's 6 KB model of
# 100 ConstantOfShape (1024x2048, 800 MiB folded) folds 4 of them; the exporters' models
# of tests/data grow by under 0.02 MiB.
FOLD_GROWTH_RATIO = 1.0
FOLD_GROWTH_FLOOR_BYTES = 32 << 20


class CheckOptions(BaseModel):
    """How the fused model is compared with the original (onnxruntime, opts disabled)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    rtol: float = Field(default=1e-3, ge=0)
    atol: float = Field(default=1e-4, ge=0)
    samples: int = Field(default=2, ge=1, le=100)
    seed: int = 0
    # Values for symbolic dimensions, by name (others are 1): the single shape profile
    # when ``profiles`` is empty.
    dims: dict[str, int] = Field(default_factory=dict)
    # Shape profiles, each values for symbolic dims by name; every profile is checked
    # with its own ``samples`` seeded samples, e.g.
    # [{"batch": 1, "sequence": 16}, {"batch": 8, "sequence": 128}].
    profiles: list[dict[str, PositiveInt]] = Field(default_factory=list, max_length=16)
    # Per-output tolerance by output name, e.g. {"logits": {"rtol": 0, "atol": 1e-3}};
    # a key left out, and every output not named, takes the default for its dtype
    # (float32/float64: rtol/atol above; float16: 1e-2/1e-3; bfloat16: 2e-2/1e-2;
    # integers and bool: exact).
    tolerances: dict[str, dict[Literal["rtol", "atol"], NonNegativeFloat]] = Field(
        default_factory=dict
    )
    # How float inputs are drawn: normal(input_mean, input_std) or
    # uniform(input_low, input_high). Integer inputs follow the graph (token ids below
    # the vocabulary size, masks 0/1).
    input_distribution: Literal["normal", "uniform"] = "normal"
    input_mean: float = 0.0
    input_std: float = Field(default=1.0, gt=0)
    input_low: float = -1.0
    input_high: float = 1.0

    @model_validator(mode="after")
    def _uniform_range(self) -> CheckOptions:
        if self.input_distribution == "uniform" and not self.input_low < self.input_high:
            raise ValueError(
                f"input_low ({self.input_low}) must be below input_high ({self.input_high})"
            )
        return self

    def shape_profiles(self) -> list[dict[str, int]]:
        """The profiles to check: ``profiles``, or ``dims`` as the only one."""
        return [dict(p) for p in self.profiles] or [dict(self.dims)]


class Switch(BaseModel):
    """Patterns turned off (or on) by the input shapes (fusion_core/pipeline/switches.py)."""

    model_config = ConfigDict(extra="forbid")

    # One comparison of shape formulas over graph inputs, e.g. "dim('$x', -1) > 1024".
    when: str = Field(min_length=1, max_length=500)
    disable: list[str] = Field(default_factory=list)
    enable: list[str] = Field(default_factory=list)

    @field_validator("when")
    @classmethod
    def _condition(cls, text: str) -> str:
        # Imported here: the CLI's light commands import this module and load no
        # patterns package at all (tests/app/test_cli_imports.py); the formulas it
        # loads need no onnx.
        from autofusion.fusion_core.patterns import compile_condition

        compile_condition(text)  # FormulaError is a ValueError: a validation error
        return text

    @model_validator(mode="after")
    def _one_action(self) -> Switch:
        if bool(self.disable) == bool(self.enable):
            raise ValueError("a switch either disables or enables patterns: give one list")
        return self


class MeasureOptions(BaseModel):
    # The docstring is the published schema's description (docs/openapi.json): it keeps
    # the module's old name, now the package fusion_core/pipeline/measured/.
    """How measured selection times the candidates (fusion_core/pipeline/measured/)."""

    model_config = ConfigDict(extra="forbid")

    # Seconds of timed runs in all, the final comparison with the original included.
    budget_s: float = Field(default=60.0, gt=0, le=3600)
    # onnxruntime as deployed: the level and intra-op threads to measure at.
    level: Literal["ORT_ENABLE_ALL", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_BASIC"] = "ORT_ENABLE_ALL"
    threads: int = Field(default=1, ge=1, le=256)
    # The local verdict store: a folder whose verdicts.json is read and appended to (the
    # CLI: ~/.cache/autofusion/measured); None: nothing is kept between runs.
    cache_dir: str | None = None
    # Verdicts to reuse, read only: a verdicts file (the service's prefetch, an export
    # from `autofusion verdicts export`), or several (`optimize --verdicts` repeated).
    verdicts_file: str | list[str] | None = None
    # Verdicts older than this are not reused (docs/measured.md).
    verdict_max_age_days: float = Field(default=30.0, gt=0, le=36_500)
    # At least this many paired runs per comparison, whatever the budget.
    min_runs: int = Field(default=10, ge=6, le=10_000)

    @property
    def verdict_files(self) -> list[str]:
        """``verdicts_file`` as a list (one path, several, or none)."""
        given = self.verdicts_file
        return [] if given is None else [given] if isinstance(given, str) else list(given)


class OptimizeConfig(BaseModel):
    """What to fuse, for which target, and how to check it."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def merged(cls, *layers: Mapping[str, Any]) -> OptimizeConfig:
        """The config of ``merge_options(*layers)``: later layers win, excludes add up."""
        return cls.model_validate(merge_options(*layers))

    target: TargetName = "generic"
    # Only these patterns (by name); None means all that support the target.
    patterns: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    # Extra pattern specs (the same data as a pattern file), applied with the built-ins.
    extra_patterns: list[dict[str, Any]] = Field(default_factory=list)
    max_rounds: int = Field(default=8, ge=1, le=100)
    max_matches_per_pattern: int = Field(default=100_000, ge=1)
    fold_constants: bool = True
    fold_input_size_limit: int = Field(default=1 << 22, ge=0)
    fold_output_size_limit: int = Field(default=1 << 23, ge=0)
    # The bytes the whole fold may add (net: the constants a folded node alone read go
    # with it): fold_growth_ratio x the input's constant bytes + fold_growth_floor_bytes.
    # A value that would pass it stays as the nodes that make it, never computed; the
    # report's ``folding`` lists what was left and why (fusion_core/prepasses/_fold_budget.py).
    fold_growth_ratio: float = Field(default=FOLD_GROWTH_RATIO, ge=0)
    fold_growth_floor_bytes: int = Field(default=FOLD_GROWTH_FLOOR_BYTES, ge=0)
    # The fused model may hold at most output_size_ratio x the input's constant bytes +
    # output_size_floor_bytes of constants (initializers and Constant nodes, external
    # data included); a run past it fails with UnsafeModelError before anything is
    # written (fusion_core/pipeline/size_cap.py). Fused models come out within a few
    # percent of their input; the defaults leave room for the fold budget's growth (at
    # most 2x + 32 MiB) and for a weight a rewrite copies while the original stays read.
    output_size_ratio: float = Field(default=4.0, ge=1)
    output_size_floor_bytes: int = Field(default=64 << 20, ge=0)
    shape_inference: bool = True
    # Convert the model to this opset (default domain) before the pre-passes, so that
    # fusions may emit ops of newer opsets (HardSwish: 14); never downgrades. None: keep
    # the model's opset (fusion_core/prepasses/opset.py).
    upgrade_opset: int | None = Field(default=None, ge=1)
    check: CheckOptions = Field(default_factory=CheckOptions)
    # A failed check fails the run (no fallback): by default it falls back to the
    # largest set of fusions that passes, or the model as it came
    # (fusion_core/pipeline/fallback.py; docs/validation.md).
    strict: bool = False
    # With strict: write (and, in the service, store) the fused model even when the
    # check fails; by default a model that failed its check is never handed out.
    keep_failed: bool = False
    # Fuse in checked stages and roll back only the fusions that break the check
    # (fusion_core.pipeline.progressive; docs/validation.md).
    progressive: bool = False
    # The stages of progressive mode, each a list of pattern-name globs; None: the
    # default stages (fusion_core.pipeline.progressive.DEFAULT_STAGES).
    stages: list[list[str]] | None = Field(default=None, min_length=1, max_length=32)
    # Patterns disabled or enabled by the input shapes (fusion_core/pipeline/switches.py).
    switches: list[Switch] = Field(default_factory=list, max_length=64)
    # The precision the fused model will run in: fp16 adds the range analysis of every
    # fused region (overflow, underflow) and the fp32 block list to the result.
    precision: Literal["fp32", "fp16"] = "fp32"
    # Measure both models' latency and per-op times (fusion_core.profiling) into the
    # report: done by the callers that write reports (CLI, worker), not by optimize().
    profile: bool = False
    # How overlapping candidates are chosen: by pattern priority (the default), or by the
    # cost model's predicted gain with a strategy (fusion_core/strategies/pricing.py). "measured"
    # is ``measure`` with priority proposing (``mode``, ``proposer``).
    selection: Selection = "priority"
    # Measured selection (fusion_core/pipeline/measured/): time the model with and without
    # each group of fusions on this machine and keep a group only when it is faster beyond
    # the noise; ``proposer`` proposes, keeping what the cost model prices as a loss.
    measure: bool = False
    measure_options: MeasureOptions = Field(default_factory=lambda: MeasureOptions())
    # The hardware the cost model prices for: a shipped profile (cpu, gpu) or a path to
    # one written by `autofusion calibrate`.
    target_profile: str = "cpu"
    # What the written model declares of its intermediate values (ONNX value_info): "all"
    # their inferred types and shapes, "none" only the graph's interface; None: what the
    # target profile says (its value_info; fusion_core/pipeline/written.py).
    value_info: Literal["all", "none"] | None = Field(
        default=None,
        description="What the fused model declares of its intermediate values: 'all' their "
        "inferred types and shapes, 'none' only the graph's interface (the runtime infers "
        "the rest); null: the target profile's choice (cpu: none).",
    )
    # Drop candidates predicted to speed their nodes up by less than this ratio
    # (time before / time after), or whose fused working set exceeds this many bytes.
    cost_threshold: float | None = Field(default=None, gt=0)
    memory_limit: int | None = Field(default=None, ge=0)

    # The mode and the proposer are read from the fields users send, not stored: a
    # config is copied with updates (``model_copy`` runs no validator) and sent as JSON
    # with exactly the fields of the OpenAPI document.
    @property
    def mode(self) -> Mode:
        """How ``optimize`` runs, decided here only: ``measured`` (``measure``, or
        selection "measured"), ``progressive`` (``progressive``), or one ``plain`` pass."""
        measured = self.measure or self.selection == "measured"
        if measured and self.progressive:
            raise ConfigError(
                "measured selection and progressive validation cannot be combined",
                hint="use one of them: --selection measured, or --progressive",
            )
        if measured:
            return "measured"
        return "progressive" if self.progressive else "plain"

    @property
    def proposer(self) -> Proposer:
        """The selection each pass runs (fusion_core/strategies/pricing.py): the config's
        own; priority for selection "measured", which is the mode with priority proposing."""
        return "priority" if self.selection == "measured" else self.selection


def read_strategy_file(path: str | os.PathLike) -> dict[str, Any]:
    """The config fields of a strategy file (YAML or JSON; a named strategy's document
    too, its name and description dropped), validated so that an error names the file.
    The reading and the merge are ``fusion_core.options``, which the light client shares."""
    fields = read_options_file(path)
    try:
        OptimizeConfig(**fields)
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not a valid strategy: {exc}", hint="see docs/cost.md, 'Strategy configs'"
        ) from None
    return fields
