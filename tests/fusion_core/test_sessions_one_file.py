"""onnxruntime's sessions of a model in one file read a copy with a data file (issue 29):
``validate.session_file``, used by the check (fusion_core/pipeline/check.py) and by
profiling (fusion_core/profiling/_trace.py::prepare_model).

On a decoder of bench/_big_models.py saved as one file (8 MB, its big weights left in the
file at load), with the size from which a copy is made lowered: the copy is the same model
with the same bytes, onnxruntime's outputs from it equal those from the one file bit for
bit (rtol = atol = 0) and it runs the same kernels; the check says exactly what it said
from the one file; profiling makes one copy per model for all its sessions; every copy is
gone after and the user's file is untouched; the memory measurement still reads the
user's own file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, run
from autofusion.fusion_core.ir import proto_with_weights, save_model
from autofusion.fusion_core.profiling import (
    ProfileOptions,
    parse_trace,
    profile_models,
    read_trace,
    session_options,
    write_trace,
)
from autofusion.fusion_core.profiling import footprint as footprint_module
from autofusion.fusion_core.validate import _session_file, make_session, random_inputs, session_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _big_models

DECODER = _big_models.shape_for_size(8 << 20)  # hidden 256: 7 MB of weights of 64 KiB and up
ON_ORT = OptimizeConfig(target="onnxruntime")
QUICK = ProfileOptions(warmup=1, iters=3, node_runs=2, dims={"batch": 1, "sequence": 8})
EVERY = 1  # a copy from the first byte left in the file
NEVER = 1 << 62  # the one file itself, as before


@pytest.fixture(scope="module")
def one_file(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("decoder")
    info = _big_models.make_decoder(folder / "with-data", DECODER, seed=7)
    path = folder / "one" / "decoder.onnx"
    path.parent.mkdir()
    onnx.save(onnx.load(info["path"]), path)  # the weights read in and saved inside
    assert [p.name for p in path.parent.iterdir()] == ["decoder.onnx"]
    return path


@pytest.fixture(scope="module")
def fused_one_file(one_file, tmp_path_factory) -> Path:
    result = optimize(
        one_file, OptimizeConfig(target="onnxruntime", check=CheckOptions(enabled=False))
    )
    assert result.applied
    path = tmp_path_factory.mktemp("fused") / "fused.onnx"
    assert save_model(result.model, path) == [path]  # one file, as the service saves it
    return path


def _state(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _copy_from(monkeypatch, min_bytes: int) -> None:
    monkeypatch.setattr(_session_file, "MIN_COPY_BYTES", min_bytes)


def test_a_one_file_model_with_big_weights_is_copied_with_them_in_a_data_file(one_file, tmp_path):
    before = _state(one_file)
    assert session_file(one_file, tmp_path / "small", min_bytes=NEVER) == one_file
    assert not (tmp_path / "small").exists()  # below the size: nothing written
    copy = session_file(one_file, tmp_path / "big", min_bytes=EVERY)
    assert copy == tmp_path / "big" / one_file.name
    data = copy.with_name(copy.name + ".data")
    assert data.stat().st_size > 6 << 20 and copy.stat().st_size < 1 << 20
    expected, got = onnx.load(one_file), onnx.load(copy)  # the copy's data read in
    assert list(got.graph.node) == list(expected.graph.node)
    assert list(got.graph.input) == list(expected.graph.input)
    assert list(got.graph.output) == list(expected.graph.output)
    assert list(got.opset_import) == list(expected.opset_import)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in expected.graph.initializer}
    copied = {t.name: onnx.numpy_helper.to_array(t) for t in got.graph.initializer}
    assert weights.keys() == copied.keys()
    for name, array in weights.items():  # the same bytes, type and shape
        assert copied[name].dtype == array.dtype and copied[name].shape == array.shape, name
        assert copied[name].tobytes() == array.tobytes(), name
    assert _state(one_file) == before


def test_a_model_with_a_data_file_is_read_where_it_lies(tmp_path):
    info = _big_models.make_decoder(tmp_path / "model", DECODER, seed=7)
    path = Path(info["path"])
    assert session_file(path, tmp_path / "copy", min_bytes=EVERY) == path
    assert not (tmp_path / "copy").exists()


def test_a_copy_that_cannot_be_written_leaves_nothing_and_reads_the_one_file(
    one_file, tmp_path, monkeypatch, caplog
):
    def full_disk(model, path, *, external_data):
        Path(path).write_bytes(b"partial")
        Path(f"{path}.data").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_session_file, "save_model", full_disk)
    with caplog.at_level(logging.WARNING):
        assert session_file(one_file, tmp_path, min_bytes=EVERY) == one_file
    assert list(tmp_path.iterdir()) == []
    assert (
        "No space left on device" in caplog.text and "parses the model in one file" in caplog.text
    )


def _sessions(path: Path, copy: Path, level: str) -> list[ort.InferenceSession]:
    if level == "check":  # the check's own settings
        return [make_session(path), make_session(copy)]
    options = session_options(level, threads=2)  # profiling's
    return [
        ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
        for p in (path, copy)
    ]


@pytest.mark.parametrize("level", ["check", "ORT_ENABLE_ALL"])
def test_the_copy_gives_the_same_outputs_bit_for_bit(one_file, tmp_path, level):
    copy = session_file(one_file, tmp_path, min_bytes=EVERY)
    assert copy != one_file
    graph = onnx.load(one_file, load_external_data=False)
    for seed, dims in [(0, {"batch": 1, "sequence": 16}), (1, {"batch": 2, "sequence": 5})]:
        feed = random_inputs(graph, seed=seed, dims=dims)
        want, got = (s.run(None, feed) for s in _sessions(one_file, copy, level))
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=0)
            assert np.isfinite(w).all() and np.abs(w).max() > 0  # not degenerate


class _Spy:
    """Every onnxruntime session made: the file it read, whether a data file was beside
    it and how many other sessions were alive."""

    def __init__(self, monkeypatch) -> None:
        self.made: list[dict] = []
        live: list[weakref.ref] = []
        made = self.made

        class Session(ort.InferenceSession):
            def __init__(self, source, *args, **kwargs):
                path = Path(source) if isinstance(source, str) else None
                data = path is not None and path.with_name(path.name + ".data").is_file()
                alive = sum(ref() is not None for ref in live)
                made.append({"path": path, "data": data, "alive": alive})
                super().__init__(source, *args, **kwargs)
                live.append(weakref.ref(self))

        monkeypatch.setattr(ort, "InferenceSession", Session)


def test_the_check_reads_a_copy_and_says_exactly_what_it_said_from_the_one_file(
    one_file, monkeypatch
):
    before = _state(one_file)
    _copy_from(monkeypatch, NEVER)
    old = optimize(one_file, ON_ORT)
    _copy_from(monkeypatch, EVERY)
    spy = _Spy(monkeypatch)
    new = optimize(one_file, ON_ORT)
    assert old.applied and old.check.passed
    assert new.check.to_dict() == old.check.to_dict()  # every number, to the last bit
    assert proto_with_weights(new.model) == proto_with_weights(old.model)
    original, fused = spy.made
    assert original["path"].name == one_file.name and original["path"] != one_file
    assert original["data"] and original["alive"] == 0
    assert fused["path"].name == "fused.onnx" and fused["alive"] == 0
    scratch = fused["path"].parent
    assert original["path"].parent.parent == scratch  # in the check's own folder
    assert not scratch.exists()  # removed with it
    assert _state(one_file) == before


def test_profiling_makes_one_copy_per_model_for_all_its_sessions(
    one_file, fused_one_file, tmp_path, monkeypatch
):
    before = _state(one_file), _state(fused_one_file)
    _copy_from(monkeypatch, EVERY)
    written: list[Path] = []
    save = _session_file.save_model
    monkeypatch.setattr(
        _session_file, "save_model", lambda m, p, **kw: written.append(Path(p)) or save(m, p, **kw)
    )
    spy = _Spy(monkeypatch)
    trace = tmp_path / "trace.json"
    report = profile_models(one_file, fused_one_file, options=QUICK, trace_path=trace)
    assert len(written) == 2 and {p.name for p in written} == {"decoder.onnx", "fused.onnx"}
    # two levels x two models, a traced session of each, the kept trace's: all copies
    assert len(spy.made) == 7 and {made["path"] for made in spy.made} == set(written)
    assert all(made["data"] for made in spy.made)
    assert not any(p.parent.parent.exists() for p in written)  # the scratch folder is gone
    assert (_state(one_file), _state(fused_one_file)) == before
    fused_nodes = {n.name for n in onnx.load(fused_one_file, load_external_data=False).graph.node}
    kernels = {e["name"].removesuffix("_kernel_time") for e in json.loads(trace.read_text())}
    assert fused_nodes & kernels  # the kept trace is the fused model's
    assert report.regions and report.latency[0].paired is not None


def _traced(path: Path, level: str, tmp_path: Path, min_bytes: int, monkeypatch):
    """The kernels one traced run ran (node, op, provider) and the allocator's figures."""
    _copy_from(monkeypatch, min_bytes)
    out = tmp_path / f"{level}-{min_bytes}.json"
    write_trace(path, out, runs=1, options=QUICK, level=level)
    events = read_trace(out)
    kernels = {(e["name"], e["args"].get("op_name"), e["args"].get("provider")) for e in events}
    return sorted(k for k in kernels if k[0].endswith("_kernel_time")), parse_trace(
        events, skip_runs=0, level=level
    ).memory


