"""Downloads (``/v1/jobs/{id}/model``, ``/report``, ``/artifacts/{name}``): the ETag is
the content's sha256 (strong, the same on every download), ``If-None-Match`` answers
304, ``Repr-Digest`` (RFC 9530) verifies against the body, and ``HEAD`` sends a GET's
headers with no body."""

from __future__ import annotations

import base64
import hashlib
import json
import re

import pytest

FUSED = b"fused model bytes " * 1000
REPORT = {"fusions": [{"pattern": "conv_bn"}], "check": {"passed": True}}
HTML = "<!doctype html><title>report</title><p>r\u00e9sum\u00e9</p>"
# The headers a HEAD must send exactly as the GET does.
SAME_HEADERS = (
    "etag",
    "repr-digest",
    "content-length",
    "content-type",
    "content-disposition",
    "cache-control",
    "content-security-policy",
    "accept-ranges",
    "last-modified",
    "x-content-type-options",
)


@pytest.fixture
def finished(service, tiny_model) -> str:
    """A succeeded job with a fused model, a report and report.html in the store."""
    job_id = service.submit(tiny_model, model_name="relu.onnx").json()["id"]
    store = service.app.state.store
    html = {"artifacts": {"report.html": store.put_bytes(HTML.encode())}}
    service.succeed(job_id, FUSED, REPORT, summary=html)
    return job_id


DOWNLOADS = [
    pytest.param("model", FUSED, id="model"),
    pytest.param("report", json.dumps(REPORT).encode(), id="report"),
    pytest.param("artifacts/report.html", HTML.encode(), id="artifact"),
]


def _sha256_field(body: bytes) -> str:
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"


@pytest.mark.parametrize(("suffix", "content"), DOWNLOADS)
def test_the_etag_is_the_contents_sha256_on_every_download(service, finished, suffix, content):
    url = f"/v1/jobs/{finished}/{suffix}"
    first, second = service.client.get(url), service.client.get(url)
    assert first.status_code == second.status_code == 200
    assert first.content == second.content == content
    assert first.headers["etag"] == second.headers["etag"]
    assert first.headers["etag"] == f'"{hashlib.sha256(content).hexdigest()}"'  # strong
    assert first.headers["last-modified"] == second.headers["last-modified"]  # the job's
    scratch = service.settings.data_dir / "downloads"
    assert not scratch.exists() or list(scratch.iterdir()) == []  # no copy left behind


@pytest.mark.parametrize(("suffix", "content"), DOWNLOADS)
def test_repr_digest_verifies_against_the_body(service, finished, suffix, content):
    got = service.client.get(f"/v1/jobs/{finished}/{suffix}")
    field = got.headers["repr-digest"]
    assert re.fullmatch(r"sha-256=:[A-Za-z0-9+/]+=*:", field), field
    assert field == _sha256_field(got.content)


@pytest.mark.parametrize(("suffix", "content"), DOWNLOADS)
def test_if_none_match_answers_304_with_no_body(service, finished, suffix, content):
    url = f"/v1/jobs/{finished}/{suffix}"
    etag = service.client.get(url).headers["etag"]
    for sent in (etag, f'"other", {etag}', f"W/{etag}", "*"):
        unchanged = service.client.get(url, headers={"If-None-Match": sent})
        assert unchanged.status_code == 304, sent
        assert unchanged.content == b""
        assert unchanged.headers["etag"] == etag
        assert unchanged.headers["cache-control"] == "private, no-cache"
    other = service.client.get(url, headers={"If-None-Match": '"something else"'})
    assert other.status_code == 200 and other.content == content


@pytest.mark.parametrize(("suffix", "content"), DOWNLOADS)
def test_head_sends_the_gets_headers_and_no_body(service, finished, suffix, content):
    url = f"/v1/jobs/{finished}/{suffix}"
    got, head = service.client.get(url), service.client.head(url)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(content)
    for name in SAME_HEADERS:
        assert head.headers.get(name) == got.headers.get(name), name
    conditional = service.client.head(url, headers={"If-None-Match": got.headers["etag"]})
    assert conditional.status_code == 304


def test_head_answers_the_same_problems_as_get(service, tiny_model, problem, finished):
    job_id = service.submit(tiny_model).json()["id"]  # queued: nothing to download yet
    for suffix in ("model", "report", "artifacts/report.html"):
        url = f"/v1/jobs/{job_id}/{suffix}"
        problem(service.client.get(url), 409, "job-not-succeeded")
        head = service.client.head(url)
        assert head.status_code == 409 and head.content == b""
    missing = "/v1/jobs/00000000-0000-0000-0000-000000000000/model"
    assert service.client.head(missing).status_code == 404
    assert service.client.head(f"/v1/jobs/{finished}/artifacts/secrets.txt").status_code == 404


def test_the_model_answers_ranges_and_keeps_its_headers(service, finished):
    url = f"/v1/jobs/{finished}/model"
    whole = service.client.get(url)
    part = service.client.get(url, headers={"Range": "bytes=0-9"})
    assert part.status_code == 206 and part.content == FUSED[:10]
    assert part.headers["etag"] == whole.headers["etag"]
    assert part.headers["repr-digest"] == whole.headers["repr-digest"]  # the whole file's
    resumed = service.client.get(
        url, headers={"Range": "bytes=10-", "If-Range": whole.headers["etag"]}
    )
    assert resumed.status_code == 206 and resumed.content == FUSED[10:]


def test_the_dashboards_downloads_send_the_same_headers(service, finished):
    api = service.client.get(f"/v1/jobs/{finished}/model")
    ui = service.client.get(f"/ui/jobs/{finished}/download/model")
    assert ui.status_code == 200 and ui.content == FUSED
    for name in ("etag", "repr-digest", "content-disposition", "cache-control"):
        assert ui.headers[name] == api.headers[name], name
    cached = service.client.get(
        f"/ui/jobs/{finished}/download/report.html", headers={"If-None-Match": "*"}
    )
    assert cached.status_code == 304
    head = service.client.head(f"/ui/jobs/{finished}/download/model")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len(FUSED))
    assert head.headers["etag"] == api.headers["etag"]


def test_a_refused_range_leaves_no_copy_behind(service, finished, problem):
    url = f"/v1/jobs/{finished}/model"
    problem(service.client.get(url, headers={"Range": "bytes=abc"}), 400, "bad-request")
    past = service.client.get(url, headers={"Range": f"bytes={len(FUSED) + 10}-"})
    problem(past, 416, "range-not-satisfiable")
    scratch = service.settings.data_dir / "downloads"
    assert not scratch.exists() or list(scratch.iterdir()) == []  # Starlette skipped the cleanup
