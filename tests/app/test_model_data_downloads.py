"""A fused model comes back the way its model went in (issue 29): a model sent with its
weights in a data file is fused into a model whose weights are in a data file too,
named ``<stem>.fused.onnx.data`` as the model names it; ``GET
/v1/jobs/{id}/model/data/{name}`` serves it (ETag, HEAD, Range), the job's
``links.model_data`` lists it, and every client (``submit -o``, ``jobs download``, the
typed ``Client``) writes it beside the model. Downloads broken mid-body resume."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_server import (
    Server,
    clean_client_env,  # noqa: F401 (autouse: no AUTOFUSION_*, GITHUB_* variables)
    run_cli,
    started_server,
)
from onnx import TensorProto, helper, numpy_helper

from autofusion.app.cli._exit import EXIT_OK
from autofusion.app.client import AutofusionError, Client, Transport
from autofusion.app.client._model_files import download_model_files

RTOL = ATOL = 1e-5
DATA = "w.bin"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from started_server(tmp_path_factory, "modeldata")


def mlp(folder: Path, *, external: bool) -> Path:
    """MatMul + Add + Relu twice, 64 wide, random weights; in ``folder/m.onnx`` with the
    weights in ``folder/w.bin`` when ``external``."""
    rng = np.random.default_rng(7)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("w1", (64, 64)), ("b1", (64,)), ("w2", (64, 64)), ("b2", (64,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"]),
        helper.make_node("Add", ["h2", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    if external:
        onnx.save(model, path, save_as_external_data=True, location=DATA, size_threshold=0)
    else:
        onnx.save(model, path)
    return path


def outputs(path: Path) -> np.ndarray:
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def locations(path: Path) -> set[str]:
    model = onnx.load(path, load_external_data=False)
    return {
        entry.value
        for tensor in model.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }


@pytest.mark.slow
def test_submit_writes_the_model_and_its_data_file_beside_it(capsys, server, tmp_path):
    model = mlp(tmp_path, external=True)
    out = tmp_path / "out" / "renamed.onnx"  # any name: the data file keeps the model's
    code, stdout, err = run_cli(
        capsys, "submit", model, "--data", tmp_path / DATA, "--wait", "-o", out,
        "--server", server.url, "--timeout", "120",
    )  # fmt: skip
    assert code == EXIT_OK, err
    data = out.parent / "m.fused.onnx.data"
    assert data.is_file() and f"its data:           {data}" in stdout
    assert locations(out) == {"m.fused.onnx.data"}
    np.testing.assert_allclose(outputs(out), outputs(model), rtol=RTOL, atol=ATOL)

    job_id = re.search(r"job:\s+(\S+) succeeded", stdout).group(1)
    with Client(server.url) as client:
        links = client.job(job_id).links
    assert list(links["model_data"]) == ["m.fused.onnx.data"]


@pytest.mark.slow
def test_the_data_file_download_answers_head_range_and_unknown_names(server, tmp_path):
    model = mlp(tmp_path, external=True)
    with Client(server.url) as client:
        job = client.wait(client.submit(model, data=[tmp_path / DATA]), timeout=120)
        assert job.succeeded, job.error
        url = job.links["model_data"]["m.fused.onnx.data"]
        assert url == f"/v1/jobs/{job.id}/model/data/m.fused.onnx.data"
        written = client.model_files(job, tmp_path / "got" / "m.fused.onnx")
    assert [p.name for p in written] == ["m.fused.onnx", "m.fused.onnx.data"]
    data = written[1].read_bytes()
    np.testing.assert_allclose(outputs(written[0]), outputs(model), rtol=RTOL, atol=ATOL)

    head = httpx.head(server.url + url)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(data)
    assert head.headers["accept-ranges"] == "bytes" and head.headers["etag"]
    part = httpx.get(server.url + url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == data[100:200]
    cached = httpx.get(server.url + url, headers={"If-None-Match": head.headers["etag"]})
    assert cached.status_code == 304 and cached.content == b""
    missing = httpx.get(f"{server.url}/v1/jobs/{job.id}/model/data/other.data")
    assert missing.status_code == 404
    assert "m.fused.onnx.data" in missing.json()["detail"]
    page = httpx.get(f"{server.url}/ui/jobs/{job.id}")
    assert f"/ui/jobs/{job.id}/download/model-data/m.fused.onnx.data" in page.text
    ui = httpx.get(f"{server.url}/ui/jobs/{job.id}/download/model-data/m.fused.onnx.data")
    assert ui.status_code == 200 and ui.content == data


@pytest.mark.slow
def test_a_model_in_one_file_comes_back_as_one_file(capsys, server, tmp_path):
    model = mlp(tmp_path, external=False)
    with Client(server.url) as client:
        job = client.wait(client.submit(model), timeout=120)
        assert job.succeeded and job.links["model_data"] == {}
    out = tmp_path / "one" / "m.fused.onnx"
    code, _, err = run_cli(capsys, "jobs", "download", job.id, "-o", out, "--server", server.url)
    assert code == EXIT_OK and f"wrote {out}" in err
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.fused.onnx"]
    np.testing.assert_allclose(outputs(out), outputs(model), rtol=RTOL, atol=ATOL)


class _Flaky:
    """Serves ``content`` with Range support; the first ``breaks`` answers stop after
    ``cut`` bytes with a broken connection. ``changed``: the file changes after the first
    answer (a new ETag), so a resume must start over."""

    def __init__(self, content: bytes, cut: int, breaks: int = 1, changed: bytes | None = None):
        self.content, self.cut, self.breaks, self.changed = content, cut, breaks, changed
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        first = len(self.requests) == 1
        content = self.content if first or self.changed is None else self.changed
        etag = '"a"' if content is self.content else '"b"'
        start, status = 0, 200
        wanted = request.headers.get("range")
        if wanted and request.headers.get("if-range") == etag:
            start, status = int(wanted.removeprefix("bytes=").rstrip("-")), 206
        body = content[start:]
        headers = {"ETag": etag, "Content-Length": str(len(body))}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        broken = len(self.requests) <= self.breaks
        return httpx.Response(status, headers=headers, stream=_Stream(body, self.cut, broken))


class _Stream(httpx.SyncByteStream):
    def __init__(self, body: bytes, cut: int, broken: bool) -> None:
        self.body, self.cut, self.broken = body, cut, broken

    def __iter__(self) -> Iterator[bytes]:
        if self.broken:
            yield self.body[: self.cut]
            raise httpx.ReadError("connection reset")
        yield self.body


def _transport(handler) -> Transport:
    transport = Transport("http://test", None, user_agent="test")
    transport.http = httpx.Client(base_url="http://test", transport=httpx.MockTransport(handler))
    return transport


@pytest.mark.parametrize("cut", [0, 1, 4095, 4999])
def test_a_broken_download_resumes_where_it_stopped(tmp_path, monkeypatch, cut):
    monkeypatch.setattr("time.sleep", lambda _: None)
    content = os.urandom(10_000)
    server = _Flaky(content, cut, breaks=2)
    _transport(server).download("/f", tmp_path / "f.bin")
    assert (tmp_path / "f.bin").read_bytes() == content
    assert not (tmp_path / "f.bin.part").exists()
    ranges = [r.headers.get("range") for r in server.requests]
    # the first asks for everything; each retry from what it had (nothing: the start)
    assert ranges == ([None, f"bytes={cut}-", f"bytes={2 * cut}-"] if cut else [None] * 3)


def test_a_file_changed_between_attempts_comes_whole_again(tmp_path, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda _: None)
    new = os.urandom(8_000)
    server = _Flaky(os.urandom(10_000), 5_000, changed=new)
    _transport(server).download("/f", tmp_path / "f.bin")
    assert (tmp_path / "f.bin").read_bytes() == new
    assert server.requests[1].headers["if-range"] == '"a"'


def test_a_download_that_keeps_breaking_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda _: None)
    server = _Flaky(os.urandom(1_000), 10, breaks=99)
    with pytest.raises(AutofusionError, match="download of /f failed: connection reset"):
        _transport(server).download("/f", tmp_path / "f.bin")
    assert list(tmp_path.iterdir()) == []
    assert len(server.requests) == 4


@pytest.mark.parametrize("name", ["../x.data", "/etc/passwd", "a/b.data", "..", "", "a\\b"])
def test_a_data_file_name_that_is_not_plain_is_refused_before_any_write(tmp_path, name):
    fetched: list[str] = []
    with pytest.raises(AutofusionError, match="not a plain file name"):
        download_model_files(
            lambda url, path: fetched.append(url), "/m", {name: "/d"}, tmp_path / "m.onnx"
        )
    assert fetched == []


def test_a_download_of_a_local_blob_links_it_instead_of_copying(tmp_path, monkeypatch):
    from autofusion.app.services.artifacts import LocalStore

    store = LocalStore(tmp_path / "store")
    digest = store.put_bytes(os.urandom(5000))
    blob = next((tmp_path / "store").rglob(digest))
    linked = store.fetch_for_reading(digest, tmp_path / "downloads" / "a")
    assert linked.stat().st_ino == blob.stat().st_ino and linked.read_bytes() == blob.read_bytes()

    def refuse(*_):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr("os.link", refuse)
    copied = store.fetch_for_reading(digest, tmp_path / "downloads" / "b")
    assert copied.stat().st_ino != blob.stat().st_ino and copied.read_bytes() == blob.read_bytes()
    assert sorted(p.name for p in (tmp_path / "downloads").iterdir()) == ["a", "b"]