@pytest.mark.parametrize("level", ["ORT_ENABLE_ALL", "ORT_DISABLE_ALL"])
def test_profiling_from_the_copy_runs_the_same_kernels(
    fused_one_file, tmp_path, monkeypatch, level
):
    from_file, file_memory = _traced(fused_one_file, level, tmp_path, NEVER, monkeypatch)
    from_copy, copy_memory = _traced(fused_one_file, level, tmp_path, EVERY, monkeypatch)
    assert from_file and from_copy == from_file  # onnxruntime's own fusions included
    # the weights onnxruntime packs go to its allocator: packed alike from either file
    assert file_memory.allocator_peak_bytes > 4 << 20
    assert copy_memory == file_memory


def test_the_memory_measurement_reads_the_users_own_files(one_file, tmp_path, monkeypatch):
    _copy_from(monkeypatch, EVERY)
    measured: list[str] = []
    measure_one = footprint_module._measure_one

    def record(request, label, timeout_s):
        measured.append(request["model"])
        return measure_one(request, label, timeout_s)

    monkeypatch.setattr(footprint_module, "_measure_one", record)
    config = OptimizeConfig(target="onnxruntime", profile=True)
    output = tmp_path / "out" / "fused.onnx"
    outcome = run(one_file, output, config, external_data=False)
    assert outcome.written and outcome.result.check.passed
    assert measured == [str(one_file), str(output)]
    memory = outcome.report["memory"]
    assert memory["errors"] == [] and memory["before_bytes"] > 0 and memory["after_bytes"] > 0
    assert outcome.report["profile"]["latency"]
    assert sorted(p.name for p in output.parent.iterdir()) == ["fused.onnx"]
