"""The cap on the fused model's size (fusion_core/pipeline/size_cap.py): past
``output_size_ratio`` x the input's constant bytes + ``output_size_floor_bytes`` the run
fails with an error naming the sizes and the options, before anything is written.

The model is ``testing.constant_fills``: 20 ConstantOfShape fills of 512x1024 (2 MiB
each), folded with no fold budget to speak of so that the cap is what stops them.
"""

from __future__ import annotations

import onnx
import pytest

from autofusion.fusion_core import (
    OptimizeConfig,
    RunFiles,
    UnsafeModelError,
    optimize,
    run,
    testing,
)
from autofusion.fusion_core.prepasses import constant_bytes
from autofusion.worker.sandbox import OPTIMIZE

FILLS = 20
FILL_BYTES = 512 * 1024 * 4
FUSED_BYTES = FILLS * FILL_BYTES  # every fill folded: its shape and value go with it
INPUT_BYTES = 16 + FILLS * 4  # the int64[2] shape and each fill's float value
NO_FOLD_BUDGET = {"fold_growth_ratio": 0.0, "fold_growth_floor_bytes": 1 << 40}


def _config(floor: int, **more) -> OptimizeConfig:
    return OptimizeConfig(
        output_size_ratio=1.0, output_size_floor_bytes=floor, **NO_FOLD_BUDGET, **more
    )


def test_a_fused_model_past_the_cap_fails_naming_sizes_and_options() -> None:
    model = testing.constant_fills(FILLS, (512, 1024))
    with pytest.raises(UnsafeModelError) as raised:
        optimize(model, _config(1 << 20, check={"enabled": False}))

    message = str(raised.value)
    assert f"would hold {FUSED_BYTES} bytes of constants" in message
    assert (
        f"the cap of {INPUT_BYTES + (1 << 20)} bytes for an input holding {INPUT_BYTES}" in message
    )
    assert "output_size_ratio 1 x the input + output_size_floor_bytes 1048576" in message
    # The worker's sandbox tells the user it is the model, not a bug of ours.
    assert OPTIMIZE.describe(raised.value) == {"kind": "model", "message": message}


@pytest.mark.parametrize(
    ("floor", "fails"),
    [
        pytest.param(FUSED_BYTES - INPUT_BYTES, False, id="at-the-cap"),
        pytest.param(FUSED_BYTES - INPUT_BYTES - 1, True, id="one-byte-over"),
    ],
)
def test_the_cap_is_ratio_times_input_plus_floor(floor: int, fails: bool) -> None:
    model = testing.constant_fills(FILLS, (512, 1024))
    config = _config(floor, check={"enabled": False})
    if fails:
        with pytest.raises(UnsafeModelError):
            optimize(model, config)
    else:
        assert optimize(model, config).input_bytes == INPUT_BYTES


def test_run_writes_nothing_past_the_cap(tmp_path) -> None:
    model_path, output = tmp_path / "fills.onnx", tmp_path / "out" / "fused.onnx"
    onnx.save(testing.constant_fills(FILLS, (512, 1024)), model_path)
    files = RunFiles(report=tmp_path / "out" / "report.json")

    with pytest.raises(UnsafeModelError):
        run(model_path, output, _config(1 << 20), files=files)
    assert not (tmp_path / "out").exists()


def test_a_fused_model_is_about_as_large_as_its_input() -> None:
    """What the default cap (4x + 64 MiB) leaves room around: twelve Conv+BN blocks
    fused keep their constants' size within a few percent (the BN folded away)."""
    result = optimize(testing.deep_conv_net(12), OptimizeConfig())

    assert result.check is not None and result.check.passed
    assert len(result.applied) == 12
    assert result.input_bytes is not None
    assert 0.9 <= constant_bytes(result.model) / result.input_bytes <= 1.0
