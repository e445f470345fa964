"""The example budget and hypothesis settings the generated spelling tests share.

``AUTOFUSION_SPELLING_EXAMPLES`` is the budget (25 in ``make test``, 200 in the corpus
tier); derandomized so that ``make test`` draws the same examples each run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("AUTOFUSION_SPELLING_EXAMPLES", "25"))
SPELLINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
