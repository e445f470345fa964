"""Hostile uploads: each is refused with a 413/422 problem before anything loads the
model, leaves no job and no upload folder behind, and reads nothing outside the upload
folder. Plus the unit checks of ``model_checks`` that HTTP cannot reach (symlinks and
hard links inside the folder) and the streaming limit chunk by chunk."""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from starlette.requests import Request

from autofusion.app.api.uploads import incoming
from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.model_checks import inspect_model
from autofusion.app.services.uploads import check_file_name, receive_upload
from tests.event_loops import run_coroutine

WEIGHTS = np.arange(4, dtype=np.float32)


def _model(nodes, inputs=None, outputs=None, initializers=(), functions=(), opsets=None):
    graph = helper.make_graph(
        nodes,
        "g",
        inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=list(initializers),
    )
    opsets = opsets or [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions))


def external_model(location: str, dims=(4,), **entries: str) -> onnx.ModelProto:
    """y = x + W, with W's bytes in external data at ``location``."""
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=list(dims))
    weight.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, **entries}.items():
        weight.external_data.add(key=key, value=value)
    return _model([helper.make_node("Add", ["x", "W"], ["y"])], initializers=[weight])


def input_model(shape) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    return _model([helper.make_node("Relu", ["x"], ["y"])], inputs=[x], outputs=[y])


