"""What ``autofusion optimize`` does when something goes wrong: one line, a documented
exit code, and no fused model at the output path unless ``--keep-failed`` asks for it.

Exit codes (app.cli): 1 the check failed, 2 the original cannot run on generated inputs
(a usage problem: give --shape or --inputs), 8 an internal error (app/cli/_exit.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import autofusion.app.cli.optimize as optimize_cmd
from autofusion.app.cli import main
from autofusion.app.cli._exit import EXIT_INTERNAL

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _with_conv_bn_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A 3->4 channel 3x3 Conv's weight and a BatchNormalization's statistics, seeded
    and not degenerate, as initializers w, gamma, beta, mean, var."""
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.normal(0, 0.3, (4, 3, 3, 3)),
        "gamma": rng.uniform(0.5, 1.5, 4),
        "beta": rng.normal(0, 0.1, 4),
        "mean": rng.normal(0, 0.1, 4),
        "var": rng.uniform(0.5, 2.0, 4),
    }
    for name, array in params.items():
        tensor = onnx.numpy_helper.from_array(np.asarray(array, np.float32), name)
        model.graph.initializer.append(tensor)
    return model


@pytest.fixture
def rigid_model(tmp_path) -> Path:
    """A Conv+BN whose input height must be 6: no generated size fits it."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, H, 8] x) => (float[1, 4, 6, 8] y) {
        c = Conv<pads = [1, 1, 1, 1]>(x, w)
        b = BatchNormalization(c, gamma, beta, mean, var)
        s = Constant<value = int64[4] {1, 4, 6, 8}>()
        y = Reshape(b, s)
    }"""
    model = _with_conv_bn_weights(onnx.parser.parse_model(text), seed=3)
    path = tmp_path / "rigid.onnx"
    onnx.save(model, path)
    return path


def test_original_that_cannot_run_exits_2_and_names_the_dims(capsys, tmp_path, rigid_model):
    out_path = tmp_path / "fused.onnx"
    code, out, err = run_cli(
        capsys, "optimize", rigid_model, "-o", out_path, "--report", tmp_path / "r.json"
    )
    assert code == 2
    assert "the original model cannot run on generated inputs" in err
    assert "--shape NAME=VALUE for H" in err
    assert "does not match" not in err + out
    assert "Traceback" not in err + out
    assert not out_path.exists()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["check"]["failure"] == "original_cannot_run"
    assert report["check"]["dynamic_dims"] == ["H"]


def test_the_right_shape_makes_it_pass(capsys, tmp_path, rigid_model):
    out_path = tmp_path / "fused.onnx"
    code, out, err = run_cli(capsys, "optimize", rigid_model, "-o", out_path, "--shape", "H=6")
    assert code == 0, err
    assert out_path.exists()


def test_keep_failed_writes_the_unchecked_model(capsys, tmp_path, rigid_model):
    out_path = tmp_path / "fused.onnx"
    code, _, err = run_cli(capsys, "optimize", rigid_model, "-o", out_path, "--keep-failed")
    assert code == 2 and out_path.exists()
    assert "written anyway" in err


def test_a_mismatch_with_strict_exits_1_and_writes_nothing(capsys, tmp_path):
    # Folding BN into the conv changes the last bits: zero tolerance sees it.
    out_path = tmp_path / "fused.onnx"
    zero = ("--rtol", "0", "--atol", "0", "--strict")
    code, out, err = run_cli(capsys, "optimize", RESNET, "-o", out_path, *zero)
    assert code == 1
    assert "does not match the original" in err and "nothing was written" in err
    assert not out_path.exists()
    code, _, err = run_cli(capsys, "optimize", RESNET, "-o", out_path, *zero, "--keep-failed")
    assert code == 1 and out_path.exists()


def test_a_mismatch_falls_back_to_the_fusions_that_pass_and_exits_0(capsys, tmp_path):
    """Without --strict the failed check falls back: the Conv+BN fold (whose last bits
    differ at zero tolerance) is dropped in each form progressive validation tries, the
    model written is the one that passes, exit 0 and a warning."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
        c = Conv<pads = [1, 1, 1, 1]>(x, w)
        b = BatchNormalization(c, gamma, beta, mean, var)
        y = Relu(b)
    }"""
    model = _with_conv_bn_weights(onnx.parser.parse_model(text), seed=5)
    path, out_path, report = tmp_path / "m.onnx", tmp_path / "fused.onnx", tmp_path / "r.json"
    onnx.save(model, path)
    code, out, err = run_cli(
        capsys, "optimize", path, "-o", out_path, "--rtol", "0", "--atol", "0",
        "--target", "generic", "--report", report,
    )  # fmt: skip
    assert code == 0, err
    assert out_path.exists()
    assert "warning: the fused model does not match the original" in err
    assert "fell back" in err and "--strict" in err
    fallback = json.loads(report.read_text())["fallback"]
    assert fallback["failure"] == "mismatch" and fallback["fusions_tried"] == 1
    assert {d["pattern"] for d in fallback["dropped"]} == {"conv_bn", "conv_bn_relu"}
    assert json.loads(report.read_text())["check"]["passed"] is True
    fused = onnx.load(out_path)
    assert [n.op_type for n in fused.graph.node] == ["Conv", "BatchNormalization", "Relu"]


def test_a_rewrite_that_raises_is_taken_back_with_a_reproducer(capsys, tmp_path, monkeypatch):
    """A rewriter bug costs its match only: exit 0, the rest fused, the report's rejected
    names it and reproducers.zip holds the matched region as a model onnxruntime runs."""
    import zipfile

    from autofusion.fusion_core.rewriters.silu import FuseSiLU
    from autofusion.fusion_core.validate import make_session

    def broken(self, match, params, ctx):
        raise IndexError("a rewriter with a bug")

    monkeypatch.setattr(FuseSiLU, "rewrite", broken)
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 8] x) => (float[2, 8] y) {
        s = Sigmoid(x)
        m = Mul(x, s)
        y = Relu(m)
    }"""
    path, out_path, report = tmp_path / "m.onnx", tmp_path / "fused.onnx", tmp_path / "r.json"
    onnx.save(onnx.parser.parse_model(text), path)
    code, out, err = run_cli(
        capsys, "optimize", path, "-o", out_path, "--target", "onnxruntime", "--report", report
    )
    assert code == 0, err
    assert "rejected as a bug: rewrite 'silu'" in out and "IndexError" in out
    [rejected] = json.loads(report.read_text())["rejected"]
    assert rejected["reproducer"] == "reproducer-1-silu.onnx"
    with zipfile.ZipFile(tmp_path / "fused.reproducers.zip") as archive:
        assert archive.namelist() == ["reproducer-1-silu.onnx"]
        region = onnx.load_from_string(archive.read("reproducer-1-silu.onnx"))
    assert [n.op_type for n in region.graph.node] == ["Sigmoid", "Mul"]
    onnx.checker.check_model(region, full_check=True)
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    (got,) = make_session(region).run(None, {"x": x})
    np.testing.assert_allclose(got, x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-6)


def test_an_internal_error_is_one_line_with_exit_internal(capsys, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(optimize_cmd, "run_files", broken)
    monkeypatch.delenv("AUTOFUSION_DEBUG", raising=False)
    code, out, err = run_cli(capsys, "optimize", RESNET, "-o", tmp_path / "f.onnx")
    assert code == EXIT_INTERNAL
    assert "Traceback" not in err + out
    assert "internal error: RuntimeError" in err and "something inside broke" in err
    assert "second line" not in err
    assert "AUTOFUSION_DEBUG=1" in err
