"""``autofusion calibrate --from-verdicts``: kernel factors fitted from a verdicts export
(issue 28, item 3), so the cost model's predicted saving matches the measured one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from verdict_rows import machine, record

from autofusion.app.cli import calibrate as calibrate_cmd
from autofusion.fusion_core.cost import load_target_profile
from autofusion.fusion_core.profiling.verdicts import machine_key, write_verdicts

# Predicted 100 µs for the nodes and 50 fused (50 saved), measured 2% slower on a 1 ms
# model: it lost 19.6 µs, so the kernel took 119.6 µs, 2.39 times its prediction.
SLOWER_THAN_PREDICTED = 1000 * (1 / 1.02 - 1)
# Predicted 100 -> 80 (20 saved), measured 5% faster: it saved 52.6 µs, 0.592 times.
FASTER_THAN_PREDICTED = 1000 * (1 / 0.95 - 1)


def _predicted(rewriter: str, before: float, after: float) -> dict:
    return {
        "saved_us": before - after,
        "before_us": before,
        "after_us": after,
        "rewriter": rewriter,
        "fusions": 1,
    }


def _export(path: Path, *, threads: int = 1) -> Path:
    on = machine(threads=threads)
    records = [
        record(
            (1.02, 1.01, 1.03),
            job="a",
            on=on,
            with_ms=1.0,
            predicted=_predicted("fold_batchnorm", 100, 50),
        ),
        record(
            (0.95, 0.94, 0.96),
            job="b",
            on=on,
            with_ms=1.0,
            predicted=_predicted("fuse_activation", 100, 80),
        ),
        record((0.95, 0.94, 0.96), job="c", on=on, with_ms=1.0),  # no prediction: not usable
        record(
            (0.90, 0.89, 0.91), job="d", on=on, predicted=_predicted("layer_norm", 100, 50)
        ),  # no with_ms
    ]
    write_verdicts(path, records)
    return path


def run_calibrate(capsys, *args: str | Path) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="autofusion")
    calibrate_cmd.add_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["calibrate", *map(str, args)])
    code = parsed.run(parsed)
    out, err = capsys.readouterr()
    return code, out, err


def test_factors_above_one_for_slower_than_predicted_below_for_faster(capsys, tmp_path) -> None:
    export = _export(tmp_path / "verdicts.json")
    output = tmp_path / "fitted.yaml"
    code, out, err = run_calibrate(capsys, "--from-verdicts", export, "--output", output)
    assert code == 0, err
    profile = load_target_profile(output)
    base = load_target_profile("cpu")
    assert profile.name == "cpu-verdicts"
    factors = profile.kernel_factors
    assert factors["fold_batchnorm"] == pytest.approx((100 - SLOWER_THAN_PREDICTED) / 50, rel=5e-3)
    assert factors["fuse_activation"] == pytest.approx((100 - FASTER_THAN_PREDICTED) / 80, rel=5e-3)
    assert factors["fold_batchnorm"] > 1 > factors["fuse_activation"]
    assert "layer_norm" not in factors or factors["layer_norm"] == base.kernel_factors.get(
        "layer_norm"
    )
    assert profile.memory_bandwidth_bytes_per_s == base.memory_bandwidth_bytes_per_s
    assert "2 verdict(s) with a prediction, 1 machine class(es)" in out and str(output) in out
    text = output.read_text(encoding="utf-8")
    assert text.startswith("# ") and "prices the replaced nodes right" in text


def test_a_factor_is_clamped_to_a_sane_range(capsys, tmp_path) -> None:
    wild = record((0.5, 0.49, 0.51), job="w", with_ms=10.0, predicted=_predicted("gelu", 100, 50))
    write_verdicts(tmp_path / "wild.json", [wild])  # it saved 10 ms of a 100 µs region
    code, _, err = run_calibrate(
        capsys, "--from-verdicts", tmp_path / "wild.json", "-o", tmp_path / "p.yaml"
    )
    assert code == 0, err
    assert load_target_profile(tmp_path / "p.yaml").kernel_factors["gelu"] == 0.05


def test_the_fit_corrects_the_factor_the_prediction_was_made_with(capsys, tmp_path) -> None:
    # cpu prices skip_layer_norm's kernel at 12.7x its roofline: a verdict that measured
    # as predicted (the group saved exactly before - after) keeps 12.7.
    saved_ms = 0.05  # 100 -> 50 µs, on a 1 ms model: without it 1.05 ms
    median = 1.0 / (1.0 + saved_ms)
    exact = record(
        (median, median * 0.99, median * 1.01),
        job="s",
        with_ms=1.0,
        predicted=_predicted("skip_layer_norm", 100, 50),
    )
    write_verdicts(tmp_path / "v.json", [exact])
    code, _, err = run_calibrate(
        capsys, "--from-verdicts", tmp_path / "v.json", "-o", tmp_path / "p.yaml"
    )
    assert code == 0, err
    factors = load_target_profile(tmp_path / "p.yaml").kernel_factors
    assert factors["skip_layer_norm"] == pytest.approx(
        load_target_profile("cpu").kernel_factors["skip_layer_norm"], rel=5e-3
    )
    assert factors["skip_rms_norm"] == load_target_profile("cpu").kernel_factors["skip_rms_norm"]


def test_each_kernel_factor_key_is_fitted_apart(capsys, tmp_path) -> None:
    # Two groups of one rewriter whose kernels were priced by different keys: the
    # soft-capped attention with a cache (predicted with 4.3) measured as predicted, the
    # plain one 2% slower. One factor per rewriter would mix them; each key keeps its own.
    on = machine()
    saved_ms = 0.05
    median = 1.0 / (1.0 + saved_ms)
    softcap = dict(
        _predicted("attention_block", 100, 50), kernel_factor_key="attention+softcap+cache"
    )
    plain = dict(_predicted("attention_block", 100, 50), kernel_factor_key="attention")
    records = [
        record(
            (median, median * 0.99, median * 1.01),
            job="s",
            on=on,
            with_ms=1.0,
            predicted=dict(softcap, kernel_factor=4.3),
        ),
        record((1.02, 1.01, 1.03), job="p", on=on, with_ms=1.0, predicted=plain),
    ]
    write_verdicts(tmp_path / "v.json", records)
    code, out, err = run_calibrate(
        capsys, "--from-verdicts", tmp_path / "v.json", "-o", tmp_path / "p.yaml"
    )
    assert code == 0, err
    factors = load_target_profile(tmp_path / "p.yaml").kernel_factors
    assert factors["attention+softcap+cache"] == pytest.approx(4.3, rel=5e-3)
    assert factors["attention"] == pytest.approx((100 - SLOWER_THAN_PREDICTED) / 50, rel=5e-3)
    assert "attention_block" not in factors and "attention+softcap+cache" in out


def test_only_one_machine_class_when_asked(capsys, tmp_path) -> None:
    export = _export(tmp_path / "verdicts.json", threads=4)
    other = machine_key(machine(threads=1))
    args = ("--from-verdicts", export, "--machine-key", other, "-o", tmp_path / "p.yaml")
    code, _, err = run_calibrate(capsys, *args)
    assert code == 2 and f"on machine class {other}" in err
    wanted = machine_key(machine(threads=4))
    code, _, err = run_calibrate(capsys, *args[:3], wanted, "-o", tmp_path / "p.yaml")
    assert code == 0, err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read the verdicts file"),
        ("not json", "is not JSON"),
        (json.dumps({"format": "something else", "verdicts": []}), "is not a verdicts file"),
        (json.dumps({"format": "autofusion-verdicts/1", "verdicts": []}), "no usable verdict"),
    ],
    ids=["missing", "not-json", "not-verdicts", "empty"],
)
def test_a_bad_file_exits_2_saying_what_is_wrong(capsys, tmp_path, content, message) -> None:
    path = tmp_path / "verdicts.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    output = tmp_path / "p.yaml"
    code, out, err = run_calibrate(capsys, "--from-verdicts", path, "--output", output)
    assert code == 2 and message in err and err.startswith("autofusion: error: ")
    assert not output.exists() and out == ""


def test_no_record_with_a_prediction_is_a_usage_error(capsys, tmp_path) -> None:
    path = tmp_path / "verdicts.json"
    write_verdicts(path, [record((0.9, 0.89, 0.91), job="x", with_ms=1.0)])
    code, _, err = run_calibrate(capsys, "--from-verdicts", path, "-o", tmp_path / "p.yaml")
    assert code == 2 and "predicted before_us, after_us and rewriter" in err


def test_reports_and_verdicts_are_one_or_the_other(capsys, tmp_path) -> None:
    export = _export(tmp_path / "verdicts.json")
    code, _, err = run_calibrate(capsys, "--from-verdicts", export, "--from-report", export)
    assert code == 2 and "give one of them" in err
