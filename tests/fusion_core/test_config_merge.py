"""One merge for strategy options (the CLI, the CI client and the worker)."""

from __future__ import annotations

import pytest

from autofusion.fusion_core.config import OptimizeConfig, merge_options, read_strategy_file
from autofusion.fusion_core.errors import ConfigError


def test_later_layers_win_excludes_add_up_and_sections_merge_by_key() -> None:
    strategy = {"selection": "dp", "exclude": ["a", "b"], "check": {"rtol": 0.1, "seed": 3}}
    job = {"selection": "greedy", "exclude": ["b", "c"], "check": {"rtol": 0.2}}
    assert merge_options(strategy, job) == {
        "selection": "greedy",
        "exclude": ["a", "b", "c"],
        "check": {"rtol": 0.2, "seed": 3},
    }
    config = OptimizeConfig.merged(strategy, job)
    assert config.exclude == ["a", "b", "c"] and config.check.seed == 3


def test_a_strategy_file_is_read_once_the_same_way(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: mine\ndescription: x\nselection: dp\nexclude: [conv_bn]\n")
    assert read_strategy_file(path) == {"selection": "dp", "exclude": ["conv_bn"]}
    path.write_text("selection: nope\n")
    with pytest.raises(ConfigError, match="is not a valid strategy"):
        read_strategy_file(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping of config fields"):
        read_strategy_file(path)
