"""``autofusion optimize --verdicts FILE``: reuse exported verdicts in a local run.

A file that cannot be read, or is not a verdicts file, is a usage error (exit 2) that
names it; its invalid verdicts are a warning line, and the run goes on without them.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from autofusion.app.cli import main
from tests.fusion_core.test_report import conv_bn_relu


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "conv.onnx"
    onnx.save(conv_bn_relu(), path)
    return path


def measured(model: Path, tmp_path: Path, *extra: str) -> list[str]:
    args = ["optimize", str(model), "-o", str(tmp_path / "f.onnx")]
    args += ["--report", str(tmp_path / "report.json"), "--target", "onnxruntime"]
    return [*args, "--selection", "measured", "--measure-budget", "0.5", *extra]


def test_exported_verdicts_decide_without_timing(model, tmp_path, capsys) -> None:
    store = tmp_path / "store"
    assert main(measured(model, tmp_path, "--measure-cache", str(store))) == 0
    exported = json.loads((store / "verdicts.json").read_text())
    assert exported["verdicts"]
    exported["verdicts"].append({"signature": "not a verdict"})
    export = tmp_path / "export.json"
    export.write_text(json.dumps(exported))
    capsys.readouterr()
    args = measured(model, tmp_path, "--no-measure-cache", "--verdicts", str(export))
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert f"{export}: 1 invalid verdict(s) skipped" in err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["config"]["measure_options"]["verdicts_file"] == [str(export.resolve())]
    store_counts = report["measurement"]["store"]
    assert store_counts["matched"] >= 1 and store_counts["skipped"] == 1
    assert "from the verdict store (1 measurement)" in out


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read it"),
        ("{not json", "is not JSON"),
        ('{"format": "other"}', "is not a verdicts file"),
    ],
    ids=["missing", "not-json", "not-verdicts"],
)
def test_a_file_that_is_not_verdicts_is_a_usage_error(model, tmp_path, capsys, content, says):
    path = tmp_path / "verdicts.json"
    if content is not None:
        path.write_text(content)
    assert main(measured(model, tmp_path, "--verdicts", str(path))) == 2
    err = capsys.readouterr().err
    assert says in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "f.onnx").exists()


def test_verdicts_without_measured_selection_is_a_usage_error(model, tmp_path, capsys) -> None:
    path = tmp_path / "verdicts.json"
    path.write_text('{"format": "autofusion-verdicts/1", "verdicts": []}')
    args = ["optimize", str(model), "-o", str(tmp_path / "f.onnx"), "--verdicts", str(path)]
    assert main(args) == 2
    assert "--verdicts is for measured selection" in capsys.readouterr().err
