"""The config on its own: validating it loads no engine, and its mode is decided once."""

from __future__ import annotations

import subprocess
import sys

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
