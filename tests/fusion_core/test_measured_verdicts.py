"""Measured selection's verdicts: what is reused, by region signature and machine class,
what invalidates a verdict, how contradicting ones are handled, and what a bad store does.

The timing is a fake whose ratios the test decides (which groups it was asked to time
is what these tests read); test_measured_verdicts_timed.py times for real.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from autofusion.fusion_core import OptimizeConfig, RunFiles, run
from autofusion.fusion_core.catalog import builtin_patterns
from autofusion.fusion_core.pipeline.measured import STORE_FILE, VerdictStore, optimize_measured
from autofusion.fusion_core.profiling import PairedTimer
from autofusion.fusion_core.profiling.stats import PairedRatio, paired_ratio
from autofusion.fusion_core.profiling.verdicts import (
    VerdictRecord,
    machine_key,
    read_verdicts,
    write_verdicts,
)
from autofusion.fusion_core.report import build_report, format_markdown, format_summary, render_html
from tests.fusion_core.test_report import validate

# with-group / without-group run time, per group key prefix (below 1: faster)
RATIOS = {"conv_bn_relu": 0.90, "conv_bn ": 1.05, "conv_activation": 0.95}
FUSED = "conv_bn_relu -> com.microsoft::FusedConv"
FOLDED = "conv_bn -> Conv"


def conv_net(blocks: list[str], *, channels: int = 8, size: int = 16) -> onnx.ModelProto:
    """x -> per block Conv(3x3) -> BatchNormalization (-> Relu when "relu") -> y, random
    weights; the first Conv reads 3 channels, the others ``channels``."""
    rng = np.random.default_rng(len(blocks))
    nodes, weights, x, c_in = [], [], "x", 3
    for i, kind in enumerate(blocks):
        p = f"block{i}."
        arrays = {
            "w": rng.normal(0, 0.3, (channels, c_in, 3, 3)),
            "gamma": rng.uniform(0.5, 1.5, channels),
            "beta": rng.normal(0, 0.1, channels),
            "mean": rng.normal(0, 0.1, channels),
            "var": rng.uniform(0.5, 2.0, channels),
        }
        weights += [nh.from_array(a.astype(np.float32), p + n) for n, a in arrays.items()]
        bn_in = [p + "c", *(p + n for n in ("gamma", "beta", "mean", "var"))]
        nodes += [
            oh.make_node("Conv", [x, p + "w"], [p + "c"], name=p + "conv", pads=[1, 1, 1, 1]),
            oh.make_node("BatchNormalization", bn_in, [p + "n"], name=p + "bn"),
        ]
        x, c_in = p + "n", channels
        if kind == "relu":
            nodes.append(oh.make_node("Relu", [x], [p + "r"], name=p + "relu"))
            x = p + "r"
    nodes.append(oh.make_node("Identity", [x], ["y"], name="out"))
    graph = oh.make_graph(
        nodes,
        "net",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, size, size])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", channels, size, size])],
        weights,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    return model


TWO = conv_net(["relu", "relu"])
FOUR_AND_PLAIN = conv_net(["relu", "relu", "relu", "relu", "plain"])


def tight(value: float):
    """A paired ratio of 21 runs centred on ``value`` (interval about +-0.5%)."""
    spread = [value * (1 + 0.001 * (k - 10)) for k in range(21)]
    return paired_ratio(spread, [1.0] * len(spread))


class FakeTimer(PairedTimer):
    """The real inputs, ratios from RATIOS; records what it was asked to time."""

    calls: list[str] = []

    def with_and_without(self, full, variants, *, budget_s):
        self.charge(1.0)
        FakeTimer.calls += list(variants)
        return {key: tight(_ratio(key)) for key in variants}

    def compare(self, fused, original, *, budget_s):
        FakeTimer.calls.append("final")
        return tight(0.95)


def _ratio(key: str) -> float:
    return next(v for prefix, v in RATIOS.items() if key.startswith(prefix))


@pytest.fixture(autouse=True)
def _reset():
    FakeTimer.calls = []


def config(cache: Path | None, **options) -> OptimizeConfig:
    return OptimizeConfig(
        target="onnxruntime",
        selection="measured",
        check={"samples": 1},
        measure_options={"cache_dir": str(cache) if cache else None, **options},
    )


def measured(model, cache, **kwargs):
    patterns = kwargs.pop("patterns", None)
    return optimize_measured(
        model, config(cache, **kwargs), timer_factory=FakeTimer, patterns=patterns
    )


def timed_groups() -> set[str]:
    return {c for c in FakeTimer.calls if c != "final"}


def groups(result) -> dict[str, dict]:
    return {g["group"]: g for g in result.measurement["groups"]}


def stored(cache: Path) -> list[VerdictRecord]:
    records, skipped = read_verdicts(cache / STORE_FILE)
    assert skipped == []
    return records


def rewrite_store(cache: Path, change) -> None:
    write_verdicts(cache / STORE_FILE, [change(r) for r in stored(cache)])


def test_a_second_job_decides_every_group_from_the_store(tmp_path) -> None:
    first = measured(TWO, tmp_path)
    assert timed_groups() == {FUSED}
    assert first.measurement["store"] | {"problems": []} == {
        "read": 0, "skipped": 0, "unreadable": 0, "matched": 0, "measured": 1, "written": 1,
        "problems": [],
    }  # fmt: skip
    [verdict] = first.verdicts
    assert verdict.job_id is None and verdict.source == "measured"
    assert verdict.region["ops"] == ["com.microsoft::FusedConv"] and verdict.region["fusions"] == 2
    assert verdict.predicted["fusions"] == 2 and verdict.predicted["rewriter"]
    FakeTimer.calls = []
    second = measured(TWO, tmp_path)
    assert FakeTimer.calls == ["final"]
    group = groups(second)[FUSED]
    assert group["source"] == "store" and group["kept"] is True
    assert group["combined"]["measurements"] == 1 and group["signature"] == verdict.signature
    assert second.counts == first.counts and second.verdicts == []
    assert second.measurement["store"]["matched"] == 1
    assert second.measurement["store"]["written"] == 0


def test_a_model_sharing_regions_reuses_them_and_measures_the_rest(tmp_path) -> None:
    # two blocks, then four and a block without Relu: the same Conv-BN-Relu regions (a
    # set, not a count), and one new group
    measured(TWO, tmp_path)
    FakeTimer.calls = []
    other = measured(FOUR_AND_PLAIN, tmp_path)
    assert FUSED not in timed_groups() and FOLDED in timed_groups()
    decided = groups(other)
    assert decided[FUSED]["source"] == "store" and decided[FUSED]["fusions"] == 4
    assert decided[FOLDED]["source"] == "measured" and decided[FOLDED]["kept"] is False
    assert other.measurement["store"]["matched"] == 1
    assert {r.group for r in stored(tmp_path)} == {FUSED, FOLDED}


def test_a_region_of_other_sizes_is_another_signature(tmp_path) -> None:
    measured(TWO, tmp_path)
    FakeTimer.calls = []
    measured(conv_net(["relu", "relu"], channels=32), tmp_path)
    assert FUSED in timed_groups()


def test_another_onnxruntime_version_does_not_reuse(tmp_path) -> None:
    measured(TWO, tmp_path)

    def other_version(record: VerdictRecord) -> VerdictRecord:
        machine = {**record.machine, "onnxruntime": "0.0.1"}
        return dataclasses.replace(record, machine=machine, machine_key=machine_key(machine))

    rewrite_store(tmp_path, other_version)
    FakeTimer.calls = []
    again = measured(TWO, tmp_path)
    assert FUSED in timed_groups() and again.measurement["store"]["matched"] == 0
    assert again.measurement["store"]["read"] == 1
    assert len(stored(tmp_path)) == 2  # the other version's verdict stays


def test_another_thread_count_does_not_reuse(tmp_path) -> None:
    measured(TWO, tmp_path)
    FakeTimer.calls = []
    measured(TWO, tmp_path, threads=2)
    assert FUSED in timed_groups()


def test_a_changed_pattern_is_a_new_signature(tmp_path) -> None:
    measured(TWO, tmp_path)
    patterns = [
        dataclasses.replace(p, spec=p.spec.model_copy(update={"description": "version 2"}))
        if p.name == "conv_bn_relu"
        else p
        for p in builtin_patterns()
    ]
    FakeTimer.calls = []
    measured(TWO, tmp_path, patterns=patterns)
    assert FUSED in timed_groups()
    hashes = {r.pattern_hash for r in stored(tmp_path)}
    assert len(hashes) == 2


def test_a_verdict_past_the_age_limit_is_not_reused(tmp_path) -> None:
    measured(TWO, tmp_path)
    old = (datetime.now(UTC) - timedelta(days=40)).isoformat()
    rewrite_store(tmp_path, lambda r: dataclasses.replace(r, measured_at=old))
    FakeTimer.calls = []
    measured(TWO, tmp_path, verdict_max_age_days=60)  # within this run's limit: reused
    assert timed_groups() == set()
    measured(TWO, tmp_path)  # the default, 30 days
    assert timed_groups() == {FUSED}


def test_contradicting_verdicts_are_measured_again_and_kept(tmp_path) -> None:
    measured(TWO, tmp_path)
    [record] = stored(tmp_path)
    faster = dataclasses.replace(record, ratio=tight(0.90), job_id="a" * 32)
    slower = dataclasses.replace(record, ratio=tight(1.10), job_id="b" * 32)
    write_verdicts(tmp_path / STORE_FILE, [faster, slower])
    FakeTimer.calls = []
    again = measured(TWO, tmp_path)
    assert timed_groups() == {FUSED}
    group = groups(again)[FUSED]
    assert group["source"] == "measured" and "2 measurement(s) disagreed" in group["reason"]
    after = stored(tmp_path)
    assert len(after) == 3 and faster in after and slower in after
    assert again.verdicts[0] in after


def test_a_bad_store_is_a_miss_never_an_error(tmp_path) -> None:
    measured(TWO, tmp_path / "good")
    [record] = stored(tmp_path / "good")
    mixed = tmp_path / "mixed.json"
    invalid = {**record.to_dict(), "signature": "not hex"}
    mixed.write_text(json.dumps({"format": "autofusion-verdicts/1", "verdicts": [invalid]}))
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    store = tmp_path / "store"
    store.mkdir()
    (store / STORE_FILE).write_text('{"format": "something else"}')
    files = [str(mixed), str(garbage), str(tmp_path / "missing.json")]
    FakeTimer.calls = []
    result = measured(TWO, store, verdicts_file=files)
    counts = result.measurement["store"]
    assert counts["skipped"] == 1 and counts["unreadable"] == 3 and counts["read"] == 0
    assert timed_groups() == {FUSED} and counts["written"] == 1
    assert any("signature must be 64" in p for p in counts["problems"])
    assert len(stored(store)) == 1  # the unreadable store was written again, valid


def test_an_unwritable_store_costs_nothing_but_the_verdict(tmp_path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the store's folder would be")
    result = measured(TWO, blocked)
    assert result.measurement["store"]["written"] == 0 and len(result.verdicts) == 1
    assert any("could not be written" in p for p in result.measurement["store"]["problems"])


def test_the_same_verdict_from_two_files_counts_once(tmp_path) -> None:
    measured(TWO, tmp_path)
    [record] = stored(tmp_path)
    store = VerdictStore(
        [tmp_path / STORE_FILE], tmp_path, machine_key=record.machine_key, max_age_days=30
    )
    assert store.read == 2 and len(store.records_for(record.signature)) == 1


def test_verdicts_from_a_file_name_their_jobs_in_every_rendering(tmp_path) -> None:
    measured(TWO, tmp_path / "first")
    [record] = stored(tmp_path / "first")
    jobs = ["a1b2c3d4" + "0" * 24, "c3d4e5f6" + "0" * 24]
    export = tmp_path / "export.json"
    write_verdicts(export, [dataclasses.replace(record, job_id=j) for j in jobs])
    FakeTimer.calls = []
    result = measured(TWO, None, verdicts_file=str(export))
    assert timed_groups() == set()
    report = build_report(result, model="net.onnx")
    validate(report)
    words = "from the verdict store (2 measurements, jobs a1b2c3d4, c3d4e5f6)"
    summary = format_summary(report)
    assert f"{FUSED} x2: with/without 0.900, {words}" in summary
    assert "1 from the verdict store, 0 measured (2 verdict(s) read)" in summary
    assert words in format_markdown(report)
    html = render_html(report)
    assert words in html and 'data-source="store"' in html


def test_the_report_says_which_groups_were_measured(tmp_path) -> None:
    result = measured(TWO, tmp_path)
    summary = format_summary(build_report(result, model="net.onnx"))
    assert f"{FUSED} x2: with/without 0.900, measured" in summary
    assert "0 from the verdict store, 1 measured" in summary


def test_run_writes_what_it_measured(tmp_path) -> None:
    model = tmp_path / "net.onnx"
    onnx.save(TWO, model)
    verdicts = tmp_path / "out" / "verdicts.json"
    files = RunFiles(verdicts=verdicts)
    cfg = config(None, budget_s=1.0, min_runs=6)
    outcome = run(model, tmp_path / "fused.onnx", cfg, files=files)
    records, skipped = read_verdicts(verdicts)
    assert records == outcome.result.verdicts and skipped == []
    assert all(r.with_ms is not None and r.with_ms > 0 for r in records)  # the real timer
    plain = tmp_path / "plain.json"
    run(model, tmp_path / "fused2.onnx", OptimizeConfig(), files=RunFiles(verdicts=plain))
    assert not plain.exists()  # not measured: no file


def test_a_run_decided_from_the_store_writes_an_empty_file(tmp_path) -> None:
    measured(TWO, tmp_path / "store")
    model = tmp_path / "net.onnx"
    onnx.save(TWO, model)
    verdicts = tmp_path / "verdicts.json"
    cfg = config(tmp_path / "store", budget_s=1.0, min_runs=6)
    outcome = run(model, tmp_path / "fused.onnx", cfg, files=RunFiles(verdicts=verdicts))
    assert outcome.result.measurement["store"]["matched"] == 1
    assert read_verdicts(verdicts) == ([], [])


def test_one_verdict_combines_to_itself() -> None:
    from autofusion.fusion_core.profiling.verdicts import combine_verdicts

    lopsided = PairedRatio(0.985, 0.970, 0.9995, 0.96, 40, "faster")
    record = _record(lopsided)
    assert combine_verdicts([record]).ratio == lopsided


def _record(ratio: PairedRatio) -> VerdictRecord:
    return VerdictRecord(
        signature="0" * 64, pattern="p", pattern_hash="1" * 64, group="p -> X", region={},
        machine_key="2" * 64, machine={}, target="generic", ratio=ratio,
        measured_at=datetime.now(UTC).isoformat(),
    )  # fmt: skip


def test_concurrent_appends_keep_every_verdict(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    records = [_record(tight(0.9 + k / 100)) for k in range(8)]

    def append(record: VerdictRecord) -> int:
        store = VerdictStore([], tmp_path, machine_key=record.machine_key, max_age_days=30)
        return store.add([record])

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(append, records)) == [1] * 8
    assert sorted(r.ratio.median for r in stored(tmp_path)) == [r.ratio.median for r in records]
