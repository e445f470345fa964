"""Data uploads (issue 29): ``/v1/uploads`` takes one big data file in resumable parts,
and ``POST /v1/optimize`` names a complete one with ``data_upload``.

Against a real app (SQLite, and PostgreSQL where the compare-and-set and the locks
matter): parts in any sizes make the file, a body cut short keeps what arrived, a wrong
offset is 409 with the offset, bytes past the size 413, a wrong sha256 422 with nothing
kept; HEAD, GET, DELETE and another tenant's 404; the size, quota and open-upload
limits; expiry by the retention sweep; and the job it makes, as a ``data`` part would.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from sqlalchemy import select

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import DataUpload, JobArtifact, JobStatus, utcnow
from autofusion.app.services.auth import create_key
from autofusion.app.services.retention import sweep_retention
from autofusion.app.services.uploads import ClientGone, IncomingBody, UploadSlots, receive_part
from tests.app import test_s3_store
from tests.event_loops import run_coroutine

# The S3 emulator's fixtures, for the test of an S3 store (as ``s3_store``).
s3_endpoint, s3_store = test_s3_store.s3_endpoint, test_s3_store.s3

OCTETS = {"Content-Type": "application/offset+octet-stream"}
WEIGHTS = np.arange(64, dtype=np.float32)  # 256 bytes


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request) -> dict:
    if request.param == "postgresql":
        return {"database_url": request.getfixturevalue("postgres_url")}
    return {}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _create(service, data: bytes, name: str = "w.data", headers=None, **body):
    body = {"name": name, "size": len(data), "sha256": _sha(data), **body}
    return service.client.post("/v1/uploads", json=body, headers=headers or {})


def _start(service, data: bytes, **kwargs) -> str:
    response = _create(service, data, **kwargs)
    assert response.status_code == 201, response.text
    assert response.headers["Location"] == f"/v1/uploads/{response.json()['id']}"
    return response.headers["Location"]


def _fresh_name() -> str:
    """A name no earlier example used: the same file posted again resumes its upload."""
    return f"w-{uuid.uuid4().hex[:12]}.data"


def _patch(service, location: str, offset: int, content, headers=None):
    sent = {**OCTETS, "Upload-Offset": str(offset), **(headers or {})}
    return service.client.patch(location, content=content, headers=sent)


def _blobs(service) -> set[str]:
    return {blob.digest for blob in service.app.state.store.blobs()}


def _row(service, location: str) -> DataUpload:
    with service.db() as session:
        row = session.get(DataUpload, location.rsplit("/", 1)[1])
        session.expunge(row)
        return row


def external_model(location: str, size: int = WEIGHTS.size) -> bytes:
    """y = x + W, W (``size`` floats) in external data at ``location``."""
    weight = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[size])
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


# ----- parts, offsets, sizes, digests -------------------------------------------------


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(min_size=1, max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=5))
def test_parts_of_any_sizes_sent_in_order_make_the_file(service, data, cuts):
    location = _start(service, data, name=_fresh_name())  # examples share the server
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for start, end in zip(bounds, bounds[1:], strict=False):
        response = _patch(service, location, start, data[start:end])
        if end < len(data):
            assert response.status_code == 204, response.text
            assert response.headers["Upload-Offset"] == str(end)
            assert response.headers["Cache-Control"] == "no-store"
    assert response.status_code == 200, response.text
    done = response.json()
    assert done["status"] == "complete" and done["received"] == len(data)
    assert done["digest"] == _sha(data) and response.headers["Upload-Offset"] == str(len(data))
    assert service.app.state.store.read_bytes(done["digest"]) == data
    # The parts are gone with the completion: the store holds complete files only.
    with service.db() as session:
        complete = set(session.scalars(select(DataUpload.digest)))
    assert _blobs(service) == complete and not _row(service, location).parts


def _cut_body(pieces: list[bytes]) -> AsyncIterator[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        raise ClientGone

    return chunks()


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(min_size=2, max_size=4000), where=st.floats(0.01, 0.99))
def test_a_body_cut_short_keeps_what_arrived_and_the_rest_resumes_there(service, data, where):
    location = _start(service, data, name=_fresh_name())
    upload_id = location.rsplit("/", 1)[1]
    cut = max(1, int(len(data) * where))
    body = IncomingBody(
        OCTETS["Content-Type"],
        str(len(data)),  # it said the whole file, then left
        _cut_body([data[: cut // 2], data[cut // 2 : cut]]),
        UploadSlots.from_settings(service.settings),
    )
    call = receive_part(
        body,
        service.settings,
        service.app.state.store,
        tenant_id=service.settings.default_tenant,
        upload_id=upload_id,
        offset=0,
    )
    with pytest.raises(ProblemError) as gone:
        run_coroutine(call)
    assert gone.value.status == 400 and gone.value.slug == "upload-incomplete"
    head = service.client.head(location)
    assert head.status_code == 200 and head.headers["Upload-Offset"] == str(cut)
    assert head.headers["Upload-Length"] == str(len(data)) and head.content == b""

    response = _patch(service, location, cut, data[cut:])
    assert response.status_code == 200, response.text
    assert response.json()["digest"] == _sha(data)
    assert service.app.state.store.read_bytes(_sha(data)) == data


def test_a_wrong_offset_is_409_with_the_current_offset(service, problem):
    data = b"abcdefghij"
    location = _start(service, data)
    assert _patch(service, location, 0, data[:4]).status_code == 204
    for offset in (0, 3, 5):
        refused = _patch(service, location, offset, data[offset:])
        body = problem(refused, 409, "upload-offset-mismatch")
        assert body["offset"] == 4 and refused.headers["Upload-Offset"] == "4"
        assert "Upload-Offset: 4" in body["detail"]
    assert _row(service, location).received == 4  # nothing of them was kept


def test_more_bytes_than_declared_are_refused_413_and_none_is_kept(service, problem):
    data = b"0123456789"
    location = _start(service, data)
    assert _patch(service, location, 0, data[:6]).status_code == 204
    before = _blobs(service)
    # Content-Length says so: refused before the body is read.
    body = problem(_patch(service, location, 6, b"x" * 5), 413, "payload-too-large")
    assert body["limit"] == 4
    # No length, the bytes say so while they stream: refused there, nothing kept.
    streamed = _patch(service, location, 6, iter([b"xx", b"xx", b"x"]))
    problem(streamed, 413, "payload-too-large")
    assert _row(service, location).received == 6 and _blobs(service) == before
    assert _patch(service, location, 6, data[6:]).status_code == 200


def test_a_wrong_sha256_is_422_and_nothing_is_stored(service, problem):
    data = b"the weights, as sent"
    location = _start(service, data, sha256=_sha(b"other bytes"))
    assert _patch(service, location, 0, data[:5]).status_code == 204
    refused = _patch(service, location, 5, data[5:])
    body = problem(refused, 422, "upload-digest-mismatch")
    assert body["sha256"] == _sha(data) and body["expected_sha256"] == _sha(b"other bytes")
    assert refused.headers["Upload-Offset"] == "0"
    assert _blobs(service) == set()  # neither the file nor its parts
    row = _row(service, location)
    assert (row.received, row.parts, row.status, row.digest) == (0, [], "receiving", None)


def test_the_wrong_media_type_is_415(service, problem):
    location = _start(service, b"abc")
    response = _patch(service, location, 0, b"abc", {"Content-Type": "application/octet-stream"})
    assert (
        "application/offset+octet-stream"
        in problem(response, 415, "unsupported-media-type")["detail"]
    )


def test_head_get_and_delete(service, problem):
    data = b"x" * 100
    location = _start(service, data)
    _patch(service, location, 0, data[:40])
    got = service.client.get(location)
    assert got.status_code == 200 and got.headers["Cache-Control"] == "no-store"
    resource = got.json()
    assert (resource["received"], resource["size"], resource["status"]) == (40, 100, "receiving")
    assert resource["sha256"] == _sha(data) and resource["digest"] is None
    assert resource["links"]["self"] == location
    assert resource["expires_at"] > resource["created_at"]
    assert _blobs(service)  # its part

    deleted = service.client.delete(location)
    assert deleted.status_code == 204 and _blobs(service) == set()
    problem(service.client.get(location), 404, "upload-not-found")
    assert service.client.head(location).status_code == 404
    problem(_patch(service, location, 40, data[40:]), 404, "upload-not-found")
    problem(service.client.get("/v1/uploads/not-an-id%00"), 404, "upload-not-found")


def _keys(service) -> tuple[dict[str, str], dict[str, str]]:
    with service.db() as session:
        alice = create_key(session, "tenant-a", ["jobs:write"], name="alice")
        bob = create_key(session, "tenant-b", ["jobs:write"], name="bob")
    return {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {bob}"}


def test_another_tenants_upload_is_404_everywhere(make_service, problem, database):
    service = make_service(require_api_keys=True, **database)
    alice, bob = _keys(service)
    data = b"alice's weights"
    location = _start(service, data, headers=alice)
    client = service.client
    problem(client.get(location, headers=bob), 404, "upload-not-found")
    assert client.head(location, headers=bob).status_code == 404
    problem(_patch(service, location, 0, data, bob), 404, "upload-not-found")
    problem(client.delete(location, headers=bob), 404, "upload-not-found")
    assert _patch(service, location, 0, data, alice).status_code == 200
    # Nor may bob's job name it.
    named = service.client.post(
        "/v1/optimize",
        files=[("model", ("m.onnx", external_model("w.data")))],
        data={"data_upload": location.rsplit("/", 1)[1]},
        headers=bob,
    )
    assert problem(named, 422, "invalid-upload")["field"] == "data_upload"


# ----- limits ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [
        pytest.param({"name": "../w.data"}, 422, "invalid-upload", id="path-name"),
        pytest.param({"name": "a:b"}, 422, "invalid-upload", id="colon-name"),
        pytest.param({"size": 0}, 422, "invalid-request", id="empty"),
        pytest.param({"sha256": "abc"}, 422, "invalid-request", id="short-sha"),
        pytest.param({"size": 1001}, 413, "payload-too-large", id="over-the-setting"),
    ],
)
def test_what_an_upload_may_be(make_service, problem, body, status, slug):
    service = make_service(max_data_file_bytes=1000)
    refused = service.client.post("/v1/uploads", json={"name": "w.data", "size": 10, **body})
    found = problem(refused, status, slug)
    if status == 413:
        assert found["limit"] == 1000 and "max_data_file_bytes" in found["detail"]
    with service.db() as session:
        assert session.scalars(select(DataUpload)).first() is None


def test_open_uploads_per_tenant_are_limited(make_service, problem):
    service = make_service(max_open_uploads_per_tenant=2)
    first = [_start(service, b"a" * n) for n in (1, 2)]
    refused = _create(service, b"c" * 3)
    body = problem(refused, 429, "too-many-open-uploads")
    assert body["open_uploads"] == 2 and int(refused.headers["Retry-After"]) > 0
    assert "max_open_uploads_per_tenant" in body["detail"]
    _patch(service, first[0], 0, b"a")  # complete: no longer open
    assert _create(service, b"c" * 3).status_code == 201


def test_an_upload_reserves_its_size_in_the_stored_bytes_quota(make_service, problem, database):
    service = make_service(max_stored_bytes_per_tenant=1000, **database)
    location = _start(service, b"a" * 600)
    # Nothing has arrived yet, and still the 600 bytes are taken.
    refused = _create(service, b"b" * 500)
    body = problem(refused, 507, "storage-quota-exceeded")
    assert body["stored_bytes"] == 600 and body["upload_bytes"] == 500
    assert "DELETE /v1/uploads/{id}" in body["detail"]
    service.client.delete(location)  # frees its room at once
    assert _create(service, b"b" * 500).status_code == 201


# ----- expiry ----------------------------------------------------------------------------


def test_the_retention_sweep_expires_uploads_their_parts_and_unused_files(make_service, database):
    service = make_service(**database)
    used, unused, partial = WEIGHTS.tobytes(), b"u" * 300, b"p" * 50
    locations = {what: _start(service, data, name=f"{what}.data") for what, data in
                 (("used", used), ("unused", unused), ("partial", partial))}  # fmt: skip
    _patch(service, locations["used"], 0, used)
    _patch(service, locations["unused"], 0, unused)
    _patch(service, locations["partial"], 0, partial[:20])
    job = _optimize(service, external_model("used.data"), [locations["used"]])
    assert job.status_code == 202, job.text
    part = _row(service, locations["partial"]).parts[0]["digest"]

    # Before expiry, nothing goes, not even the part stored long ago.
    later_s = service.settings.scratch_max_age_s * 10
    swept = sweep_retention(service.settings, service.app.state.store, now_s=time.time() + later_s)
    assert swept.uploads == [] and part in _blobs(service)

    expiry = timedelta(seconds=service.settings.upload_expiry_s + 1)
    swept = sweep_retention(
        service.settings,
        service.app.state.store,
        now=utcnow() + expiry,
        now_s=time.time() + later_s,
    )
    assert sorted(swept.uploads) == sorted(loc.rsplit("/", 1)[1] for loc in locations.values())
    with service.db() as session:
        assert session.scalars(select(DataUpload)).first() is None
    blobs = _blobs(service)
    assert part not in blobs and _sha(unused) not in blobs  # freed: nothing refers to them
    assert _sha(used) in blobs  # the job refers to it


# ----- optimize with data_upload ---------------------------------------------------------


def _optimize(service, model: bytes, locations: list[str], data=(), headers=None, config=None):
    fields = [("data_upload", (None, loc.rsplit("/", 1)[1])) for loc in locations]
    files = [("model", ("model.onnx", model)), *fields]
    files += [("data", (name, content)) for name, content in data]
    if config is not None:
        files.append(("config", (None, config)))
    return service.client.post("/v1/optimize", files=files, headers=headers or {})


def test_a_job_takes_the_upload_as_if_it_were_a_data_part(make_service, database):
    service = make_service(**database)
    weights = WEIGHTS.tobytes()
    location = _start(service, weights)
    _patch(service, location, 0, weights)
    key = {"Idempotency-Key": "same-request"}
    response = _optimize(service, external_model("w.data"), [location], headers=key)
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["data_files"] == [{"name": "w.data", "digest": _sha(weights)}]
    with service.db() as session:
        sizes = dict(session.execute(select(JobArtifact.digest, JobArtifact.size)).all())
    assert sizes[_sha(weights)] == len(weights)
    assert service.uploads_left() == []  # the placeholder went with the upload folder
    # The same files sent as parts are the same request: the key replays the job.
    again = service.submit(external_model("w.data"), data=[("w.data", weights)], headers=key)
    assert again.status_code == 202 and again.json()["id"] == job["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    # One upload serves several jobs (another target) until it expires.
    other = _optimize(service, external_model("w.data"), [location], config='{"target": "generic"}')
    assert other.status_code == 202 and other.json()["id"] != job["id"]
    assert len(service.enqueued) == 2


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        pytest.param("unknown", "is not a data upload of this tenant", id="unknown"),
        pytest.param("incomplete", "is not complete", id="incomplete"),
        pytest.param("twice", "is named twice", id="twice"),
        pytest.param("clash", "as a 'data' part or the model is", id="clash-with-a-part"),
        pytest.param("short", "past the end of the file", id="checks-still-apply"),
    ],
)
def test_data_upload_fields_that_cannot_be_used_are_422(service, problem, setup, words):
    weights = WEIGHTS.tobytes()
    location = _start(service, weights)
    if setup != "incomplete":
        _patch(service, location, 0, weights)
    locations, data, model = [location], (), external_model("w.data")
    if setup == "unknown":
        locations = ["/v1/uploads/00000000-0000-4000-8000-000000000000"]
    elif setup == "twice":
        locations = [location, location]
    elif setup == "clash":
        data = [("w.data", weights)]
    elif setup == "short":
        model = external_model("w.data", size=WEIGHTS.size * 2)
    response = _optimize(service, model, locations, data=data)
    slug = "unsafe-external-data" if setup == "short" else "invalid-upload"
    body = problem(response, 422, slug)
    assert words in body["detail"], body["detail"]
    assert service.job_count() == 0 and service.uploads_left() == []


def test_an_upload_deleted_before_the_job_is_written_is_refused(service, problem, monkeypatch):
    """The job's own transaction reads the upload again: deleted meanwhile, no job."""
    from autofusion.app.services.uploads import _accept

    weights = WEIGHTS.tobytes()
    location = _start(service, weights)
    _patch(service, location, 0, weights)
    real = _accept.store_upload

    def store_then_delete(*args):
        stored = real(*args)
        service.client.delete(location)
        return stored

    monkeypatch.setattr(_accept, "store_upload", store_then_delete)
    response = _optimize(service, external_model("w.data"), [location])
    assert "data_upload" in problem(response, 422, "invalid-upload")["detail"]
    assert service.job_count() == 0


