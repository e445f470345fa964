"""The cap on the fused model's size: ``check_output_size``.

A fused model is about as large as the one it came from (fusions fold a BatchNorm into
a weight, or concatenate three projections into one: the constants change form, not
size), so a run that would hand back many times the input's bytes is a model built to
fill the disk, not an optimization. The measure is the bytes of constants
(``prepasses.constant_bytes``: initializers and Constant nodes, external data included),
counted in memory before anything is written, on both sides: the graph's own protobuf
is small beside them and stays near the input's.
"""

from __future__ import annotations

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.errors import UnsafeModelError
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.prepasses import constant_bytes

__all__ = ["check_output_size", "output_cap"]


def output_cap(input_bytes: int, config: OptimizeConfig) -> int:
    """The most bytes of constants a fused model may hold, for an input holding
    ``input_bytes``."""
    return int(config.output_size_ratio * input_bytes) + config.output_size_floor_bytes


def check_output_size(result: Result, config: OptimizeConfig) -> None:
    """Raise UnsafeModelError when ``result.model`` holds more bytes of constants than
    the config allows relative to the input (``result.input_bytes``; not measured: no
    cap)."""
    if result.input_bytes is None:
        return
    cap = output_cap(result.input_bytes, config)
    fused = constant_bytes(result.model)
    if fused <= cap:
        return
    raise UnsafeModelError(
        f"the fused model would hold {fused} bytes of constants, more than the cap of "
        f"{cap} bytes for an input holding {result.input_bytes} "
        f"(output_size_ratio {config.output_size_ratio:g} x the input + "
        f"output_size_floor_bytes {config.output_size_floor_bytes}); nothing was written",
        hint="a model that grows this much is usually built to (many ConstantOfShape or "
        "Expand of large shapes); if yours is meant to, raise output_size_ratio or "
        "output_size_floor_bytes in the job's config",
    )
