"""``autofusion compare``: outputs, shared intermediate tensors and fused regions."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser

from autofusion.app.cli import main
from autofusion.fusion_core import OptimizeConfig, optimize, save_model


def _model(scale: float = 1.0) -> onnx.ModelProto:
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 8] x) => (float[2, 4] y) {
        p = MatMul (x, w)
        s = Add (p, b)
        y = Relu (s)
    }"""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (8, 4)).astype(np.float32)
    w[:, 0] *= scale  # column 0 differs when scale != 1
    model.graph.initializer.extend(
        [nh.from_array(w, "w"), nh.from_array(np.full(4, 0.5, np.float32), "b")]
    )
    return model


def test_same_models_match(tmp_path, capsys):
    onnx.save(_model(), tmp_path / "a.onnx")
    onnx.save(_model(), tmp_path / "b.onnx")
    assert main(["compare", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")]) == 0
    out = capsys.readouterr().out
    assert "outputs match" in out and "intermediate tensors named in both: 2, 0 differ" in out


def test_different_models_name_the_tensors_that_differ(tmp_path, capsys):
    onnx.save(_model(), tmp_path / "a.onnx")
    onnx.save(_model(scale=3.0), tmp_path / "b.onnx")
    report = tmp_path / "compare.json"
    code = main(
        ["compare", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--json", str(report)]
    )
    assert code == 1
    out = capsys.readouterr().out
    assert "outputs DIFFER" in out and "2 differ" in out
    data = json.loads(report.read_text())
    assert data["tensors"]["p"]["passed"] is False and data["check"]["passed"] is False


def test_a_fused_model_is_compared_region_by_region(tmp_path, capsys):
    onnx.save(_model(), tmp_path / "a.onnx")
    result = optimize(tmp_path / "a.onnx", OptimizeConfig(target="generic"))
    save_model(result.model, tmp_path / "fused.onnx")
    assert main(["compare", str(tmp_path / "a.onnx"), str(tmp_path / "fused.onnx")]) == 0
    assert "fused regions: 1, first that drifts: none" in capsys.readouterr().out


def test_missing_model_exits_3(tmp_path, capsys):
    onnx.save(_model(), tmp_path / "a.onnx")
    assert main(["compare", str(tmp_path / "a.onnx"), str(tmp_path / "nowhere.onnx")]) == 3
    assert "does not exist" in capsys.readouterr().err


def test_optimize_validation_options_reach_the_report(tmp_path, capsys):
    """--progressive, --precision fp16, --shape, --inputs and --profile, end to end."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8] x) => (float[N, 4] y) {
        p = MatMul (x, w)
        y = Add (p, b)
    }"""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(
        [
            nh.from_array(rng.normal(0, 1, (8, 4)).astype(np.float32), "w"),
            nh.from_array(np.full(4, 0.5, np.float32), "b"),
        ]
    )
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "inputs.npz", x=rng.normal(0, 1, (5, 8)).astype(np.float32))
    out, report = tmp_path / "fused.onnx", tmp_path / "report.json"
    base = ["optimize", str(tmp_path / "m.onnx"), "-o", str(out), "--report", str(report)]
    options = ["--progressive", "--precision", "fp16", "--profile"]
    assert main([*base, *options, "--shape", "N=2", "--shape", "N=7"]) == 0
    data = json.loads(report.read_text())
    assert data["rollbacks"] == [] and data["fusions"] == {"matmul_add": 1}
    assert data["precision"]["flags"] == []
    assert [p["dims"] for p in data["check"]["profiles"]] == [{"N": 2}, {"N": 7}]
    assert {level["level"] for level in data["profile"]["latency"]} == {
        "ORT_ENABLE_ALL",
        "ORT_DISABLE_ALL",
    }
    out = capsys.readouterr().out
    # the one verdict's words first, then the speedup (fusion_core/report/_verdict.py)
    speed_line = next(line for line in out.splitlines() if line.startswith("speed: "))
    assert f"({data['speed']['speedup']:.2f}x)" in speed_line, speed_line
    assert data["speed"]["level"] == "ORT_ENABLE_ALL" and data["speed"]["runs"] > 0
    assert "at ORT_DISABLE_ALL: fused/original" in out

    assert main([*base, "--inputs", str(tmp_path / "inputs.npz")]) == 0
    assert json.loads(report.read_text())["check"]["samples"] == 1
    assert main([*base, "--shape", "N"]) == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err
