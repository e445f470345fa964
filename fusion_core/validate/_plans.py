"""The check's plan: which shape profiles it runs, with which seeds or feeds, and each
output's tolerance. A profile whose sequence the check chose is followed by a second
length (``SECOND_LENGTH_WHY``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.validate._dims import (
    InputDims,
    candidate_dims,
    input_dims,
    second_length_dims,
)
from autofusion.fusion_core.validate._result import ProfileCheck
from autofusion.fusion_core.validate._stats import Tolerance, default_tolerance

__all__ = [
    "SECOND_LENGTH_SAMPLES",
    "SECOND_LENGTH_WHY",
    "Plan",
    "checked_tolerances",
    "make_plans",
    "tolerance_for",
]


# The profile the check adds after each one whose sequence it chose (validate/_dims.py,
# second_length_dims): a fusion wrong at lengths 16 hides (a lost cut of padded rows)
SECOND_LENGTH_WHY = (
    "a second sequence length: a model that pads the sequence to a multiple of a chunk "
    "computes the same at 16 for every chunk dividing 16, a wrong fusion of it too"
)
SECOND_LENGTH_SAMPLES = 1  # enough to see a wrong shape or value; each sample costs a run


@dataclass
class Plan:
    given: dict[str, int]  # the sizes the caller gave
    seeds: list[int]
    feeds: list[Mapping[str, np.ndarray]] | None
    check: ProfileCheck  # its dims are every free name's size, once settled
    info: InputDims | None = None
    follows: Plan | None = None  # a second length: the plan whose settled sizes it varies
    index_of_follows: int = -1

    @property
    def samples(self) -> int:
        return self.check.samples


def make_plans(
    model: onnx.ModelProto,
    samples: int,
    seed: int,
    dims: Mapping[str, int] | None,
    profiles: Sequence[Mapping[str, int]] | None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None,
) -> list[Plan]:
    if feeds:
        return [Plan({}, [], list(feeds), ProfileCheck({}, len(feeds), []))]
    info = input_dims(model)
    asked = []
    for p, profile in enumerate(profiles or [dims or {}]):
        _check_profile(profile, info.names, p)
        used = candidate_dims(info, profile, 0)
        seeds = [seed + p * samples + j for j in range(samples)]
        asked.append(Plan(dict(profile), seeds, None, ProfileCheck(used, samples, seeds), info))
    return _with_second_lengths(asked, seed + len(asked) * samples)


def _with_second_lengths(asked: list[Plan], next_seed: int) -> list[Plan]:
    """``asked``, each followed by its second sequence length where it has a sequence the
    caller left to the check (``second_length_dims``); their seeds from ``next_seed`` on."""
    plans: list[Plan] = []
    for plan in asked:
        plans.append(plan)
        info = plan.info
        if info is None or second_length_dims(info, plan.check.dims, plan.given) is None:
            continue
        seeds = list(range(next_seed, next_seed + SECOND_LENGTH_SAMPLES))
        next_seed += SECOND_LENGTH_SAMPLES
        check = ProfileCheck({}, SECOND_LENGTH_SAMPLES, seeds, added=SECOND_LENGTH_WHY)
        extra = Plan(dict(plan.given), seeds, None, check, info, plan, len(plans) - 1)
        plans.append(extra)
    return plans


def _check_profile(profile: Mapping[str, int], symbolic: list[str], index: int) -> None:
    unknown = sorted(set(profile) - set(symbolic))
    if unknown:
        raise ConfigError(
            f"shape profile {index} names {unknown}, which no model input has as a "
            f"symbolic dimension",
            hint=f"the model's symbolic dimensions are {symbolic or 'none'}",
        )
    bad = {k: v for k, v in profile.items() if not isinstance(v, (int, np.integer)) or v < 1}
    if bad:
        raise ConfigError(
            f"shape profile {index} gives {bad}: dimensions must be whole numbers >= 1",
            hint='e.g. {"batch": 1, "sequence": 16}',
        )


def checked_tolerances(
    tolerances: Mapping[str, Mapping[str, float]], outputs: list[str]
) -> dict[str, Mapping[str, float]]:
    for name, tol in tolerances.items():
        if name not in outputs:
            raise ConfigError(
                f"tolerances name output {name!r}, which the model does not have",
                hint=f"the model's outputs are {outputs}",
            )
        wrong = sorted(set(tol) - {"rtol", "atol"})
        negative = {k: v for k, v in tol.items() if k in ("rtol", "atol") and not v >= 0}
        if wrong or negative:
            raise ConfigError(
                f"tolerance for output {name!r} is {dict(tol)}",
                hint='give {"rtol": r, "atol": a} with r, a >= 0 (either may be left out)',
            )
    return dict(tolerances)


def tolerance_for(
    dtype: str, rtol: float, atol: float, override: Mapping[str, float] | None
) -> Tolerance:
    default = default_tolerance(dtype, rtol, atol)
    if not override:
        return default
    return Tolerance(
        float(override.get("rtol", default.rtol)),
        float(override.get("atol", default.atol)),
        "override",
    )