def constant_model(dims) -> onnx.ModelProto:
    value = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=dims, raw_data=b"")
    nodes = [
        helper.make_node("Constant", [], ["c"], value=value),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    return _model(nodes)


def domain_model(domain: str, in_subgraph: bool = False) -> onnx.ModelProto:
    evil = helper.make_node("Backdoor", ["x"], ["y"], domain=domain)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]
    if not in_subgraph:
        return _model([evil], opsets=opsets)
    branch = helper.make_graph(
        [evil], "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "else",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    return _model([node], inputs=[cond, x], opsets=opsets)


def function_model() -> onnx.ModelProto:
    """A model-local function in a custom domain, as fused_region writes them."""
    body = helper.make_function(
        "acme.fused",
        "DoubleRelu",
        ["a"],
        ["b"],
        [helper.make_node("Relu", ["a"], ["t"]), helper.make_node("Relu", ["t"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    node = helper.make_node("DoubleRelu", ["x"], ["y"], domain="acme.fused")
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("acme.fused", 1)]
    return _model([node], functions=[body], opsets=opsets)


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """Every path opened through Python while the test runs (open, io.open, os.open)."""
    paths: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def record_open(file, *args, **kwargs):
        if isinstance(file, str | bytes | os.PathLike):
            paths.append(os.path.abspath(os.fsdecode(file)))
        return real_open(file, *args, **kwargs)

    def record_os_open(path, *args, **kwargs):
        paths.append(os.path.abspath(os.fsdecode(path)))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", record_open)
    monkeypatch.setattr(io, "open", record_open)
    monkeypatch.setattr(os, "open", record_os_open)
    return paths


def assert_refused(service, response, problem, status: int, slug: str, opened: list[str]):
    body = problem(response, status, slug)
    assert service.job_count() == 0 and service.enqueued == []
    assert service.uploads_left() == []
    uploads = str(service.settings.uploads_dir.resolve())
    # The checks parse in a sandbox (model_work): the API process itself opens only the
    # upload, and what starting and watching a child takes (/dev/null, its /proc files).
    machinery = (os.devnull, "/proc/")
    outside = [p for p in opened if not p.startswith((uploads + os.sep, *machinery))]
    assert outside == [], f"read outside the upload folder: {outside}"
    return body


def assert_reads_only_its_folder(model: onnx.ModelProto, tmp_path: Path, opened: list[str]):
    """``inspect_model`` itself (what the sandbox runs) opens nothing outside the model's
    folder while it refuses ``model``."""
    folder = tmp_path / "upload"
    folder.mkdir()
    (folder / "w.bin").write_bytes(WEIGHTS.tobytes())
    onnx.save(model, folder / "model.onnx")
    opened.clear()
    with pytest.raises(ProblemError):
        inspect_model(folder / "model.onnx", ["w.bin"], Settings(data_dir=tmp_path / "data"))
    outside = [p for p in opened if not p.startswith(str(folder.resolve()) + os.sep)]
    assert outside == [], f"read outside the model's folder: {outside}"


@pytest.mark.parametrize(
    ("location", "words"),
    [
        pytest.param("../../etc/passwd", "outside the upload", id="dotdot"),
        pytest.param("/etc/passwd", "absolute path", id="absolute"),
        pytest.param("C:\\Windows\\win.ini", "absolute path", id="windows-absolute"),
        pytest.param("sub\\..\\..\\x", "outside the upload", id="backslash"),
        pytest.param("", "empty", id="empty"),
        pytest.param("not-uploaded.bin", "not one of the uploaded", id="missing"),
        pytest.param("sub/w.bin", "not one of the uploaded", id="subfolder"),
    ],
)
def test_external_data_outside_the_upload_is_refused(
    service, problem, opened, location, words, tmp_path
):
    model = external_model(location).SerializeToString()
    response = service.submit(model, data=[("w.bin", WEIGHTS.tobytes())])
    body = assert_refused(service, response, problem, 422, "unsafe-external-data", opened)
    assert words in body["detail"]
    assert not any("passwd" in p or "win.ini" in p for p in opened)
    assert_reads_only_its_folder(external_model(location), tmp_path, opened)


def test_external_data_shorter_than_its_tensor_is_refused(service, problem, opened):
    model = external_model("w.bin", dims=(4,)).SerializeToString()
    response = service.submit(model, data=[("w.bin", WEIGHTS[:2].tobytes())])
    body = assert_refused(service, response, problem, 422, "unsafe-external-data", opened)
    assert "past the end" in body["detail"]


def test_external_data_beside_the_model_is_accepted_and_stored(service, opened):
    model = external_model("w.bin", offset="0", length="16").SerializeToString()
    response = service.submit(model, data=[("w.bin", WEIGHTS.tobytes()), ("extra.txt", b"hi")])
    assert response.status_code == 202, response.text
    # The recorder sees the upload being written and stored (so its silence elsewhere
    # counts); the parse itself is the sandbox's.
    uploads = str(service.settings.uploads_dir.resolve())
    assert any(p.startswith(uploads) and p.endswith("model.onnx") for p in opened)
    files = {f["name"]: f["digest"] for f in response.json()["data_files"]}
    assert sorted(files) == ["extra.txt", "w.bin"]
    assert service.app.state.store.read_bytes(files["w.bin"]) == WEIGHTS.tobytes()
    assert service.uploads_left() == []


def test_oversized_body_is_refused_up_front(make_service, problem, opened):
    service = make_service(max_upload_bytes=10_000)
    opened.clear()  # starting the app reads its own files; only the request matters
    response = service.submit(os.urandom(50_000))
    body = assert_refused(service, response, problem, 413, "payload-too-large", opened)
    assert body["limit"] == 10_000


def test_oversized_body_without_content_length_is_refused_while_streaming(
    make_service, problem, opened, tiny_model
):
    service = make_service(max_upload_bytes=10_000)
    opened.clear()
    boundary = "xyz"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n'
            "\r\n"
        ).encode()
        + os.urandom(50_000)
        + f"\r\n--{boundary}--\r\n".encode()
    )

    def chunks():
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    response = service.client.post(
        "/v1/optimize",
        content=chunks(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    assert "content-length" not in response.request.headers
    assert_refused(service, response, problem, 413, "payload-too-large", opened)


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(external_model("w.bin", dims=(1_000_000, 1_000_000)), id="initializer"),
        pytest.param(input_model([1_000_000, 1_000_000]), id="graph-input"),
        pytest.param(constant_model([1_000_000, 1_000_000]), id="constant"),
    ],
)
def test_a_tensor_declaring_10e12_elements_is_refused(service, problem, opened, model):
    response = service.submit(model.SerializeToString(), data=[("w.bin", WEIGHTS.tobytes())])
    body = assert_refused(service, response, problem, 422, "tensor-too-large", opened)
    assert "1000000000000 elements" in body["detail"]


@pytest.mark.parametrize("in_subgraph", [False, True], ids=["graph", "if-branch"])
def test_an_unknown_op_domain_is_refused(service, problem, opened, in_subgraph):
    model = domain_model("evil.domain", in_subgraph).SerializeToString()
    body = assert_refused(
        service, service.submit(model), problem, 422, "op-domain-not-allowed", opened
    )
    assert body["domain"] == "evil.domain" and "evil.domain" in body["detail"]


def test_functions_the_model_defines_are_allowed(service):
    response = service.submit(function_model().SerializeToString())
    assert response.status_code == 202, response.text


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(np.random.default_rng(0).bytes(4096), id="random-bytes"),
        pytest.param(b"", id="empty"),
        pytest.param(b"\x08\x07", id="ir-version-only"),
    ],
)
def test_a_malformed_model_is_refused(service, problem, opened, content):
    assert_refused(service, service.submit(content), problem, 422, "invalid-model", opened)


