"""Dynamic switches: patterns turned off (or on) by the input shapes of a job.

A fusion that pays on small inputs can lose on large ones (its fused kernel's working
set no longer fits a cache), so a strategy can say, for example::

    switches:
      - when: "dim('$pixel_values', -1) > 1024"
        disable: [conv_bn_relu]

``when`` is one comparison (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``) between two
formulas of the pattern language (``fusion_core.patterns.compile_condition``: numbers,
``+ - * / **``, ``sqrt`` and ``dim(ref, axis)``), where ``ref`` names a graph input as
``'$name'``. Like a pattern's formula it is parsed with ``ast`` and walked by our own
evaluator, so a strategy sent to the service cannot run code.

A dimension is read from the graph; a symbolic one takes its value from each of the
check's shape profiles (``CheckOptions.shape_profiles``). A ``disable`` switch fires
when its condition holds in any profile (a pattern that may hurt one of the shapes the
model will see is left out); an ``enable`` switch fires only when it holds in every
profile. A condition that cannot be decided (an unknown input, a symbolic dimension no
profile names) does not fire, and the outcome says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.patterns import FormulaError, compile_condition

if TYPE_CHECKING:
    from autofusion.fusion_core.config import OptimizeConfig, Switch

__all__ = ["SwitchOutcome", "resolve_switches"]


@dataclass(frozen=True)
class SwitchOutcome:
    when: str
    action: str  # "disable" or "enable"
    patterns: list[str]
    fired: bool
    # Per shape profile: True/False, or why the condition could not be decided there.
    per_profile: list[bool | str]

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_switches(
    config: OptimizeConfig, model: ir.Model
) -> tuple[OptimizeConfig, list[SwitchOutcome]]:
    """``config`` with its switches applied to ``patterns``/``exclude`` (and cleared)."""
    if not config.switches:
        return config, []
    inputs = {v.name: v for v in model.graph.inputs}
    profiles = config.check.shape_profiles()
    patterns = None if config.patterns is None else list(config.patterns)
    exclude = list(config.exclude)
    outcomes = []
    for switch in config.switches:
        outcome = _outcome(switch, inputs, profiles)
        outcomes.append(outcome)
        if not outcome.fired:
            continue
        if switch.disable:
            exclude += [p for p in switch.disable if p not in exclude]
        else:
            exclude = [p for p in exclude if p not in switch.enable]
            if patterns is not None:
                patterns += [p for p in switch.enable if p not in patterns]
    update = {"patterns": patterns, "exclude": exclude, "switches": []}
    return config.model_copy(update=update), outcomes


def _outcome(
    switch: Switch, inputs: Mapping[str, ir.Value], profiles: Sequence[Mapping[str, int]]
) -> SwitchOutcome:
    try:
        condition = compile_condition(switch.when)
    except FormulaError as exc:  # the config validates it; a library caller may not have
        raise ConfigError(f"switch: {exc}", hint="see docs/cost.md, 'Dynamic switches'") from None
    per_profile = [
        condition.evaluate(lambda ref, axis, p=profile: _dim(inputs, p, ref, axis))
        for profile in profiles
    ]
    decided = [v for v in per_profile if isinstance(v, bool)]
    # disable: in any profile; enable: decided and true in every profile
    every = len(decided) == len(per_profile) and all(decided)
    fired = any(decided) if switch.disable else every
    action = "disable" if switch.disable else "enable"
    names = list(switch.disable or switch.enable)
    return SwitchOutcome(switch.when, action, names, fired, per_profile)


def _dim(inputs: Mapping[str, ir.Value], profile: Mapping[str, int], ref: str, axis: int):
    name = ref[1:]
    value = inputs.get(name)
    if value is None:
        return f"the model has no input {name!r} (inputs: {sorted(inputs)})"
    if value.shape is None:
        return f"input {name!r} has no shape"
    rank = len(value.shape)
    if not -rank <= axis < rank:
        return f"input {name!r} has rank {rank}: axis {axis} is out of range"
    dim = value.shape[axis]
    if isinstance(dim, int):
        return dim
    symbol = getattr(dim, "value", None)
    if symbol in profile:
        return int(profile[symbol])
    return f"dimension {axis} of {name!r} is symbolic ({symbol!r}) and no shape profile names it"
