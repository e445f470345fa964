"""Request ids and structured logs (issue 18): an acceptable ``X-Request-ID`` is echoed,
anything else is replaced by a fresh id, every response carries one (errors too), every
log line of the request carries it as JSON, and the job a request creates records it."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator

import pytest

from autofusion.app.core.logs import (
    MAX_REQUEST_ID,
    bind,
    clean_request_id,
    configure_logging,
    resolve_format,
)
from autofusion.app.core.models import Job
from autofusion.app.services import registry
from tests.log_capture import json_log_lines
from tests.log_capture import records as parsed

HEADER = "X-Request-ID"
GENERATED = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """Everything logged meanwhile, as the service writes it in JSON."""
    with json_log_lines() as stream:
        yield stream


def test_an_acceptable_request_id_is_echoed_and_one_is_made_otherwise(service):
    trace = "Root=1-67891233-abcdef012345678912345678;Parent=53995c3f42cd8ad8"
    for given in ("3f2b6c1e-7a4d-4c55-9e1f-2b8a0c6d4e11", "ci-run.42:step_7", trace):
        response = service.client.get("/healthz", headers={HEADER: given})
        assert response.headers[HEADER] == given
    made = {service.client.get("/healthz").headers[HEADER] for _ in range(2)}
    assert len(made) == 2 and all(GENERATED.fullmatch(m) for m in made)


@pytest.mark.parametrize(
    "hostile",
    [
        "x" * (MAX_REQUEST_ID + 1),
        "two words",
        'id", "level": "CRITICAL',
        "a\tb",
        "-leading-dash",
        "<script>",
        "",
    ],
    ids=["too-long", "space", "json-quote", "tab", "leading-dash", "markup", "empty"],
)
def test_a_hostile_request_id_is_replaced(service, hostile):
    response = service.client.get("/healthz", headers={HEADER: hostile})
    assert GENERATED.fullmatch(response.headers[HEADER])
    assert clean_request_id(hostile) is None


def test_control_characters_never_pass():
    for bad in ("a\nb", "a\rb", "a\x00b", "a\u2028b", "é"):
        assert clean_request_id(bad) is None


def test_error_responses_carry_the_request_id_too(make_service, problem, monkeypatch):
    service = make_service(max_form_bytes=2000)
    answer = service.client.get("/v1/jobs/nope", headers={HEADER: "req-404"})
    problem(answer, 404, "job-not-found")
    assert answer.headers[HEADER] == "req-404"
    # Refused by the body limits, before any route.
    big = {"name": "x", "yaml": "a" * 5000}
    answer = service.client.post("/v1/patterns", json=big, headers={HEADER: "req-413"})
    problem(answer, 413, "payload-too-large")
    assert answer.headers[HEADER] == "req-413"

    def fail(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(registry, "list_patterns", fail)
    answer = service.client.get("/v1/patterns", headers={HEADER: "req-500"})
    problem(answer, 500, "internal-error")
    assert answer.headers[HEADER] == "req-500"


def test_every_log_line_of_a_request_carries_its_id_as_json(service, monkeypatch, json_lines):
    def noisy(*_args, **_kwargs):
        logging.getLogger("autofusion.app.services.registry").info("listing the patterns")
        raise RuntimeError("a bug")

    monkeypatch.setattr(registry, "list_patterns", noisy)
    service.client.get("/v1/patterns", headers={HEADER: "req-logs-1"})
    service.client.get("/healthz", headers={HEADER: "req-logs-2"})
    records = parsed(json_lines)  # each line is one JSON object
    mine = [r for r in records if r.get("request_id") == "req-logs-1"]
    assert {r["logger"] for r in mine} >= {
        "autofusion.app.services.registry",
        "autofusion.app.api.problems",
    }
    error = next(r for r in mine if r["logger"] == "autofusion.app.api.problems")
    assert error["level"] == "ERROR" and "RuntimeError" in error["exc_info"]
    assert all({"time", "level", "logger", "message", "process"} <= set(r) for r in records)
    # Nothing of the request was logged without its id, nor under another request's.
    assert not [r for r in records if "listing the patterns" in r["message"] and r not in mine]


def test_the_job_records_the_request_that_created_it(service, tiny_model):
    answer = service.submit(tiny_model, headers={HEADER: "req-job-1"})
    assert answer.status_code == 202 and answer.headers[HEADER] == "req-job-1"
    second = service.submit(tiny_model)  # no header: the id made for it
    with service.db() as session:
        assert session.get(Job, answer.json()["id"]).request_id == "req-job-1"
        other = session.get(Job, second.json()["id"]).request_id
    assert other == second.headers[HEADER] and GENERATED.fullmatch(other)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_text_on_a_terminal_json_otherwise():
    assert resolve_format("auto", _Terminal()) == "text"
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format("json", _Terminal()) == "json"
    stream = _Terminal()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("INFO", "auto", stream)
        logging.getLogger("t").info("outside")
        with bind(request_id="req-text", job_id="job-1"):
            logging.getLogger("t").warning("inside")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    outside, inside = stream.getvalue().splitlines()
    assert " INFO [-] t: outside" in outside
    assert " WARNING [req-text] t: inside" in inside


@pytest.mark.slow
def test_autofusion_serve_logs_json_lines_with_the_request_id_into_the_worker(tmp_path, tiny_model):
    """The real server: uvicorn's lines are the service's JSON lines too, the access line
    and the embedded worker's lines of a submitted job carry the request's id."""
    import httpx

    from tests.browser.browser_support import running_server

    with (
        running_server(tmp_path / "data", log_level="info") as server,
        httpx.Client(base_url=server.url, timeout=30) as client,
    ):
        files = {"model": ("m.onnx", tiny_model, "application/octet-stream")}
        answer = client.post("/v1/optimize", files=files, headers={HEADER: "serve-req-1"})
        assert answer.status_code == 202 and answer.headers[HEADER] == "serve-req-1"
        job = answer.headers["Location"]
        for _ in range(300):
            if client.get(job).json()["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.1)
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.strip()]
    access = [r for r in lines if r["logger"] == "uvicorn.access"]
    assert any("POST /v1/optimize" in r["message"] for r in access)
    posted = next(r for r in access if "POST /v1/optimize" in r["message"])
    assert posted["request_id"] == "serve-req-1"
    job_id = job.rsplit("/", 1)[-1]
    worker = [
        r for r in lines if r["logger"] == "autofusion.worker.execute" and r.get("job_id") == job_id
    ]
    assert worker and all(r["request_id"] == "serve-req-1" for r in worker)
    assert not any("color_message" in r for r in lines)