@pytest.mark.parametrize("name", ["../x", "a/b.bin", "..", ".", "x" * 300])
def test_a_data_file_name_that_is_not_plain_is_refused(service, problem, opened, tiny_model, name):
    response = service.submit(tiny_model, data=[(name, b"0000")])
    body = assert_refused(service, response, problem, 422, "invalid-upload", opened)
    assert body["field"] == "data"


@pytest.mark.parametrize(
    ("data", "model_name", "words"),
    [
        pytest.param([("w.bin", b"1"), ("w.bin", b"2")], "m.onnx", "two parts", id="duplicate"),
        pytest.param([("m.onnx", b"1")], "m.onnx", "two parts", id="same-as-model"),
        pytest.param([], "../m.onnx", "not a plain file name", id="model-name"),
    ],
)
def test_clashing_or_unsafe_file_names_are_refused(
    service, problem, opened, tiny_model, data, model_name, words
):
    response = service.submit(tiny_model, model_name=model_name, data=data)
    body = assert_refused(service, response, problem, 422, "invalid-upload", opened)
    assert words in body["detail"]


def test_a_form_without_a_model_or_with_unknown_fields_is_refused(service, problem, tiny_model):
    no_model = service.client.post("/v1/optimize", files=[("data", ("w.bin", b"0"))])
    assert problem(no_model, 422, "invalid-upload")["field"] == "model"
    unknown = service.client.post(
        "/v1/optimize", files=[("model", ("m.onnx", tiny_model))], data={"modle": "x"}
    )
    assert problem(unknown, 422, "invalid-upload")["field"] == "modle"
    not_multipart = service.client.post("/v1/optimize", json={"model": "x"})
    problem(not_multipart, 415, "unsupported-media-type")
    truncated = service.client.post(
        "/v1/optimize",
        content=b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nabc',
        headers={"Content-Type": "multipart/form-data; boundary=b"},
    )
    problem(truncated, 422, "invalid-upload")
    assert service.job_count() == 0 and service.uploads_left() == []


@pytest.mark.parametrize("name", ["tab\tname", "nul\0", "C:\\x.bin", "a:b", "", "..", "a/b"])
def test_check_file_name_refuses_what_clients_might_not_encode(name):
    # HTTP clients percent-encode control characters and strip Windows paths; the server
    # must not depend on that.
    with pytest.raises(ProblemError) as caught:
        check_file_name(name, "data")
    assert caught.value.slug == "invalid-upload"


