"""Weights held once (issue 29) in fusion_core/ir.py: a model as a proto without its
weights' bytes or with them, the save streamed to a data file, and every external tensor
of a file checked before onnxruntime may be handed its path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from autofusion.fusion_core import (
    OptimizeConfig,
    UnsafeModelError,
    load_model,
    run,
    save_model,
)
from autofusion.fusion_core.ir import proto_with_weights, weightless_proto

RNG = np.random.default_rng(0)
WEIGHTS = {
    "w": RNG.standard_normal((32, 32)).astype(np.float32),  # 4 KiB: out past 1 KiB
    "b": RNG.standard_normal(32).astype(np.float32),  # 128 bytes: stays inside
}


def _model() -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Add", ["m", "b"], ["y"])],
        "small",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 32])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(a, name) for name, a in WEIGHTS.items()],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def _with_data(folder: Path, proto: onnx.ModelProto | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(
        proto or _model(), path, save_as_external_data=True, location="weights.bin",
        size_threshold=0,
    )  # fmt: skip
    return path


def _lazy(model: ir.Model) -> dict[str, ir.ExternalTensor]:
    return {
        v.name: v.const_value
        for v in model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    }


def test_the_weightless_proto_has_every_tensors_type_and_shape_and_no_byte(tmp_path):
    model = load_model(_with_data(tmp_path))
    before = {name: v.const_value for name, v in model.graph.initializers.items()}
    proto = weightless_proto(model)
    full = proto_with_weights(model)
    for kept, whole in zip(proto.graph.initializer, full.graph.initializer, strict=True):
        assert (kept.name, kept.data_type, kept.dims) == (whole.name, whole.data_type, whole.dims)
        assert not kept.raw_data and kept.data_location == onnx.TensorProto.EXTERNAL
    assert proto.graph.node == full.graph.node and proto.graph.input == full.graph.input
    assert {n: v.const_value for n, v in model.graph.initializers.items()} == before  # as it was


def test_the_proto_with_weights_reads_lazy_tensors_and_leaves_them_lazy(tmp_path):
    path = _with_data(tmp_path)
    model = load_model(path)
    proto = proto_with_weights(model)
    for tensor in proto.graph.initializer:
        assert tensor.data_location == onnx.TensorProto.DEFAULT
        np.testing.assert_array_equal(numpy_helper.to_array(tensor), WEIGHTS[tensor.name])
    lazy = _lazy(model)
    assert set(lazy) == set(WEIGHTS)  # still read from the data file, and unmapped again
    assert all(t.raw is None for t in lazy.values())


@pytest.mark.parametrize("location", ["../secret.bin", "_ORT_MEM_ADDR_/0", "/etc/passwd"])
def test_a_sparse_initializer_cannot_point_onnxruntime_elsewhere(tmp_path, location):
    """onnx-ir does not read sparse initializers, onnxruntime does: the check hands it the
    file, so load_model must refuse their locations as it refuses the others'."""
    proto = _model()
    values = numpy_helper.from_array(np.ones(2, np.float32), "s")
    values.data_location = onnx.TensorProto.EXTERNAL
    values.external_data.add(key="location", value=location)
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "s_indices")
    proto.graph.sparse_initializer.append(oh.make_sparse_tensor(values, indices, [8]))
    onnx.save(proto, tmp_path / "model.onnx")
    with pytest.raises(UnsafeModelError, match="external data|absolute|markers"):
        load_model(tmp_path / "model.onnx")


def test_a_model_with_nothing_past_the_threshold_is_one_file(tmp_path):
    small = _model()
    small.graph.initializer.pop(0)  # b alone, 128 bytes
    small.graph.initializer.append(numpy_helper.from_array(WEIGHTS["w"][:4], "w"))
    path = tmp_path / "fused.onnx"
    assert save_model(ir.from_proto(small), path, external_data=True) == [path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx"]  # no empty data file


def test_saving_with_a_data_file_streams_the_lazy_weights(tmp_path, monkeypatch):
    model = load_model(_with_data(tmp_path / "in"))

    def read_in(_model):
        raise AssertionError("every weight read into memory at once")

    monkeypatch.setattr(ir.external_data, "load_to_model", read_in)
    path = tmp_path / "out" / "fused.onnx"
    written = save_model(model, path, external_data=True)

    assert written == [path, path.with_name("fused.onnx.data")]
    inside = onnx.load(path, load_external_data=False).graph.initializer
    where = {t.name: t.data_location for t in inside}
    assert where == {"w": onnx.TensorProto.EXTERNAL, "b": onnx.TensorProto.DEFAULT}
    assert path.stat().st_size < WEIGHTS["w"].nbytes  # the file holds no big weight
    reloaded = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    for name, array in WEIGHTS.items():
        np.testing.assert_array_equal(reloaded[name], array)
    lazy = _lazy(model)  # the model still reads its own data file, unmapped again
    assert set(lazy) == set(WEIGHTS) and all(t.raw is None for t in lazy.values())
    assert {Path(t.path).name for t in lazy.values()} == {"weights.bin"}


@pytest.mark.parametrize("external", [None, False], ids=["as-the-input", "one-file"])
def test_run_saves_as_the_input_came_or_as_asked(tmp_path, external):
    path = _with_data(tmp_path / "in")
    out = tmp_path / "out" / "fused.onnx"
    config = OptimizeConfig.model_validate({"check": {"enabled": False}})
    outcome = run(path, out, config, external_data=external)
    data = out.with_name("fused.onnx.data")
    assert outcome.written and data.is_file() == (external is None)
    assert outcome.report["size"]["after_files"] == (2 if external is None else 1)
    one_file = tmp_path / "reference.onnx"
    save_model(load_model(out), one_file)  # the same model, whichever way it was saved
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(one_file).graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer}
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
