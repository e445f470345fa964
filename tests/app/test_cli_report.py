"""``autofusion optimize --html/--markdown``: the renderings of the report are written
next to the JSON report, and the exit codes and summary stay as they were."""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import pytest

from autofusion.app.cli import main
from autofusion.fusion_core.report import read_report


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
    svgs = [ET.fromstring(s) for s in re.findall(r"<svg\b.*?</svg>", html, re.S)]
    regions = [svg for svg in svgs if svg.get("class") == "region"]
    assert len(regions) == 2  # the one fused region, before and after
    # Besides them only the check's error histogram (one output): nothing was profiled.
    assert [svg.get("id") for svg in svgs if svg not in regions] == ["chart-error-0"]


def test_optimize_without_the_new_options_writes_no_renderings(capsys, tmp_path, model_path):
    code = main(["optimize", str(model_path), "-o", str(tmp_path / "fused.onnx")])
    capsys.readouterr()

    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx", "model.onnx"]


def _optimize(tmp_path, model_path, *extra: str) -> tuple[int, dict, str]:
    report_path = tmp_path / "report.json"
    code = main(
        ["optimize", str(model_path), "-o", str(tmp_path / "fused.onnx"), "--target",
         "onnxruntime", "--report", str(report_path), *extra]
    )  # fmt: skip
    return code, json.loads(report_path.read_text(encoding="utf-8")), str(tmp_path / "fused.onnx")


def test_optimize_records_the_size_and_no_memory_unprofiled(capsys, tmp_path, model_path):
    code, report, fused = _optimize(tmp_path, model_path)
    out, err = capsys.readouterr()

    assert code == 0, err
    facts = read_report(report)
    assert facts.size_before_bytes == model_path.stat().st_size
    assert facts.size_after_bytes == Path(fused).stat().st_size
    assert report["size"]["after_measured_from"] == "file"
    assert report["memory"] is None and facts.peak_memory_before_bytes is None
    assert "size: " in out and "peak memory" not in out


def test_optimize_profile_records_the_peak_memory(capsys, tmp_path, model_path):
    code, report, _ = _optimize(tmp_path, model_path, "--profile", "--markdown",
                                str(tmp_path / "summary.md"))  # fmt: skip
    out, err = capsys.readouterr()

    assert code == 0, err
    facts = read_report(report)
    assert facts.peak_memory_before_bytes > 0 and facts.peak_memory_after_bytes > 0
    assert report["memory"]["errors"] == []
    assert report["memory"]["allocator_peak_before_bytes"] > 0
    assert "peak memory: " in out and " MiB -> " in out
    markdown = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "**Peak memory:** " in markdown and "not measured" not in markdown


def test_a_failed_check_records_the_serialized_size(capsys, tmp_path, model_path):
    # Folding BN into the conv changes the last bits, which a zero tolerance sees.
    code, report, fused = _optimize(tmp_path, model_path, "--rtol", "0", "--atol", "0", "--strict")
    out, _ = capsys.readouterr()

    assert code != 0 and not Path(fused).exists()
    assert report["size"]["after_measured_from"] == "serialized"
    assert "not written" in out
    kept_dir = tmp_path / "kept"
    kept_dir.mkdir()
    code, kept, fused = _optimize(kept_dir, model_path, "--rtol", "0", "--atol", "0",
                                  "--strict", "--keep-failed")  # fmt: skip
    capsys.readouterr()
    assert kept["size"]["after_measured_from"] == "file"
    # The size it was said to have unwritten is the size it has once written.
    written = Path(fused).stat().st_size
    assert report["size"]["after_bytes"] == kept["size"]["after_bytes"] == written
