"""Validation completeness of uploads (issue 15, item 5; app/services/model_checks.py).

Each of these was accepted before (or answered a text/plain 500): external-data entries
with keys onnx's loader would set as attributes (``__class__``, ``basepath``) or a key
given twice, an initializer whose stored bytes disagree with its dims, a model-local
function that calls itself, no cap on nodes or nesting, and names that are not UTF-8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.model_checks import inspect_model

WEIGHTS = np.arange(4, dtype=np.float32)


def _model(nodes, initializers=(), functions=(), opsets=None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=list(initializers),
    )
    opsets = opsets or [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def _external(entries: list[tuple[str, str]], dims=(4,)) -> onnx.ModelProto:
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=list(dims))
    weight.data_location = TensorProto.EXTERNAL
    for key, value in entries:
        weight.external_data.add(key=key, value=value)
    return _model([helper.make_node("Add", ["x", "W"], ["y"])], initializers=[weight])


def _write(tmp_path: Path, model: onnx.ModelProto | bytes, data: bytes | None = None) -> Path:
    folder = tmp_path / "upload"
    folder.mkdir(parents=True, exist_ok=True)
    content = model if isinstance(model, bytes) else model.SerializeToString()
    (folder / "model.onnx").write_bytes(content)
    if data is not None:
        (folder / "w.bin").write_bytes(data)
    return folder / "model.onnx"


def _refused(path: Path, slug: str, data_names=(), **settings) -> ProblemError:
    with pytest.raises(ProblemError) as caught:
        inspect_model(path, data_names, Settings(data_dir=path.parent, **settings))
    assert caught.value.slug == slug, caught.value.detail
    assert caught.value.status == 422
    return caught.value


def _accepted(path: Path, data_names=(), **settings) -> None:
    inspect_model(path, data_names, Settings(data_dir=path.parent, **settings))


# --- external data: the key whitelist and duplicates --------------------------------------


@pytest.mark.parametrize("key", ["__class__", "basepath", "name", "Location"])
def test_an_external_data_key_outside_the_whitelist_is_refused(tmp_path, key):
    path = _write(tmp_path, _external([("location", "w.bin"), (key, "x")]), WEIGHTS.tobytes())
    error = _refused(path, "unsafe-external-data", ["w.bin"])
    assert repr(key) in error.detail and "location, offset, length, checksum" in error.detail


@pytest.mark.parametrize("key", ["location", "offset"])
def test_an_external_data_key_given_twice_is_refused(tmp_path, key):
    entries = [("location", "w.bin"), ("offset", "0"), (key, "w.bin" if key == "location" else "0")]
    path = _write(tmp_path, _external(entries), WEIGHTS.tobytes())
    assert "twice" in _refused(path, "unsafe-external-data", ["w.bin"]).detail


def test_the_four_known_external_data_keys_are_accepted(tmp_path):
    entries = [("location", "w.bin"), ("offset", "0"), ("length", "16"), ("checksum", "abc")]
    _accepted(_write(tmp_path, _external(entries), WEIGHTS.tobytes()), ["w.bin"])


# --- stored bytes against dims and data type ----------------------------------------------


def _initializer_model(tensor: TensorProto) -> onnx.ModelProto:
    return _model([helper.make_node("Add", ["x", tensor.name], ["y"])], initializers=[tensor])


def test_raw_data_shorter_or_longer_than_the_dims_is_refused(tmp_path):
    for k, raw in enumerate((WEIGHTS.tobytes()[:12], WEIGHTS.tobytes() + b"\0" * 4)):
        tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4], raw_data=raw)
        path = _write(tmp_path / str(k), _initializer_model(tensor))
        error = _refused(path, "tensor-size-mismatch")
        assert "16 bytes" in error.detail and f"{len(raw)} bytes of raw_data" in error.detail


def test_a_typed_field_with_the_wrong_count_is_refused(tmp_path):
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4], float_data=[1, 2, 3])
    error = _refused(_write(tmp_path, _initializer_model(tensor)), "tensor-size-mismatch")
    assert "3 values in float_data" in error.detail


def test_a_tensor_that_stores_nothing_is_refused(tmp_path):
    tensor = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4])
    _refused(_write(tmp_path, _initializer_model(tensor)), "tensor-size-mismatch")


def test_a_constant_node_value_is_checked_too(tmp_path):
    value = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[4], raw_data=b"\0" * 8)
    nodes = [
        helper.make_node("Constant", [], ["c"], value=value),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    _refused(_write(tmp_path, _model(nodes)), "tensor-size-mismatch")


def test_an_external_length_that_disagrees_with_the_dims_is_refused(tmp_path):
    entries = [("location", "w.bin"), ("offset", "0"), ("length", "8")]
    path = _write(tmp_path, _external(entries), WEIGHTS.tobytes())
    assert "external-data length of 8" in _refused(path, "tensor-size-mismatch", ["w.bin"]).detail


@pytest.mark.parametrize(
    "array",
    [
        np.arange(4, dtype=np.float32),
        np.arange(6, dtype=np.int64).reshape(2, 3),
        np.array([True, False]),
        np.arange(3, dtype=np.float16),
        np.array([1 + 2j], dtype=np.complex64),
        np.array(["a", "bc"], dtype=object),
        np.zeros((0, 4), dtype=np.float32),
    ],
    ids=lambda a: str(a.dtype),
)
def test_well_formed_tensors_of_every_kind_are_accepted(tmp_path, array):
    raw = numpy_helper.from_array(array, "W")  # raw_data (strings: string_data)
    typed = helper.make_tensor("W", raw.data_type, array.shape, array.flatten().tolist())
    for k, tensor in enumerate((raw, typed)):
        nodes = [helper.make_node("Identity", ["x"], ["y"])]
        _accepted(_write(tmp_path / str(k), _model(nodes, initializers=[tensor])))


def test_packed_int4_counts_two_elements_per_entry(tmp_path):
    tensor = helper.make_tensor("W", TensorProto.INT4, [5], [1, 2, 3, 4, 5])
    assert len(tensor.int32_data) == 3
    nodes = [helper.make_node("Identity", ["x"], ["y"])]
    _accepted(_write(tmp_path, _model(nodes, initializers=[tensor])))


# --- recursion in model-local functions ---------------------------------------------------


def _function(name: str, calls: list[str], domain: str = "ai.acme") -> onnx.FunctionProto:
    nodes, current = [], "a"
    for k, callee in enumerate(calls):
        nodes.append(helper.make_node(callee, [current], [f"t{k}"], domain=domain))
        current = f"t{k}"
    nodes.append(helper.make_node("Relu", [current], ["b"]))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    return helper.make_function(domain, name, ["a"], ["b"], nodes, opsets)


def _calling(functions: list[onnx.FunctionProto]) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.acme", 1)]
    node = helper.make_node(functions[0].name, ["x"], ["y"], domain="ai.acme")
    return _model([node], functions=functions, opsets=opsets)


def test_a_self_recursive_function_is_refused(tmp_path):
    error = _refused(_write(tmp_path, _calling([_function("f", ["f"])])), "recursive-function")
    assert "ai.acme::f -> ai.acme::f" in error.detail


def test_mutually_recursive_functions_are_refused(tmp_path):
    functions = [_function("f", ["g"]), _function("g", ["h"]), _function("h", ["f"])]
    error = _refused(_write(tmp_path, _calling(functions)), "recursive-function")
    assert "ai.acme::f -> ai.acme::g -> ai.acme::h -> ai.acme::f" in error.detail


def test_recursion_through_a_subgraph_in_a_function_body_is_refused(tmp_path):
    branch = helper.make_graph(
        [helper.make_node("f", ["a"], ["r"], domain="ai.acme")],
        "branch",
        [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [4])],
    )
    body = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True))),
        helper.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=branch),
    ]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.acme", 1)]
    f = helper.make_function("ai.acme", "f", ["a"], ["b"], body, opsets)
    _refused(_write(tmp_path, _calling([f])), "recursive-function")


def test_functions_calling_other_functions_without_a_cycle_are_accepted(tmp_path):
    functions = [_function("f", ["g", "h"]), _function("g", ["h"]), _function("h", [])]
    _accepted(_write(tmp_path, _calling(functions)))


# --- caps: node count and nesting depth ----------------------------------------------------


def _chain(length: int) -> onnx.ModelProto:
    names = ["x", *(f"t{k}" for k in range(length - 1)), "y"]
    nodes = [helper.make_node("Relu", [a], [b]) for a, b in zip(names, names[1:], strict=False)]
    return _model(nodes)


def test_more_nodes_than_max_model_nodes_is_refused_naming_the_setting(tmp_path):
    path = _write(tmp_path, _chain(6))
    _accepted(path, max_model_nodes=6)
    error = _refused(path, "too-many-nodes", max_model_nodes=5)
    assert "max_model_nodes" in error.detail and "5" in error.detail


def _nested_ifs(depth: int) -> onnx.ModelProto:
    """``depth`` graphs nested inside each other (the main graph is 1)."""
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "leaf", [], [out])
    for level in range(depth - 1):
        cond = f"c{level}"
        nodes = [
            helper.make_node("Constant", [], [cond], value=numpy_helper.from_array(np.array(True))),
            helper.make_node("If", [cond], ["y"], then_branch=graph, else_branch=graph),
        ]
        graph = helper.make_graph(nodes, f"level{level}", [], [out])
    return _model(list(graph.node))


def test_subgraphs_nested_deeper_than_max_graph_depth_are_refused_naming_the_setting(tmp_path):
    path = _write(tmp_path, _nested_ifs(4))
    _accepted(path, max_graph_depth=4)
    _accepted(path)  # the default is generous
    error = _refused(path, "nesting-too-deep", max_graph_depth=3)
    assert "max_graph_depth" in error.detail


def test_the_caps_default_to_generous_values():
    settings = Settings()
    assert settings.max_model_nodes == 1_000_000 and settings.max_graph_depth == 64


# --- text that is not UTF-8 -----------------------------------------------------------------


def _with_bytes(model: onnx.ModelProto, placeholder: bytes, replacement: bytes) -> bytes:
    """The serialized model with ``placeholder`` replaced by as many arbitrary bytes
    (onnx's Python API refuses to set a string field that is not UTF-8)."""
    assert len(placeholder) == len(replacement)
    content = model.SerializeToString()
    assert content.count(placeholder) == 1
    return content.replace(placeholder, replacement)


def test_a_node_domain_that_is_not_utf8_is_refused(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"], domain="PLACEHOLD")
    content = _with_bytes(_model([node]), b"PLACEHOLD", b"ai.\xff\xfe\xfdxxx")
    assert "not valid UTF-8" in _refused(_write(tmp_path, content), "invalid-model").detail


@pytest.mark.parametrize("field", ["key", "value"])
def test_an_external_data_entry_that_is_not_utf8_is_refused(tmp_path, field):
    entries = [("location", "PLACEHOLD" if field == "value" else "w.bin")]
    if field == "key":
        entries.append(("PLACEHOLD", "0"))
    content = _with_bytes(_external(entries), b"PLACEHOLD", b"w\xff\xfe.bin\xc3\x28")
    error = _refused(_write(tmp_path, content, WEIGHTS.tobytes()), "invalid-model", ["w.bin"])
    assert "not valid UTF-8" in error.detail


@pytest.mark.parametrize("location", ["w\x00.bin", "a" * 5000])
def test_a_location_that_is_no_file_name_is_refused(tmp_path, location):
    path = _write(tmp_path, _external([("location", location)]), WEIGHTS.tobytes())
    _refused(path, "unsafe-external-data", [location])


def test_an_upload_with_a_non_utf8_domain_is_a_422_problem_not_a_500(service, problem):
    node = helper.make_node("Relu", ["x"], ["y"], domain="PLACEHOLD")
    content = _with_bytes(_model([node]), b"PLACEHOLD", b"ai.\xff\xfe\xfdxxx")
    problem(service.submit(content), 422, "invalid-model")
    assert service.job_count() == 0


# --- issue 26: every string field is checked, not only names --------------------------------

# Nine bytes that are not UTF-8, as long as the placeholder they replace.
NOT_UTF8 = b"bad\xff\xfe\xc3\x28xx"


def _set_text(field: str, model: onnx.ModelProto) -> None:
    graph = model.graph
    targets = {
        "doc_string": (model, "doc_string"),
        "producer_name": (model, "producer_name"),
        "producer_version": (model, "producer_version"),
        "domain": (model, "domain"),
        "graph.name": (graph, "name"),
        "graph.doc_string": (graph, "doc_string"),
        "graph.node[0].name": (graph.node[0], "name"),
        "graph.node[0].doc_string": (graph.node[0], "doc_string"),
        "graph.input[0].doc_string": (graph.input[0], "doc_string"),
    }
    if field.startswith("metadata_props"):
        key, value = ("PLACEHOLD", "v") if field.endswith("key") else ("k", "PLACEHOLD")
        helper.set_model_props(model, {key: value})
        return
    owner, name = targets[field]
    setattr(owner, name, "PLACEHOLD")


TEXT_FIELDS = [
    "doc_string",
    "producer_name",
    "producer_version",
    "domain",
    "graph.name",
    "graph.doc_string",
    "graph.node[0].name",
    "graph.node[0].doc_string",
    "graph.input[0].doc_string",
    "metadata_props[0].key",
    "metadata_props[0].value",
]


def _not_utf8_in(field: str) -> bytes:
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    _set_text(field, model)
    return _with_bytes(model, b"PLACEHOLD", NOT_UTF8)


@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_any_string_field_that_is_not_utf8_is_refused_naming_the_field(tmp_path, field):
    error = _refused(_write(tmp_path, _not_utf8_in(field)), "invalid-model")
    assert f"the model's field {field} is not valid UTF-8" in error.detail, error.detail
    assert "export the model again" in error.detail
    assert error.extra["at"] == field


def test_an_upload_with_a_non_utf8_doc_string_is_a_422_naming_the_field(service, problem):
    body = problem(service.submit(_not_utf8_in("producer_name")), 422, "invalid-model")
    assert "producer_name is not valid UTF-8" in body["detail"] and body["at"] == "producer_name"
    assert service.job_count() == 0


# --- issue 26: locations onnxruntime gives a meaning of its own ------------------------------

RUNTIME_MARKERS = ["_ORT_MEM_ADDR_", "*/_ORT_MEM_ADDR_/*", "_ORT_NATIVE_ENDIAN_MEM_ADDR_"]


@pytest.mark.parametrize("location", RUNTIME_MARKERS)
def test_an_onnxruntime_marker_location_is_refused_even_when_uploaded(tmp_path, location):
    path = _write(tmp_path, _external([("location", location)]))
    data = path.parent / location  # the file is there and listed: only the name is wrong
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(WEIGHTS.tobytes())
    error = _refused(path, "unsafe-external-data", [location])
    assert "memory address" in error.detail and "rename the data file" in error.detail


def test_a_data_file_named_ort_mem_addr_is_a_422(service, problem):
    model = _external([("location", "_ORT_MEM_ADDR_")]).SerializeToString()
    response = service.submit(model, data=[("_ORT_MEM_ADDR_", WEIGHTS.tobytes())])
    body = problem(response, 422, "unsafe-external-data")
    assert "_ORT_MEM_ADDR_" in body["detail"]
    assert service.job_count() == 0
