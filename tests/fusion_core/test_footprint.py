"""Size on disk and peak memory (``fusion_core.profiling.footprint``) and the report's ``size`` and
``memory`` entries: real optimize runs of small models with random weights, the
memory measured in real child processes, read back with ``read_report``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.profiling import ProfileOptions, profile_models
from autofusion.fusion_core.profiling.footprint import measure_memory, model_size, serialized_size
from autofusion.fusion_core.report import (
    build_report,
    change_of,
    format_markdown,
    format_summary,
    read_report,
    render_html,
)
from autofusion.fusion_core.testing import conv_bn_relu
from tests.fusion_core.test_report import validate

MIB = 1 << 20
QUICK = ProfileOptions(warmup=1, iters=6, node_runs=1)


def conv_bn(channels: int = 32, seed: int = 3) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu with random weights and BN statistics."""
    return conv_bn_relu(in_channels=channels, out_channels=channels, seed=seed)


def matmul(width: int, seed: int = 1) -> onnx.ModelProto:
    """y = x @ W with a width x width float32 weight (4 * width**2 bytes)."""
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        f"g (float[4,{width}] x) => (float[4,{width}] y) {{ y = MatMul(x, w) }}"
    )
    weight = np.random.default_rng(seed).normal(0, 1, (width, width)).astype(np.float32)
    model.graph.initializer.append(nh.from_array(weight, "w"))
    return model


def _weight_bytes(path: Path) -> int:
    return sum(nh.to_array(t).nbytes for t in onnx.load(path).graph.initializer)


# --- size ------------------------------------------------------------------------------


def test_size_counts_the_external_data_files_once(tmp_path: Path) -> None:
    path = tmp_path / "net.onnx"
    onnx.save_model(
        conv_bn(), path, save_as_external_data=True, location="net.weights", size_threshold=0
    )
    (tmp_path / "unrelated.bin").write_bytes(b"x" * 5000)  # beside it, not referenced
    data = (tmp_path / "net.weights").stat().st_size
    assert data >= 32 * 32 * 9 * 4  # the conv weight at least

    size = model_size(path)

    assert size.files == 2 and size.external_data_bytes == data
    assert size.total_bytes == path.stat().st_size + data
    assert model_size(tmp_path / "missing.onnx") is None


def test_serialized_size_is_the_size_save_model_writes(tmp_path: Path) -> None:
    result = optimize(conv_bn(), OptimizeConfig(target="onnxruntime", check={"enabled": False}))
    written = save_model(result.model, tmp_path / "fused.onnx")
    assert serialized_size(result.model).total_bytes == sum(p.stat().st_size for p in written)


@pytest.fixture(scope="module")
def fused_files(tmp_path_factory) -> tuple[Path, Path, object]:
    folder = tmp_path_factory.mktemp("fused")
    model_path, fused_path = folder / "model.onnx", folder / "fused.onnx"
    onnx.save(conv_bn(), model_path)
    result = optimize(model_path, OptimizeConfig(target="onnxruntime"))
    assert result.check.passed and result.counts == {"conv_bn_relu": 1}
    save_model(result.model, fused_path)
    return model_path, fused_path, result


def test_the_folded_batchnorm_makes_the_file_smaller(fused_files) -> None:
    model_path, fused_path, result = fused_files
    report = build_report(result, model=str(model_path), output=str(fused_path))
    validate(report)
    size = report["size"]
    assert size["before_bytes"] == model_path.stat().st_size
    assert size["after_bytes"] == fused_path.stat().st_size
    assert size["after_measured_from"] == "file" and size["after_files"] == 1
    # Four BN vectors of 32 floats become one bias of 32: 384 bytes of weights fewer,
    # some of them spent on the fused node's provenance (metadata_props).
    weights = [_weight_bytes(p) for p in (model_path, fused_path)]
    assert weights[0] - weights[1] == 3 * 32 * 4
    assert 0 < size["before_bytes"] - size["after_bytes"] < 3 * 32 * 4
    assert size["ratio"] == pytest.approx(size["after_bytes"] / size["before_bytes"], rel=1e-12)
    facts = read_report(report)
    assert (facts.size_before_bytes, facts.size_after_bytes) == (
        size["before_bytes"],
        size["after_bytes"],
    )


def test_an_unwritten_fused_model_is_measured_serialized(fused_files) -> None:
    model_path, fused_path, result = fused_files
    report = build_report(result, model=str(model_path))  # no output: not written
    validate(report)
    assert report["size"]["after_measured_from"] == "serialized"
    assert report["size"]["after_bytes"] == fused_path.stat().st_size
    assert "not written" in format_summary(report)


def test_an_in_memory_input_has_no_size_before() -> None:
    result = optimize(conv_bn(), OptimizeConfig(check={"enabled": False}))
    report = build_report(result)
    validate(report)
    assert report["size"]["before_bytes"] is None and report["size"]["after_bytes"] > 0
    assert read_report(report).size_before_bytes is None


# --- memory ----------------------------------------------------------------------------


