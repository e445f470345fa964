"""Loading untrusted models safely, and saving them back.

A hostile model may point its external data anywhere; ``load_model`` must refuse every
location outside the model's folder *before* any tensor data is read.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from autofusion import fusion_core
from autofusion.fusion_core import ModelLoadError, UnsafeModelError, load_model, save_model
from autofusion.fusion_core.ir import check_external_data, model_from_proto

WEIGHTS = {
    "w": np.arange(32 * 32, dtype=np.float32).reshape(32, 32) / 7,
    "b": np.linspace(-1, 1, 32, dtype=np.float32),
}
DATA_BYTES = sum(a.nbytes for a in WEIGHTS.values())


def small_model() -> onnx.ModelProto:
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            oh.make_node("Add", ["m", "b"], ["y"], name="add"),
        ],
        "small",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 32])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(a, name) for name, a in WEIGHTS.items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def save_with_external_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save_model(
        small_model(),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    assert (folder / "weights.bin").stat().st_size == DATA_BYTES
    return path


def tamper(path: Path, tensor: str = "w", **entries: str) -> None:
    """Rewrite the external-data entries of one initializer in the saved proto."""
    proto = onnx.load(path, load_external_data=False)
    (init,) = [t for t in proto.graph.initializer if t.name == tensor]
    current = {e.key: e.value for e in init.external_data}
    current.update(entries)
    del init.external_data[:]
    for key, value in current.items():
        entry = init.external_data.add()
        entry.key, entry.value = key, value
    onnx.save_model(proto, path)


def initializer_arrays(model: ir.Model) -> dict[str, np.ndarray]:
    return {name: v.const_value.numpy() for name, v in model.graph.initializers.items()}


@pytest.fixture
def data_loads(monkeypatch) -> list[str]:
    """Records every external tensor whose bytes onnx-ir tries to read."""
    loads: list[str] = []

    def refuse(self):
        loads.append(self.path)
        raise AssertionError(f"external data was read from {self.path}")

    monkeypatch.setattr(ir.ExternalTensor, "_load", refuse)
    return loads


# --- valid external data -------------------------------------------------------------


def test_external_data_model_loads_equal_to_the_original(tmp_path):
    path = save_with_external_data(tmp_path / "model")

    model = load_model(path)

    arrays = initializer_arrays(model)
    assert sorted(arrays) == sorted(WEIGHTS)
    for name, original in WEIGHTS.items():
        np.testing.assert_array_equal(arrays[name], original)


def test_external_data_stays_lazy_until_read(tmp_path, data_loads):
    path = save_with_external_data(tmp_path / "model")

    model = load_model(path)

    assert isinstance(model.graph.initializers["w"].const_value, ir.ExternalTensor)
    assert data_loads == []


def test_external_data_in_a_subfolder_is_allowed(tmp_path):
    folder = tmp_path / "model"
    path = save_with_external_data(folder)
    (folder / "data").mkdir()
    (folder / "weights.bin").rename(folder / "data" / "weights.bin")
    tamper(path, "w", location="data/weights.bin")
    tamper(path, "b", location="data/weights.bin")

    model = load_model(path)

    np.testing.assert_array_equal(initializer_arrays(model)["w"], WEIGHTS["w"])


# --- unsafe external data ------------------------------------------------------------


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder next to the model's holding a file the model must never read."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.bin").write_bytes(b"S" * DATA_BYTES)
    return folder


def symlinked_file(folder: Path, outside: Path) -> dict[str, str]:
    os.symlink(outside / "secret.bin", folder / "link.bin")
    return {"location": "link.bin"}


def symlinked_folder(folder: Path, outside: Path) -> dict[str, str]:
    os.symlink(outside, folder / "linked", target_is_directory=True)
    return {"location": "linked/secret.bin"}


UNSAFE_LOCATIONS = [
    pytest.param(
        lambda folder, outside: {"location": "../../etc/passwd"},
        "outside the model's folder",
        id="parent-traversal",
    ),
    pytest.param(
        lambda folder, outside: {"location": "../outside/secret.bin"},
        "outside the model's folder",
        id="parent-traversal-to-existing-file",
    ),
    pytest.param(
        lambda folder, outside: {"location": "data/../../outside/secret.bin"},
        "outside the model's folder",
        id="traversal-inside-path",
    ),
    pytest.param(
        lambda folder, outside: {"location": "/etc/passwd"},
        "absolute path",
        id="absolute-path",
    ),
    pytest.param(
        lambda folder, outside: {"location": str(outside / "secret.bin")},
        "absolute path",
        id="absolute-path-to-existing-file",
    ),
    pytest.param(symlinked_file, "symlink", id="symlinked-file"),
    pytest.param(symlinked_folder, "symlink", id="symlinked-folder"),
    pytest.param(
        lambda folder, outside: {"location": "missing.bin"},
        "missing",
        id="missing-file",
    ),
    pytest.param(
        lambda folder, outside: {"offset": str(DATA_BYTES)},
        "runs past the end of the file",
        id="offset-past-end",
    ),
    pytest.param(
        lambda folder, outside: {"offset": "0", "length": str(DATA_BYTES + 4)},
        "runs past the end of the file",
        id="length-past-end",
    ),
]


@pytest.mark.parametrize(("make_entries", "problem"), UNSAFE_LOCATIONS)
def test_unsafe_external_data_is_refused_before_reading(
    tmp_path, outside, data_loads, make_entries, problem
):
    folder = tmp_path / "model"
    path = save_with_external_data(folder)
    tamper(path, "w", **make_entries(folder, outside))

    with pytest.raises(UnsafeModelError) as info:
        load_model(path)

    assert problem in str(info.value)
    assert "'w'" in str(info.value)
    assert info.value.code == "unsafe-model"
    assert data_loads == []


@pytest.mark.parametrize("location", [pytest.param("", id="empty"), pytest.param(".", id="dot")])
def test_degenerate_location_is_refused_as_a_model_error(tmp_path, data_loads, location):
    path = save_with_external_data(tmp_path / "model")
    tamper(path, "w", location=location)

    with pytest.raises((UnsafeModelError, ModelLoadError)) as info:
        load_model(path)

    assert "'w'" in str(info.value)
    assert data_loads == []


def test_model_from_proto_checks_external_data_against_base_dir(tmp_path, outside, data_loads):
    folder = tmp_path / "model"
    path = save_with_external_data(folder)
    tamper(path, "w", location="../outside/secret.bin")
    proto = onnx.load(path, load_external_data=False)

    with pytest.raises(UnsafeModelError, match="outside the model's folder"):
        model_from_proto(proto, base_dir=folder)
    assert data_loads == []


def test_check_external_data_accepts_the_model_folder(tmp_path):
    folder = tmp_path / "model"
    model = ir.load(save_with_external_data(folder))

    check_external_data(model, folder)


def test_check_external_data_refuses_another_folder(tmp_path):
    folder = tmp_path / "model"
    model = ir.load(save_with_external_data(folder))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    with pytest.raises(UnsafeModelError, match="missing"):
        check_external_data(model, elsewhere)


# --- files that are not models -------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(np.random.default_rng(0).bytes(4096), id="random-bytes"),
        pytest.param(np.random.default_rng(1).bytes(17), id="short-random-bytes"),
        pytest.param(b"name: resnet\nlayers: 50\n", id="text-file"),
        pytest.param(b"", id="empty-file"),
    ],
)
def test_non_onnx_file_is_a_model_load_error(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)

    with pytest.raises(ModelLoadError) as info:
        load_model(path)

    assert "model.onnx" in str(info.value)
    assert info.value.code == "invalid-model"


def test_missing_file_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nowhere.onnx")


def test_folder_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a file"):
        load_model(tmp_path)


# --- saving --------------------------------------------------------------------------


def test_save_model_round_trips_a_small_model(tmp_path):
    model = ir.from_proto(small_model())
    path = tmp_path / "out" / "model.onnx"

    written = save_model(model, path)

    assert written == [path]
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]
    onnx.checker.check_model(onnx.load(path), full_check=True)
    reloaded = load_model(path)
    assert [n.op_type for n in reloaded.graph] == ["MatMul", "Add"]
    for name, original in WEIGHTS.items():
        np.testing.assert_array_equal(initializer_arrays(reloaded)[name], original)


def test_save_model_uses_external_data_past_the_protobuf_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(fusion_core.ir, "PROTOBUF_LIMIT_BYTES", 64)
    model = ir.from_proto(small_model())
    path = tmp_path / "model.onnx"

    written = save_model(model, path)

    data = tmp_path / "model.onnx.data"
    assert written == [path, data]
    # w (4 KiB) goes out; b (128 bytes) is under onnx-ir's threshold and stays inline.
    assert data.stat().st_size >= WEIGHTS["w"].nbytes
    proto = onnx.load(path, load_external_data=False)
    locations = {t.name: t.data_location for t in proto.graph.initializer}
    assert locations["w"] == onnx.TensorProto.EXTERNAL
    reloaded = load_model(path)
    for name, original in WEIGHTS.items():
        np.testing.assert_array_equal(initializer_arrays(reloaded)[name], original)


def test_save_model_of_external_data_model_to_another_folder_reloads(tmp_path):
    model = load_model(save_with_external_data(tmp_path / "in"))
    path = tmp_path / "out" / "model.onnx"

    save_model(model, path)

    reloaded = load_model(path)
    for name, original in WEIGHTS.items():
        np.testing.assert_array_equal(initializer_arrays(reloaded)[name], original)


def test_public_api_exports_load_and_save():
    assert fusion_core.load_model is load_model
    assert fusion_core.save_model is save_model


def test_optimize_a_model_with_external_data_from_another_directory(tmp_path, monkeypatch):
    # The check must find the weights beside the model, whatever the working directory.
    import onnx as _onnx

    from autofusion.fusion_core import OptimizeConfig, optimize

    model = _onnx.load("tests/data/resnet/resnet50_w8_torchscript.onnx")
    folder = tmp_path / "model"
    folder.mkdir()
    _onnx.save_model(
        model,
        folder / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.weights",
        size_threshold=0,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = optimize(folder / "m.onnx", OptimizeConfig())
    assert result.check is not None and result.check.error is None
    assert result.check.passed
    assert result.ops_after.get("BatchNormalization", 0) == 0


# --- issue 26: text that is not UTF-8, onnxruntime's marker locations -------------------


def _not_utf8(field: str) -> bytes:
    """``small_model`` serialized with ``field`` holding bytes that are not UTF-8 (onnx's
    Python API refuses to set them: a placeholder of the same length is replaced)."""
    model = small_model()
    owner, name = {
        "doc_string": (model, "doc_string"),
        "producer_name": (model, "producer_name"),
        "graph.name": (model.graph, "name"),
        "graph.node[1].doc_string": (model.graph.node[1], "doc_string"),
    }[field]
    setattr(owner, name, "PLACEHOLD")
    content = model.SerializeToString()
    assert content.count(b"PLACEHOLD") == 1
    return content.replace(b"PLACEHOLD", b"bad\xff\xfe\xc3\x28xx")


@pytest.mark.parametrize(
    "field", ["doc_string", "producer_name", "graph.name", "graph.node[1].doc_string"]
)
def test_a_string_field_that_is_not_utf8_is_a_model_load_error(tmp_path, field):
    """Before: the model loaded, and the job failed later, writing it back, as an internal
    error (onnx-ir's SerdeError)."""
    path = tmp_path / "model.onnx"
    path.write_bytes(_not_utf8(field))

    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert f"its field {field} is not valid UTF-8" in str(info.value)
    assert info.value.code == "invalid-model"
    with pytest.raises(ModelLoadError, match="not valid UTF-8"):
        model_from_proto(onnx.load_from_string(_not_utf8(field)))


@pytest.mark.parametrize(
    "location", ["_ORT_MEM_ADDR_", "*/_ORT_MEM_ADDR_/*", "*/_ORT_NATIVE_ENDIAN_MEM_ADDR_/*"]
)
def test_an_onnxruntime_marker_location_is_refused(tmp_path, data_loads, location):
    """onnxruntime reads ``*/_ORT_MEM_ADDR_/*`` as "the tensor is at the memory address in
    offset"; a file of that name is there, so only the name can be refused."""
    folder = tmp_path / "model"
    path = save_with_external_data(folder)
    target = folder / location
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((folder / "weights.bin").read_bytes())
    tamper(path, "w", location=location)

    with pytest.raises(UnsafeModelError, match="memory address") as info:
        load_model(path)
    assert "'w'" in str(info.value)
    assert data_loads == []