@pytest.mark.parametrize("name", ["w.bin", "model.onnx.data", "été.bin", "a..b", ".hidden"])
def test_check_file_name_accepts_plain_names(name):
    assert check_file_name(name, "data") == name


# Unit checks of model_checks: what an HTTP upload cannot put in the folder.


def _folder_with(tmp_path: Path, model: onnx.ModelProto) -> Path:
    folder = tmp_path / "upload"
    folder.mkdir()
    onnx.save(model, folder / "model.onnx")
    return folder


def _check(folder: Path, data_names, **settings) -> None:
    inspect_model(folder / "model.onnx", data_names, Settings(data_dir=folder, **settings))


def test_a_location_naming_a_symlink_in_the_folder_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(WEIGHTS.tobytes())
    folder = _folder_with(tmp_path, external_model("w.bin"))
    (folder / "w.bin").symlink_to(secret)
    with pytest.raises(ProblemError, match="symlink") as caught:
        _check(folder, ["w.bin"])
    assert caught.value.slug == "unsafe-external-data"


def test_a_location_passing_through_a_symlinked_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.bin").write_bytes(WEIGHTS.tobytes())
    folder = _folder_with(tmp_path, external_model("sub/w.bin"))
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ProblemError, match="symlink"):
        _check(folder, ["sub/w.bin"])


def test_a_hard_linked_data_file_is_refused(tmp_path):
    other = tmp_path / "other.bin"
    other.write_bytes(WEIGHTS.tobytes())
    folder = _folder_with(tmp_path, external_model("w.bin"))
    os.link(other, folder / "w.bin")
    with pytest.raises(ProblemError, match="hard link"):
        _check(folder, ["w.bin"])


def test_a_plain_data_file_passes_the_checks(tmp_path):
    folder = _folder_with(tmp_path, external_model("./w.bin"))
    (folder / "w.bin").write_bytes(WEIGHTS.tobytes())
    _check(folder, ["w.bin"])


def test_sparse_initializers_are_bounded_by_their_dense_shape(tmp_path):
    values = numpy_helper.from_array(np.ones(1, np.float32), "s")
    indices = numpy_helper.from_array(np.zeros(1, np.int64), "s_idx")
    sparse = helper.make_sparse_tensor(values, indices, [1_000_000, 1_000_000])
    model = _model([helper.make_node("Relu", ["x"], ["y"])])
    model.graph.sparse_initializer.append(sparse)
    folder = _folder_with(tmp_path, model)
    with pytest.raises(ProblemError, match="1000000000000 elements") as caught:
        _check(folder, [])
    assert caught.value.slug == "tensor-too-large"


def test_the_element_limit_comes_from_the_settings(tmp_path):
    folder = _folder_with(tmp_path, input_model([8, 8]))
    _check(folder, [], max_tensor_elements=64)
    with pytest.raises(ProblemError, match="at most 63 elements"):
        _check(folder, [], max_tensor_elements=63)


def test_the_streaming_limit_stops_reading_at_the_chunk_that_passes_it(tmp_path):
    """Nothing past the limit is read from the client, and the folder is removed."""
    settings = Settings(data_dir=tmp_path, max_upload_bytes=10_000)
    head = b'--b\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
    chunks = [head] + [b"\0" * 4096] * 10
    sent = 0

    async def receive():
        nonlocal sent
        sent += 1
        return {"type": "http.request", "body": chunks[sent - 1], "more_body": sent < len(chunks)}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/optimize",
        "headers": [(b"content-type", b"multipart/form-data; boundary=b")],
    }
    with pytest.raises(ProblemError) as caught:
        run_coroutine(receive_upload(incoming(Request(scope, receive), settings), settings))

    assert caught.value.status == 413 and caught.value.slug == "payload-too-large"
    assert sent == 4  # 74 + 3 * 4096 bytes > 10_000: the remaining chunks stay unread
    assert list(settings.uploads_dir.iterdir()) == []