def test_the_status_of_the_job_does_not_hold_the_upload(service):
    """A job ends; its upload stays usable until it expires."""
    weights = WEIGHTS.tobytes()
    location = _start(service, weights)
    _patch(service, location, 0, weights)
    job = _optimize(service, external_model("w.data"), [location]).json()
    service.update_job(job["id"], status=JobStatus.failed.value)
    assert _optimize(service, external_model("w.data"), [location]).status_code == 202


def test_the_parts_and_the_file_live_in_an_s3_store(make_service, s3_store):
    """Distributed mode's store: the parts are blobs in the bucket, and once the file is
    complete the bucket holds it alone."""
    s3 = s3_store
    s3.client().create_bucket(Bucket=s3.bucket)
    service = make_service(
        artifact_store="s3",
        s3_bucket=s3.bucket,
        s3_endpoint_url=s3.endpoint,
        s3_region=test_s3_store.REGION,
    )
    data = np.random.default_rng(3).bytes(3000)
    location = _start(service, data)
    assert _patch(service, location, 0, data[:1000]).status_code == 204
    part = _row(service, location).parts[0]["digest"]
    assert s3.keys() == {f"sha256/{part}"}
    done = _patch(service, location, 1000, data[1000:])
    assert done.status_code == 200 and done.json()["digest"] == _sha(data)
    assert s3.keys() == {f"sha256/{_sha(data)}"}
    assert service.app.state.store.read_bytes(_sha(data)) == data


def test_posting_the_same_file_again_resumes_its_upload(service):
    """A client that lost the answer to its POST, or starts again after a crash, gets the
    upload of the same file (name, size, sha256) back with where its bytes stand: no
    orphan holding its size of the quota. Another name, or no sha256, is another upload."""
    data = bytes(range(256)) * 2
    location = _start(service, data)
    assert _patch(service, location, 0, data[:200]).status_code == 204
    again = _create(service, data)
    assert again.status_code == 200 and again.headers["Location"] == location
    assert (again.json()["received"], again.json()["status"]) == (200, "receiving")
    assert _create(service, data, name="other.data").status_code == 201
    assert _create(service, data, sha256=None).status_code == 201
    assert _patch(service, location, 200, data[200:]).status_code == 200
    done = _create(service, data)
    assert done.status_code == 200 and done.headers["Location"] == location
    assert (done.json()["status"], done.json()["digest"]) == ("complete", _sha(data))
    assert service.client.delete(location).status_code == 204
    assert _create(service, data).status_code == 201  # gone: a new one
