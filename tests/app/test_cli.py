"""The ``autofusion`` command line: run in-process through ``app.cli.main`` (plus one
real subprocess), checking exit codes, files written, the report and the summary.

Exit codes: 0 ok, 1 check failed, 2 usage/config, 3 bad model, 4 bad pattern file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from autofusion.app.cli import main
from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_USAGE
from autofusion.fusion_core import builtin_patterns, load_model

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"
REPORT_KEYS = {"target", "fusions", "near_misses", "nodes", "timings_s", "check"}

EXTRA_PATTERN = """\
patterns:
  - name: head.gap_flatten
    description: the classifier head's pooling and flattening as one op
    nodes:
      - {id: pool, op: GlobalAveragePool}
      - {id: flat, op: Flatten, inputs: {0: pool}}
    rewriter: {name: fused_region, params: {domain: ai.test, op_type: GapFlatten}}
"""
INVALID_PATTERN = """\
- name: broken
  nodes:
    - {id: conv, op: Convv}
    - {id: act, op: Relu, inputs: {0: conv}}
  rewriter: {name: fused_region}
"""


def run_cli(capsys, *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def optimize_resnet(capsys, tmp_path, *options: str | Path) -> tuple[int, str, str, dict]:
    """Run ``optimize`` on the ResNet test model; return exit code, output and report."""
    code, out, err = run_cli(
        capsys,
        "optimize",
        RESNET,
        "-o",
        tmp_path / "fused.onnx",
        "--target",
        "onnxruntime",
        "--report",
        tmp_path / "report.json",
        *options,
    )
    report_path = tmp_path / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return code, out, err, report


def op_types(path: Path) -> set[str]:
    return {f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in load_model(path).graph}


@pytest.fixture
def extra_pattern_file(tmp_path) -> Path:
    path = tmp_path / "extra.yaml"
    path.write_text(EXTRA_PATTERN, encoding="utf-8")
    return path


@pytest.fixture
def invalid_pattern_file(tmp_path) -> Path:
    path = tmp_path / "invalid.yaml"
    path.write_text(INVALID_PATTERN, encoding="utf-8")
    return path


# --- optimize ------------------------------------------------------------------------


def test_optimize_resnet_for_onnxruntime(capsys, tmp_path):
    code, out, err, report = optimize_resnet(capsys, tmp_path)

    assert code == 0, err
    fused = tmp_path / "fused.onnx"
    onnx.checker.check_model(onnx.load(fused), full_check=True)
    assert "BatchNormalization" not in op_types(fused)
    assert set(report) >= REPORT_KEYS
    assert report["target"] == "onnxruntime"
    assert report["check"]["passed"] is True
    assert report["fusions"]["conv_bn_add_relu"] == 16
    assert report["nodes"]["by_op_before"]["BatchNormalization"] == 53
    assert "BatchNormalization" not in report["nodes"]["by_op_after"]
    assert "conv_bn_add_relu" in out
    assert "max abs diff" in out


def test_optimize_only_the_named_patterns(capsys, tmp_path):
    code, _, err, report = optimize_resnet(capsys, tmp_path, "--patterns", "conv_bn")

    assert code == 0, err
    assert report["patterns_used"] == ["conv_bn"]
    assert set(report["fusions"]) == {"conv_bn"}
    assert report["fusions"]["conv_bn"] == 53
    assert "com.microsoft::FusedConv" not in op_types(tmp_path / "fused.onnx")


def test_optimize_excludes_the_named_patterns(capsys, tmp_path):
    code, _, err, report = optimize_resnet(capsys, tmp_path, "--exclude", "conv_bn_add_relu")

    assert code == 0, err
    assert "conv_bn_add_relu" not in report["patterns_used"]
    assert "conv_bn_add_relu" not in report["fusions"]
    assert report["fusions"], "the other patterns still apply"
    assert report["check"]["passed"] is True


def test_optimize_no_check_leaves_check_null(capsys, tmp_path):
    code, out, err, report = optimize_resnet(capsys, tmp_path, "--no-check")

    assert code == 0, err
    assert report["check"] is None
    assert "check: skipped" in out
    assert "max abs diff" not in out


def test_optimize_applies_an_extra_pattern_file(capsys, tmp_path, extra_pattern_file):
    code, out, err, report = optimize_resnet(capsys, tmp_path, "--pattern-file", extra_pattern_file)

    assert code == 0, err
    assert report["fusions"]["head.gap_flatten"] == 1
    assert report["check"]["passed"] is True
    ops = op_types(tmp_path / "fused.onnx")
    assert "ai.test::GapFlatten" in ops
    assert "GlobalAveragePool" not in ops
    assert "head.gap_flatten" in out


def test_optimize_with_an_invalid_pattern_file_exits_3(capsys, tmp_path, invalid_pattern_file):
    code, out, err, report = optimize_resnet(
        capsys, tmp_path, "--pattern-file", invalid_pattern_file
    )

    assert code == EXIT_BAD_INPUT
    assert "nodes.0.op" in err
    assert "Convv" in err
    assert not (tmp_path / "fused.onnx").exists()
    assert report == {}


def test_optimize_refuses_a_pattern_file_that_reuses_a_builtin_name(capsys, tmp_path):
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(EXTRA_PATTERN.replace("head.gap_flatten", "conv_bn"), encoding="utf-8")

    code, _, err, _ = optimize_resnet(capsys, tmp_path, "--pattern-file", shadow)

    # Both patterns are called conv_bn: silently mixing them would rewrite the built-in
    # conv_bn matches with the file's rewriter.
    assert code in (EXIT_USAGE, EXIT_BAD_INPUT)
    assert "conv_bn" in err
    assert not (tmp_path / "fused.onnx").exists()


def test_optimize_with_a_missing_pattern_file_exits_3(capsys, tmp_path):
    code, _, err, _ = optimize_resnet(capsys, tmp_path, "--pattern-file", tmp_path / "no.yaml")

    assert code == EXIT_BAD_INPUT
    assert "no.yaml" in err


def test_optimize_missing_model_exits_3(capsys, tmp_path):
    code, _, err = run_cli(capsys, "optimize", tmp_path / "nowhere.onnx", "-o", tmp_path / "o.onnx")

    assert code == 3
    assert "nowhere.onnx" in err
    assert "does not exist" in err
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"this is a text file, not a model\n", id="text"),
        pytest.param(bytes(range(256)) * 8, id="binary"),
    ],
)
def test_optimize_non_onnx_file_exits_3(capsys, tmp_path, content):
    model = tmp_path / "model.onnx"
    model.write_bytes(content)

    code, _, err = run_cli(capsys, "optimize", model, "-o", tmp_path / "o.onnx")

    assert code == 3
    assert "model.onnx" in err
    assert not (tmp_path / "o.onnx").exists()


def test_optimize_unsafe_model_exits_3(capsys, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    proto = onnx.load(RESNET)
    onnx.save_model(
        proto,
        folder / "model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    tampered = onnx.load(folder / "model.onnx", load_external_data=False)
    for entry in tampered.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../etc/passwd"
    onnx.save_model(tampered, folder / "model.onnx")

    code, _, err = run_cli(capsys, "optimize", folder / "model.onnx", "-o", tmp_path / "o.onnx")

    assert code == 3
    assert "outside the model's folder" in err


def test_optimize_unknown_pattern_name_exits_2(capsys, tmp_path):
    code, _, err, _ = optimize_resnet(capsys, tmp_path, "--patterns", "conv_bn,no_such_pattern")

    assert code == 2
    assert "no_such_pattern" in err
    assert not (tmp_path / "fused.onnx").exists()


# --- patterns ------------------------------------------------------------------------


def test_patterns_list_shows_every_builtin(capsys):
    code, out, _ = run_cli(capsys, "patterns", "list")

    assert code == 0
    listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
    assert listed == {p.name for p in builtin_patterns()}


def test_patterns_list_includes_a_pattern_file(capsys, extra_pattern_file):
    code, out, _ = run_cli(capsys, "patterns", "list", "--pattern-file", extra_pattern_file)

    assert code == 0
    assert "head.gap_flatten" in out
    assert "conv_bn_add_relu" in out


def test_patterns_check_valid_file_exits_0(capsys, extra_pattern_file):
    code, out, err = run_cli(capsys, "patterns", "check", extra_pattern_file)

    assert code == 0, err
    assert "ok: head.gap_flatten" in out


def test_patterns_check_invalid_file_exits_3(capsys, invalid_pattern_file):
    code, out, err = run_cli(capsys, "patterns", "check", invalid_pattern_file)

    assert code == EXIT_BAD_INPUT
    assert "broken" in err
    assert "nodes.0.op" in err
    assert out == ""


# --- the real executable -------------------------------------------------------------


def test_autofusion_runs_as_a_process(tmp_path):
    fused = tmp_path / "fused.onnx"
    command = [
        sys.executable,
        "-c",
        "import sys; from autofusion.app.cli import main; sys.exit(main())",
        "optimize",
        str(RESNET),
        "-o",
        str(fused),
        "--target",
        "onnxruntime",
    ]

    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)

    assert done.returncode == 0, done.stderr
    assert "conv_bn_add_relu" in done.stdout
    assert "check: passed" in done.stdout
    assert fused.exists()
    assert "BatchNormalization" not in op_types(fused)
