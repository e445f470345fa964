"""``autofusion optimize --upgrade-opset N``: the summary and the report say what the
upgrade did; a conversion onnx cannot do exits 2 with one line, never a traceback."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.parser

from autofusion.app.cli import main

HARDSWISH_11 = """<ir_version: 7, opset_import: ["" : 11]>
g (float[2, 4, 6, 6] x) => (float[2, 4, 6, 6] y) {
    a = Add (x, three)
    r = Clip (a, zero, six)
    p = Mul (x, r)
    y = Div (p, six)
}"""
LAYER_NORM_11 = """<ir_version: 7, opset_import: ["" : 11]>
g (float[2, 4, 6] x, float[6] s, float[6] b) => (float[2, 4, 6] y) {
    y = LayerNormalization (x, s, b)
}"""


def _save(tmp_path, text: str, constants: dict[str, float]) -> str:
    model = onnx.parser.parse_model(text)
    for name, value in constants.items():
        array = np.asarray(value, dtype=np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return str(path)


def test_upgrade_opset_emits_hardswish_and_says_so(capsys, tmp_path):
    model = _save(tmp_path, HARDSWISH_11, {"three": 3.0, "zero": 0.0, "six": 6.0})
    out_path, report_path = tmp_path / "fused.onnx", tmp_path / "report.json"
    code = main(
        ["optimize", model, "-o", str(out_path), "--upgrade-opset", "14",
         "--report", str(report_path)]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "upgrade_opset: 11 -> 14" in out
    report = json.loads(report_path.read_text())
    assert report["prepasses"][0] == "upgrade_opset: 11 -> 14"
    assert report["config"]["upgrade_opset"] == 14
    assert report["fusions"] == {"hard_swish_div": 1}
    assert [n.op_type for n in onnx.load(out_path).graph.node] == ["HardSwish"]


def test_a_conversion_that_fails_exits_2_with_one_line(capsys, tmp_path):
    model = _save(tmp_path, LAYER_NORM_11, {})
    code = main(["optimize", model, "-o", str(tmp_path / "fused.onnx"), "--upgrade-opset", "17"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in out + err
    assert "cannot convert this model to opset 17: " in err
    assert err.strip().endswith("run without --upgrade-opset")
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "fused.onnx").exists()