def test_the_peak_holds_the_weights(tmp_path: Path) -> None:
    small, large = tmp_path / "small.onnx", tmp_path / "large.onnx"
    onnx.save(matmul(16), small)
    onnx.save(matmul(1024), large)  # a 4 MiB weight

    before, after = measure_memory(small).original, measure_memory(large).original

    assert before.error is None and after.error is None, (before, after)
    assert before.method == "VmHWM"  # Linux: the peak is reset before the session
    assert 0 < before.peak_bytes < 64 * MIB
    # The weight must be resident at the peak at least once (rtol 10% for the page
    # rounding and allocator slack the small model has too).
    assert after.peak_bytes - before.peak_bytes >= 0.9 * 4 * MIB
    assert after.session_bytes <= after.peak_bytes
    assert before.baseline_bytes > 10 * MIB  # Python and onnxruntime are not counted


def test_a_model_that_cannot_load_is_reported_not_raised(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(matmul(16), good)
    bad.write_bytes(b"not an onnx model")
    feeds = {"x": np.ones((4, 16), np.float32)}

    measured = measure_memory(good, bad, feeds=feeds)

    assert measured.original.peak_bytes > 0
    assert measured.fused.peak_bytes is None
    assert "could not measure the fused model's memory" in measured.fused.error


def test_inputs_no_process_can_take_are_reported_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(matmul(16), path)

    measured = measure_memory(path, path, feeds={"x": np.array([object()], dtype=object)})

    for side in (measured.original, measured.fused):
        assert side.peak_bytes is None and "no inputs to give it" in side.error


@pytest.fixture(scope="module")
def profiled(fused_files) -> dict:
    model_path, fused_path, result = fused_files
    profile = profile_models(model_path, fused_path, options=QUICK).to_dict()
    memory = measure_memory(model_path, fused_path).to_dict()
    return build_report(
        result, model=str(model_path), output=str(fused_path), profile=profile, memory=memory
    )


def test_a_profiled_report_has_both_peaks(profiled) -> None:
    validate(profiled)
    memory = profiled["memory"]
    assert memory["errors"] == []
    assert memory["before_bytes"] > 0 and memory["after_bytes"] > 0
    assert memory["resident_before_bytes"] > 0 and memory["resident_after_bytes"] > 0
    assert "VmHWM" in memory["measure"] and "ORT_ENABLE_ALL" in memory["measure"]
    allocator = profiled["profile"]["nodes"]["original"]["memory"]["allocator_peak_bytes"]
    assert memory["allocator_peak_before_bytes"] == allocator
    facts = read_report(profiled)
    assert facts.peak_memory_before_bytes == memory["before_bytes"]
    assert facts.peak_memory_after_bytes == memory["after_bytes"]


def test_an_unprofiled_report_has_no_memory(fused_files) -> None:
    model_path, fused_path, result = fused_files
    report = build_report(result, model=str(model_path), output=str(fused_path))
    assert report["memory"] is None
    facts = read_report(report)
    assert facts.peak_memory_before_bytes is None and facts.peak_memory_after_bytes is None
    assert "peak memory" not in format_summary(report)
    assert "**Peak memory:** not measured (not profiled)" in format_markdown(report)


# --- renderings ------------------------------------------------------------------------


def test_the_renderings_show_before_after_and_the_change(fused_files) -> None:
    model_path, fused_path, result = fused_files
    memory = {
        "level": "ORT_ENABLE_ALL",
        "providers": ["CPUExecutionProvider"],
        "threads": 1,
        "runs": 3,
        "original": {"peak_bytes": 10 * MIB, "resident_bytes": 9 * MIB},
        "fused": {"peak_bytes": 8 * MIB, "resident_bytes": 9 * MIB},
    }
    report = build_report(result, model=str(model_path), output=str(fused_path), memory=memory)
    validate(report)
    before, after = report["size"]["before_bytes"], report["size"]["after_bytes"]
    change = change_of(before, after)  # +12% past 10%, one decimal below (fusion_core units)
    size = f"{before / 1024:.1f} KiB -> {after / 1024:.1f} KiB ({change})"

    summary, markdown = format_summary(report), format_markdown(report)
    html = render_html(report)

    assert f"size: {size}" in summary
    assert "peak memory: 10.0 MiB -> 8.0 MiB (-20%)" in summary
    assert summary.index("size:") > summary.index("check:")
    assert f"**Size:** {size}" in markdown
    assert "**Peak memory:** 10.0 MiB -> 8.0 MiB (-20%)" in markdown
    assert '<details id="memory">' in html
    # the summary row: it shrank, so nothing is flagged
    assert '<td id="peak-memory" data-flagged="false">10.0 MiB → 8.0 MiB (-20%)' in html
    assert "<th>process peak</th><td>10.0 MiB</td><td>8.0 MiB</td><td>-20%</td>" in html
    assert "<td>9.0 MiB</td><td>9.0 MiB</td><td>+0.0%</td>" in html  # resident 9 -> 9
