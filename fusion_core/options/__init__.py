"""Config options as plain data, with no pydantic: layers merged (``merge_options``) and
a strategy file read (``read_options_file``). The worker, ``autofusion optimize`` and the
CI client of the base install (``autofusion submit --strategy FILE``, which has no
engine) all merge and read them here; ``fusion_core.config`` validates the fields."""

from autofusion.fusion_core.options._options import (
    SECTIONS,
    STRATEGY_ONLY_FIELDS,
    merge_options,
    read_options_file,
)

__all__ = ["SECTIONS", "STRATEGY_ONLY_FIELDS", "merge_options", "read_options_file"]
