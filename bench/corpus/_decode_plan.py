"""What one run of ``decode_steps_unseen.py`` measures, and its defaults.

Why a module of its own: the decode, the torch reference and the table all read these
(the table names a row by how it differs from the defaults).
"""

from __future__ import annotations

from typing import NamedTuple

BATCH, LENGTH, PADDING, STEPS = 2, 16, 5, 6
ATOL, RELATIVE = 1e-4, 1e-5


class Plan(NamedTuple):
    """What one run measures: the decode's length, the padded row's padding, the patterns
    excluded from the fusion, and whether torch is run too."""

    steps: int = STEPS
    padding: int = PADDING
    disable: tuple[str, ...] = ()
    with_torch: bool = False

    def suffix(self) -> str:
        """Names a saved row of a run other than the default."""
        default = (self.steps, self.padding) == (STEPS, PADDING)
        shape = "" if default else f".s{self.steps}p{self.padding}"
        return shape + "".join(f".no-{name}" for name in self.disable)
