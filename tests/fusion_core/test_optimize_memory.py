"""The optimizing process's own memory (issue 29): measured by phase into the report,
worded on the terminal, in report.md and on the page, and predicted before a run
(fusion_core/pipeline/memory.py)."""

from __future__ import annotations

import json

import jsonschema
import onnx
import pytest

from autofusion.fusion_core import (
    OptimizeConfig,
    RunFiles,
    predict_memory,
    predict_peak_bytes,
    run,
)
from autofusion.fusion_core.pipeline import PhaseMemory
from autofusion.fusion_core.pipeline.memory import BASE_BYTES, peak_rss_bytes, rss_bytes
from autofusion.fusion_core.report import (
    format_markdown,
    format_summary,
    render_html,
    report_schema,
    report_view,
)
from autofusion.fusion_core.testing import conv_bn_relu

GIB = 1 << 30
NO_CHECK = OptimizeConfig.model_validate({"check": {"enabled": False}})


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("own")
    model = folder / "in.onnx"
    onnx.save(conv_bn_relu(), model)
    files = RunFiles(report=folder / "report.json", markdown=folder / "report.md")
    heard: list[str] = []
    run(model, folder / "fused.onnx", OptimizeConfig(), files=files, on_phase=heard.append)
    assert heard[:5] == ["load", "prepasses", "fuse", "check", "saving"]  # passed on
    written = json.loads((folder / "report.json").read_text())
    written["_markdown"] = (folder / "report.md").read_text()
    return written


def test_the_report_has_the_peak_by_phase_against_the_model(report) -> None:
    own = report["optimize_memory"]
    assert own["model_bytes"] == report["size"]["before_bytes"] > 0
    assert own["peak_rss_bytes"] >= own["model_bytes"]
    assert own["ratio"] == pytest.approx(own["peak_rss_bytes"] / own["model_bytes"], rel=1e-3)
    assert list(own["by_phase"]) == ["load", "prepasses", "fuse", "check", "saving"]
    peaks = [phase["peak_rss_bytes"] for phase in own["by_phase"].values()]
    assert peaks == sorted(peaks) and peaks[-1] <= own["peak_rss_bytes"]  # a high-water mark
    for phase in own["by_phase"].values():
        assert 0 < phase["rss_bytes"] <= phase["peak_rss_bytes"]
    assert own["predicted_peak_bytes"] == predict_peak_bytes(own["model_bytes"], OptimizeConfig())
    assert own["prediction"].endswith("(the check on, one file)")  # as the model came
    body = {k: v for k, v in report.items() if not k.startswith("_")}
    jsonschema.Draft202012Validator(report_schema()).validate(body)


def test_the_terminal_markdown_and_page_say_it_in_one_line(report) -> None:
    line = format_summary(report).splitlines()
    own = [text for text in line if text.startswith("optimize memory: ")]
    assert len(own) == 1 and " the model (" in own[0] and "with its data); predicted " in own[0]
    assert "**Optimize memory:** peak " in report["_markdown"]
    view = report_view(report)["optimize_memory"]
    assert view["line"] == own[0].removeprefix("optimize memory: ")
    assert [row["phase"] for row in view["phases"]][0] == "load"
    page = render_html(report)
    assert 'id="optimize-memory"' in page and 'data-phase="check"' in page


def test_a_report_without_it_words_nothing(report) -> None:
    older = {k: v for k, v in report.items() if k not in ("optimize_memory", "_markdown")}
    assert "optimize memory" not in format_summary(older)
    assert "Optimize memory" not in format_markdown(older)
    assert report_view(older)["optimize_memory"] is None


def test_phase_memory_records_each_phase_as_it_ends() -> None:
    heard: list[str] = []
    phases = PhaseMemory(heard.append)
    phases("load")
    phases("fuse")
    held = bytearray(32 << 20)  # this phase holds 32 MiB more
    held[::4096] = b"x" * len(held[::4096])  # touched: resident
    record = phases.record(1 << 20, None)
    assert heard == ["load", "fuse"] and list(record["by_phase"]) == ["load", "fuse"]
    load, fuse = record["by_phase"]["load"], record["by_phase"]["fuse"]
    assert fuse["rss_bytes"] - load["rss_bytes"] >= 30 << 20
    assert record["peak_rss_bytes"] >= fuse["peak_rss_bytes"] >= load["peak_rss_bytes"]
    assert peak_rss_bytes() >= rss_bytes() > 0
    del held


def test_the_prediction_grows_with_the_model_and_with_what_runs() -> None:
    sizes = [0, 1 << 20, GIB, 4 * GIB, 8 * GIB]
    for config in (OptimizeConfig(), NO_CHECK, OptimizeConfig(profile=True)):
        for external in (True, False):
            predicted = [predict_peak_bytes(s, config, external_data=external) for s in sizes]
            assert predicted == sorted(set(predicted)) and predicted[0] == BASE_BYTES
    on, off = (
        predict_memory(GIB, external_data=True),
        predict_memory(GIB, NO_CHECK, external_data=True),
    )
    assert on.peak_bytes > off.peak_bytes > BASE_BYTES
    assert "the check on" in on.basis and "the check off" in off.basis
    measured = OptimizeConfig(selection="measured")
    assert predict_peak_bytes(GIB, measured, external_data=True) > on.peak_bytes
    profiled_off = NO_CHECK.model_copy(update={"profile": True})
    assert predict_peak_bytes(GIB, profiled_off, external_data=True) > off.peak_bytes


def test_in_one_file_the_check_costs_the_most() -> None:
    """A model in one file is read lazily and saved streamed, as with a data file (no
    more than that without the check), and onnxruntime's sessions of it (the check's,
    profiling's) read a copy with a data file: as much as with a data file."""
    for config in (OptimizeConfig(), NO_CHECK, OptimizeConfig(profile=True)):
        one_file, streamed = (
            predict_memory(GIB, config),
            predict_memory(GIB, config, external_data=True),
        )
        # never more: the data file's multiples are fitted up to 6 GiB, where the check's
        # grows; a file of one piece is under 2 GB
        assert one_file.peak_bytes <= streamed.peak_bytes
        assert one_file.basis.endswith("one file)") and "one file" not in streamed.basis
    assert predict_peak_bytes(GIB) > predict_peak_bytes(GIB, NO_CHECK)  # the check's peak
    # past 2 GB the weights go to a data file whatever the caller says
    assert predict_peak_bytes(4 * GIB) == predict_peak_bytes(4 * GIB, external_data=True)


def test_the_fp16_check_is_predicted_apart() -> None:
    """At precision fp16 the check compares value ranges on both models as protos with
    their weights (section 28: 9.2x the model): predicted so, and said."""
    fp16 = OptimizeConfig(precision="fp16")
    for external in (True, False):
        checked = predict_memory(GIB, fp16, external_data=external)
        assert checked.peak_bytes > predict_peak_bytes(GIB, external_data=external) * 4
        assert "fp16 ranges checked" in checked.basis
    off = fp16.model_copy(update={"check": NO_CHECK.check})
    assert predict_peak_bytes(GIB, off) == predict_peak_bytes(GIB, NO_CHECK)
