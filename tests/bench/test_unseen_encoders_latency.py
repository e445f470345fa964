"""The encoder survey's latency script (bench/corpus/bench_unseen_encoders_latency.py): its
sample sizes the batch and the other axes as asked, and one small export goes through
optimize and the interleaved timing to a row per variant, a missing export to a row that
says why instead of ending the table.
"""

import sys
from pathlib import Path

import numpy as np
import onnx

from autofusion.fusion_core.testing import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import bench_unseen_encoders_latency as latency

_TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[batch_size, seq, 16] x, int64[batch_size, seq] mask) => (float[batch_size, seq, 16] y) {
    m = MatMul(x, w)
    a = Add(m, b)
    y = Relu(a)
}
"""


def _model(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    model = build_model(_TEXT, {"w": rng.normal(size=(16, 16)), "b": rng.normal(size=16)})
    path = tmp_path / "tiny_dynamo.onnx"
    onnx.save(model, str(path))
    return path


def test_the_sample_sizes_the_batch_and_the_other_axes(tmp_path):
    feeds = latency.sample(_model(tmp_path), batch=3, length=5)
    assert feeds["x"].shape == (3, 5, 16) and feeds["x"].dtype == np.float32
    assert feeds["mask"].shape == (3, 5) and feeds["mask"].dtype == np.int64


def test_one_export_gives_a_row_per_variant_and_a_missing_one_says_why(tmp_path, capsys):
    _model(tmp_path)
    argv = ["tiny", "absent", "--exports", str(tmp_path), "--exporter", "dynamo"]
    assert latency.main([*argv, "--rounds", "3", "--length", "4", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    original = next(line for line in lines if line.startswith("| tiny (dynamo) | original"))
    after = next(line for line in lines if line.startswith("| tiny (dynamo) | after"))
    assert "| 1.000 [1.000-1.000] | 0.0e+00 |" in original
    assert "check passed" in after and (tmp_path / "after" / "tiny_dynamo.onnx").exists()
    missing = next(line for line in lines if line.startswith("| absent (dynamo) |"))
    assert "absent_dynamo.onnx" in missing
