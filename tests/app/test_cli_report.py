"""``autofusion optimize --html/--markdown``: the renderings of the report are written
next to the JSON report, and the exit codes and summary stay as they were."""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import pytest

from app.cli import main


@pytest.fixture
def model_path(tmp_path):
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1,3,8,8] x) => (float[1,4,8,8] y) {\n"
        " c = Conv<pads = [1, 1, 1, 1]>(x, w)\n"
        " n = BatchNormalization(c, gamma, beta, mean, var)\n"
        " y = Relu(n)\n}"
    )
    rng = np.random.default_rng(5)
    arrays = {
        "w": rng.normal(0, 0.3, (4, 3, 3, 3)),
        "gamma": rng.uniform(0.5, 1.5, 4),
        "beta": rng.normal(0, 0.1, 4),
        "mean": rng.normal(0, 0.1, 4),
        "var": rng.uniform(0.5, 2.0, 4),
    }
    model.graph.initializer.extend(
        nh.from_array(a.astype(np.float32), n) for n, a in arrays.items()
    )
    model.graph.node[0].name = "<script>alert(1)</script>"
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def test_optimize_writes_html_and_markdown(capsys, tmp_path, model_path):
    out_dir = tmp_path / "out"
    code = main(
        [
            "optimize",
            str(model_path),
            "-o",
            str(out_dir / "fused.onnx"),
            "--target",
            "onnxruntime",
            "--report",
            str(out_dir / "report.json"),
            "--html",
            str(out_dir / "html" / "report.html"),
            "--markdown",
            str(out_dir / "summary.md"),
        ]
    )
    out, err = capsys.readouterr()

    assert code == 0, err
    assert "conv_bn_relu" in out  # the terminal summary is unchanged
    report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    assert report["report_version"] == 2
    assert report["config"]["target"] == "onnxruntime"
    fused_sha = hashlib.sha256((out_dir / "fused.onnx").read_bytes()).hexdigest()
    assert report["digests"]["output_sha256"] == fused_sha

    markdown = (out_dir / "summary.md").read_text(encoding="utf-8")
    assert "| conv_bn_relu | 1 |" in markdown
    assert "**Check:** passed" in markdown

    html = (out_dir / "html" / "report.html").read_text(encoding="utf-8")
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    regions = [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", html, re.S)]
    assert len(regions) == 2  # the one fused region, before and after
    assert 'id="chart-' not in html  # nothing was profiled


def test_optimize_without_the_new_options_writes_no_renderings(capsys, tmp_path, model_path):
    code = main(["optimize", str(model_path), "-o", str(tmp_path / "fused.onnx")])
    capsys.readouterr()

    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx", "model.onnx"]
