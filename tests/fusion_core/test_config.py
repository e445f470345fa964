"""The config on its own: validating it loads no engine, and its mode is decided once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.errors import ConfigError

_VALIDATE_A_SWITCH = """
import sys
from autofusion.fusion_core.config import OptimizeConfig
OptimizeConfig.model_validate(
    {"switches": [{"when": "dim('$x', -1) > 1024", "disable": ["conv_bn"]}]}
)
loaded = sorted(m for m in ("onnx", "onnx_ir", "onnxruntime", "numpy") if m in sys.modules)
assert not loaded, loaded
"""


def test_validating_a_switch_loads_no_onnx() -> None:
    # a fresh interpreter: this one has loaded the engine long ago
    run = subprocess.run(
        [sys.executable, "-c", _VALIDATE_A_SWITCH], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(
    ("fields", "mode", "proposer"),
    [
        ({}, "plain", "priority"),
        ({"selection": "dp"}, "plain", "dp"),
        ({"progressive": True}, "progressive", "priority"),
        ({"selection": "measured"}, "measured", "priority"),
        ({"measure": True}, "measured", "priority"),
        ({"measure": True, "selection": "greedy"}, "measured", "greedy"),
    ],
    ids=["default", "dp", "progressive", "selection-measured", "measure", "greedy-measured"],
)
def test_the_mode_and_the_proposer_come_from_the_fields_users_send(fields, mode, proposer):
    config = OptimizeConfig.model_validate(fields)
    assert (config.mode, config.proposer) == (mode, proposer)
    assert "mode" not in config.model_dump()  # the document users send is unchanged


def test_measured_and_progressive_are_refused_together() -> None:
    config = OptimizeConfig(measure=True, progressive=True)
    with pytest.raises(ConfigError, match="cannot be combined"):
        _ = config.mode
