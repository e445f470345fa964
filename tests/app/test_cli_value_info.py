"""``autofusion optimize --value-info``: what the written file declares of its intermediate
values, from the target profile unless the command line or a strategy says otherwise."""

from __future__ import annotations

import json

import onnx
import pytest

from autofusion.app.cli import main
from autofusion.app.services.strategies import StrategySpec
from autofusion.fusion_core.testing import post_norm_residual


def _model(tmp_path) -> str:
    path = tmp_path / "model.onnx"
    onnx.save(post_norm_residual(hidden=32), path)  # a merge Reshape reading -1
    return str(path)


def _run(tmp_path, capsys, *options: str) -> tuple[set[str], dict]:
    out_path, report_path = tmp_path / "fused.onnx", tmp_path / "report.json"
    args = ["optimize", _model(tmp_path), "-o", str(out_path), "--report", str(report_path)]
    code = main([*args, *options])
    _, err = capsys.readouterr()
    assert code == 0, err
    declared = {info.name for info in onnx.load(out_path).graph.value_info}
    return declared, json.loads(report_path.read_text())


def test_the_cpu_profile_writes_only_the_interface(tmp_path, capsys):
    declared, report = _run(tmp_path, capsys)
    assert declared == set()
    assert report["config"]["value_info"] is None
    assert report["check"]["passed"] is True
    [line] = [p for p in report["prepasses"] if p.startswith("written form:")]
    assert "5 intermediate values and 5 weights left out" in line
    assert "from profile 'cpu'" in line


def test_value_info_all_declares_every_inferred_shape(tmp_path, capsys):
    declared, report = _run(tmp_path, capsys, "--value-info", "all")
    assert {"h", "heads", "turned", "branch", "summed"} <= declared
    assert report["config"]["value_info"] == "all"
    assert not [p for p in report["prepasses"] if p.startswith("written form:")]


def test_a_strategy_file_sets_it_and_the_command_line_wins(tmp_path, capsys):
    strategy = tmp_path / "strategy.yaml"
    strategy.write_text("name: mine\nvalue_info: all\n")
    declared, _ = _run(tmp_path, capsys, "--strategy", str(strategy))
    assert "branch" in declared
    declared, report = _run(tmp_path, capsys, "--strategy", str(strategy), "--value-info", "none")
    assert declared == set()
    assert report["config"]["value_info"] == "none"


def test_a_named_strategy_passes_it_to_the_job_config():
    spec = StrategySpec(name="shapes_kept", value_info="all")
    assert spec.config_overrides()["value_info"] == "all"
    assert "value_info" not in StrategySpec(name="plain").config_overrides()


def test_an_unknown_value_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["optimize", _model(tmp_path), "-o", str(tmp_path / "f.onnx"), "--value-info", "some"])
    _, err = capsys.readouterr()
    assert stopped.value.code == 2
    assert "invalid choice: 'some'" in err and "Traceback" not in err
