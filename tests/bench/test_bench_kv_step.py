"""bench/corpus/bench_kv_step.py: the decode step's inputs read from the graph (the
padded row's mask and positions, the past states' free axes) and a run of two variants."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx.parser
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import bench_kv_step as kv_step

STEP = """<ir_version: 8, opset_import: ["" : 18]>
step (int64[batch, 1] input_ids, int64[batch, total] attention_mask,
      int64[batch, 1] position_ids, float[batch, 2, past, 4] past_key)
    => (float[batch, 2, total, 4] present_key, float[batch, total] weights) {
    new = Cast <to = 1> (input_ids)
    wide = Unsqueeze (new, axes)
    grown = Expand (wide, shape_new)
    present_key = Concat <axis = 2> (past_key, grown)
    weights = Cast <to = 1> (attention_mask)
}"""


def _model() -> onnx.ModelProto:
    model = onnx.parser.parse_model(STEP)
    model.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
            onnx.numpy_helper.from_array(np.array([1, 2, 1, 4], np.int64), "shape_new"),
        ]
    )
    return model


def test_the_step_feeds_follow_the_graph() -> None:
    feeds = kv_step.step_feeds(_model(), batch=3, past=7, pad=2)
    assert feeds["past_key"].shape == (3, 2, 7, 4)
    assert feeds["input_ids"].shape == (3, 1)
    mask = feeds["attention_mask"]
    assert mask.shape == (3, 8) and mask[-1, :2].sum() == 0 and mask[0].all()
    assert feeds["position_ids"][:, 0].tolist() == [7, 7, 5]  # the padded row starts later


def test_two_variants_run_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "step.onnx"
    onnx.save(_model(), path)
    code = kv_step.main([f"a={path}", f"b={path}", "--past", "4", "--rounds", "3", "--warmup", "1"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "b: largest difference from a: 0" in printed
    assert "paired ratio 1.000" in printed  # the base against itself
