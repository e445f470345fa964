"""The client's side of data uploads (issue 29), against live ``autofusion serve``s: a
big data file goes through ``/v1/uploads`` in chunks (the thresholds tiny here), a
connection cut mid-chunk or a 5xx resumes from HEAD's offset, a server without the
route gets the file in the body, and ``autofusion submit`` shows the progress and
keeps its reuse key. End to end in embedded mode: the job of a model whose weights are
in the uploaded file succeeds, and its fused model computes what the original does."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from cli_server import FAST_POLL, Server, run_cli, started_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.app.client import Client, Unreachable
from autofusion.fusion_core.testing import conv_bn_relu


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from started_server(tmp_path_factory, "client-uploads")


@pytest.fixture(scope="module")
def idle(tmp_path_factory) -> Iterator[Server]:
    """Jobs stay queued (as many as the examples make): what matters is what was sent."""
    env = {**FAST_POLL, "AUTOFUSION_MAX_QUEUED_JOBS_PER_TENANT": "0"}
    srv = Server(
        tmp_path_factory.mktemp("client-uploads-idle") / "data", "--no-embedded-worker", env=env
    )
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def weights_model(tmp_path_factory) -> tuple[Path, Path]:
    """Conv+BN+Relu (32 output channels) with every weight in ``weights.data``."""
    folder = tmp_path_factory.mktemp("model")
    path = folder / "model.onnx"
    onnx.save_model(
        conv_bn_relu(in_channels=8, out_channels=32),
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.data",
        size_threshold=0,
    )
    return path, folder / "weights.data"


class Recording(httpx.BaseTransport):
    """The real transport, with requests recorded and, on demand, PATCH bodies cut after
    some bytes (the connection breaks), PATCHes answered 503, and no /v1/uploads."""

    def __init__(self, cuts=(), unavailable: int = 0, no_uploads: bool = False) -> None:
        self.inner = httpx.HTTPTransport()
        self.cuts, self.unavailable, self.no_uploads = list(cuts), unavailable, no_uploads
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        self.bodies: dict[str, bytes] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, dict(request.headers)))
        if request.url.path == "/v1/uploads" and self.no_uploads:
            return httpx.Response(404, json={"title": "Not Found", "status": 404})
        if request.method == "PATCH" and self.unavailable:
            self.unavailable -= 1
            return httpx.Response(503, json={"title": "Unavailable", "status": 503})
        if request.method == "PATCH" and self.cuts:
            request.stream = _Cut(request.stream, self.cuts.pop(0))
        if request.url.path == "/v1/optimize":
            request.read()
            self.bodies["optimize"] = request.content
        return self.inner.handle_request(request)

    def patches(self) -> list[int]:
        return [int(h["upload-offset"]) for m, _, h in self.seen if m == "PATCH"]


class _Cut(httpx.SyncByteStream):
    """The first ``after`` bytes, then the connection breaks. A pause before the break:
    the server has read those bytes by then, as it has on a real link long before one
    breaks (bytes still in its socket buffer when the client leaves are the ASGI
    server's to drop, and HEAD's offset does not count them)."""

    def __init__(self, stream, after: int) -> None:
        self.stream, self.after = stream, after

    def __iter__(self):
        sent = 0
        for chunk in self.stream:
            if sent + len(chunk) >= self.after:
                yield chunk[: self.after - sent]
                time.sleep(0.3)
                raise httpx.WriteError("the test cut the connection")
            sent += len(chunk)
            yield chunk


def _client(server: Server, transport: Recording) -> Client:
    client = Client(server.url, poll_interval=0.2)
    client._transport.http = httpx.Client(base_url=server.url, transport=transport, timeout=60)
    return client


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _submit_in_chunks(server: Server, tmp_path: Path, data: Path) -> Recording:
    """Submit a small model with ``data`` sent in resumable chunks of 1000 bytes; the
    job lists the file by its digest. The transport the client used, for its PATCHes."""
    model = tmp_path / "model.onnx"
    onnx.save_model(conv_bn_relu(), model)
    transport = Recording()
    with _client(server, transport) as client:
        job = client.submit(model, data=[data], chunked_upload_bytes=10, chunk_bytes=1000)
    assert job.data["data_files"] == [{"name": data.name, "digest": _sha(data)}]
    return transport


def test_the_job_of_an_uploaded_data_file_computes_what_the_original_does(
    server, weights_model, tmp_path
):
    model, weights = weights_model
    progress: list[tuple[str, int, int]] = []
    transport = Recording()
    with _client(server, transport) as client:
        job = client.submit(
            model,
            data=[weights],
            config={"target": "onnxruntime"},
            chunked_upload_bytes=1000,
            chunk_bytes=2048,
            on_upload_progress=lambda *p: progress.append(p),
        )
        assert job.data["data_files"] == [{"name": "weights.data", "digest": _sha(weights)}]
        done = client.wait(job, timeout=180)
        assert done.succeeded, done.data
        fused = client.download(done, "model", tmp_path / "fused" / "model.onnx")
    size = weights.stat().st_size
    assert size > 4 * 2048 and len(transport.patches()) == -(-size // 2048)
    assert progress[-1] == ("weights.data", size, size)
    assert b'name="data_upload"' in transport.bodies["optimize"]
    assert b'filename="weights.data"' not in transport.bodies["optimize"]

    x = np.random.default_rng(0).normal(size=(1, 8, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(fused)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(fused).graph.node}


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chunk=st.integers(64, 5000), cut=st.floats(0.05, 0.95), unavailable=st.integers(0, 1))
def test_a_connection_cut_mid_chunk_resumes_from_what_the_server_kept(
    idle, tmp_path, monkeypatch, chunk, cut, unavailable
):
    monkeypatch.setattr("autofusion.app.client._uploads.BACKOFF_S", 0.05)
    data = tmp_path / "w.data"
    # unseeded: examples share the server, where the same file again resumes its upload
    data.write_bytes(np.random.default_rng().bytes(3 * chunk + 17))
    model = tmp_path / "model.onnx"
    onnx.save_model(conv_bn_relu(), model)
    after = max(1, int(chunk * cut))
    transport = Recording(cuts=[after, after], unavailable=unavailable)
    with _client(idle, transport) as client:
        job = client.submit(model, data=[data], chunked_upload_bytes=10, chunk_bytes=chunk)
    assert job.data["data_files"] == [{"name": "w.data", "digest": _sha(data)}]
    offsets = transport.patches()
    # The cut chunk's first bytes were kept: a PATCH went on from inside that chunk.
    assert any(offset % chunk for offset in offsets), offsets
    assert any(m == "HEAD" for m, _, _ in transport.seen)


def test_an_upload_that_keeps_breaking_gives_up_with_a_clear_error(idle, tmp_path, monkeypatch):
    monkeypatch.setattr("autofusion.app.client._uploads.BACKOFF_S", 0.01)
    data = tmp_path / "w.data"
    data.write_bytes(b"w" * 5000)
    model = tmp_path / "model.onnx"
    onnx.save_model(conv_bn_relu(), model)
    transport = Recording(cuts=[1] * 50)
    with _client(idle, transport) as client, pytest.raises(Unreachable) as broke:
        client.submit(model, data=[data], chunked_upload_bytes=10, chunk_bytes=1000)
    assert "broke off" in str(broke.value) and "w.data" in str(broke.value)
    assert 2 <= len(transport.patches()) <= 12


def test_a_server_without_uploads_gets_the_file_in_the_body(idle, weights_model):
    model, weights = weights_model
    transport = Recording(no_uploads=True)
    with _client(idle, transport) as client:
        job = client.submit(model, data=[weights], chunked_upload_bytes=10)
    assert job.data["data_files"] == [{"name": "weights.data", "digest": _sha(weights)}]
    assert transport.patches() == []
    assert b'filename="weights.data"' in transport.bodies["optimize"]
    assert b'name="data_upload"' not in transport.bodies["optimize"]


def test_a_file_sent_once_is_named_again_and_small_files_stay_in_the_body(
    idle, weights_model, tmp_path
):
    model, weights = weights_model
    small = tmp_path / "notes.txt"
    small.write_bytes(b"small")
    transport = Recording()
    with _client(idle, transport) as client:
        for target in ("onnxruntime", "generic"):  # one file, two jobs
            job = client.submit(
                model, data=[weights, small], config={"target": target}, chunked_upload_bytes=100
            )
            names = {f["name"] for f in job.data["data_files"]}
            assert names == {"weights.data", "notes.txt"}
    creates = [p for m, p, _ in transport.seen if m == "POST" and p == "/v1/uploads"]
    assert len(creates) == 1
    assert b'filename="notes.txt"' in transport.bodies["optimize"]


def test_submit_shows_the_upload_and_keeps_its_reuse_key(idle, weights_model, capsys, monkeypatch):
    monkeypatch.setattr("autofusion.app.client._uploads.CHUNKED_UPLOAD_BYTES", 100)
    monkeypatch.setattr("autofusion.app.client._uploads.CHUNK_BYTES", 1000)
    model, weights = weights_model
    args = ["submit", model, "--data", weights, "--server", idle.url, "--json"]
    code, first, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "autofusion: uploading weights.data" in err and "(100%)" in err
    code, again, _ = run_cli(capsys, *args)
    assert code == 0
    first, again = json.loads(first), json.loads(again)
    # The same files are the same submit, however they travelled: the same job.
    assert again["job_id"] == first["job_id"] and again.get("reused"), again


def test_a_new_client_resumes_the_upload_an_earlier_one_left(idle, tmp_path):
    """The first process sent two chunks and died; the next one, with nothing in memory,
    sends only the rest (the server hands back the same file's upload), and a third
    sends nothing (complete)."""
    data = tmp_path / "w.data"
    data.write_bytes(np.random.default_rng(3).bytes(5 * 1000 + 7))
    digest, size = _sha(data), data.stat().st_size
    body = {"name": "w.data", "size": size, "sha256": digest}
    first = httpx.post(f"{idle.url}/v1/uploads", json=body)
    assert first.status_code == 201
    url = f"{idle.url}{first.headers['Location']}"
    head = {"Content-Type": "application/offset+octet-stream"}
    for offset in (0, 1000):
        chunk = data.read_bytes()[offset : offset + 1000]
        sent = httpx.patch(url, content=chunk, headers={**head, "Upload-Offset": str(offset)})
        assert sent.status_code == 204
    transport = _submit_in_chunks(idle, tmp_path, data)
    assert transport.patches() == [2000, 3000, 4000, 5000]
    again = Recording()
    with _client(idle, again) as client:  # the same file again: nothing left to send
        client.submit(
            tmp_path / "model.onnx", data=[data], chunked_upload_bytes=10, chunk_bytes=1000
        )
    assert again.patches() == []


def test_an_upload_whose_parts_the_server_lost_is_sent_again_from_its_start(idle, tmp_path):
    """A part the server listed is gone from its store: the last chunk is answered 409
    with Upload-Offset: 0, not a 500 on every try, and the client sends the file again."""
    data = tmp_path / "w.data"
    data.write_bytes(np.random.default_rng(4).bytes(3 * 1000 + 5))
    digest = _sha(data)
    body = {"name": "w.data", "size": data.stat().st_size, "sha256": digest}
    artifacts = idle.log.parent / "data" / "artifacts"
    before = set(artifacts.rglob("*"))
    created = httpx.post(f"{idle.url}/v1/uploads", json=body)
    assert created.status_code == 201
    head = {"Content-Type": "application/offset+octet-stream", "Upload-Offset": "0"}
    url = f"{idle.url}{created.headers['Location']}"
    assert httpx.patch(url, content=data.read_bytes()[:1000], headers=head).status_code == 204
    [part] = [p for p in set(artifacts.rglob("*")) - before if p.is_file()]
    part.unlink()
    transport = _submit_in_chunks(idle, tmp_path, data)
    assert transport.patches() == [1000, 2000, 3000, 0, 1000, 2000, 3000]
