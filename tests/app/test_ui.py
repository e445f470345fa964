"""The dashboard (/ui): pages and their contract ids, the jobs list, live updates,
cancel, submit, and auth by cookie. No worker runs here (see test_ui_report.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper
from ui_testing import CSP, assert_page, conv_bn_relu, multipart

from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job, JobStatus
from autofusion.app.services.auth import create_key


def _submit_jobs(service, tiny_model, count: int) -> list[str]:
    return [service.submit(tiny_model).json()["id"] for _ in range(count)]


@pytest.mark.parametrize("path", ["/ui", "/"])
def test_ui_and_the_root_redirect_to_the_jobs_page(service, path):
    response = service.client.get(path, follow_redirects=False)
    assert response.status_code in (303, 307)
    assert response.headers["location"] == "/ui/jobs"


@pytest.mark.parametrize(
    ("path", "ids"),
    [
        ("/ui/jobs", ["jobs", "job-filter", "nav"]),
        ("/ui/submit", ["submit-form", "submit"]),
        ("/ui/patterns", ["patterns", "new-pattern"]),
        ("/ui/patterns/new", ["pattern-form"]),
        ("/ui/patterns/conv_bn", ["pattern-yaml", "versions", "toggle-enabled", "edit-pattern"]),
        ("/ui/patterns/conv_bn/edit", ["pattern-form"]),
        ("/ui/patterns/conv_bn/versions/1", ["pattern-yaml"]),
        ("/ui/strategies", ["strategies"]),
        ("/ui/strategies/new", ["strategy-form"]),
        ("/ui/strategies/vision", ["strategy-yaml", "edit-strategy"]),
        ("/ui/strategies/vision/edit", ["strategy-form"]),
        ("/ui/login", ["login-form"]),
    ],
)
def test_every_page_renders_with_its_contract_ids(service, path, ids):
    html = assert_page(service.client.get(path), *ids)
    assert '<script src="/ui/static/htmx.min.js" defer></script>' in html
    for link in ("/ui/jobs", "/ui/submit", "/ui/patterns", "/ui/strategies"):
        assert f'href="{link}"' in html


def test_static_files_are_served_from_this_host(service):
    htmx = service.client.get("/ui/static/htmx.min.js")
    assert htmx.status_code == 200 and "htmx" in htmx.text[:200]
    assert htmx.headers["content-security-policy"] == CSP
    assert service.client.get("/ui/static/style.css").status_code == 200


def test_the_api_keeps_problem_json_and_no_csp(service, problem):
    response = service.client.get("/v1/jobs/nope")
    problem(response, 404, "job-not-found")
    assert "content-security-policy" not in response.headers


def test_an_unknown_job_is_a_404_page(service):
    html = assert_page(service.client.get("/ui/jobs/nope"), "error", status=404)
    assert "there is no job" in html


def _rows(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<tr data-job-id="([^"]+)" data-status="([^"]+)">', html)


def test_jobs_list_filters_by_status_and_paginates(make_service, tiny_model):
    service = make_service(max_queued_jobs_per_tenant=0)  # 23 queued: past the default 20
    ids = _submit_jobs(service, tiny_model, 23)
    for job_id in ids[:3]:
        service.update_job(job_id, status="failed", stage="failed")
    page1 = assert_page(service.client.get("/ui/jobs"), "jobs", "next-page")
    rows = _rows(page1)
    assert len(rows) == 20 and 'id="prev-page"' not in page1
    assert [job_id for job_id, _ in rows] == ids[::-1][:20]  # newest first
    assert 'class="job-link" href="/ui/jobs/' in page1
    older = re.search(r'id="next-page" href="([^"]+)"', page1).group(1).replace("&amp;", "&")
    page2 = assert_page(service.client.get(older), "prev-page")
    assert len(_rows(page2)) == 3 and 'id="next-page"' not in page2
    assert "3 of 23 jobs" in page2
    failed = assert_page(service.client.get("/ui/jobs?status=failed"))
    assert sorted(_rows(failed)) == sorted((job_id, "failed") for job_id in ids[:3])
    assert '<option value="failed" selected>' in failed
    assert len(_rows(service.client.get("/ui/jobs?status=").text)) == 20
    assert_page(service.client.get("/ui/jobs?status=bogus"), "error", status=422)


def test_the_jobs_table_polls_while_a_job_in_view_is_live(service, tiny_model):
    (job_id,) = _submit_jobs(service, tiny_model, 1)
    page = service.client.get("/ui/jobs").text
    assert 'hx-get="/ui/jobs/rows" hx-trigger="every 2s"' in page
    rows = service.client.get("/ui/jobs/rows")
    assert rows.text.lstrip().startswith('<tbody id="job-rows"') and "every 2s" in rows.text
    service.update_job(job_id, status="running", stage="matching", progress=0.4)
    assert 'data-status="running"' in service.client.get("/ui/jobs/rows").text
    service.update_job(job_id, status="succeeded", stage="succeeded", summary={"fusions": 0})
    done = service.client.get("/ui/jobs/rows").text
    assert 'data-status="succeeded"' in done and "hx-trigger" not in done
    assert "hx-trigger" not in service.client.get("/ui/jobs").text


def test_a_live_job_page_polls_then_asks_for_a_refresh(service, tiny_model):
    (job_id,) = _submit_jobs(service, tiny_model, 1)
    html = assert_page(
        service.client.get(f"/ui/jobs/{job_id}"),
        "live",
        "job-status",
        "job-stage",
        "job-progress",
        "cancel-form",
        "cancel",
    )
    assert f'hx-get="/ui/jobs/{job_id}/live" hx-trigger="every 1s" hx-swap="outerHTML"' in html
    assert 'data-status="queued"' in html and 'id="report"' not in html
    service.update_job(job_id, status="running", stage="matching", progress=0.5)
    live = service.client.get(f"/ui/jobs/{job_id}/live")
    assert live.status_code == 200 and "hx-refresh" not in live.headers
    assert live.text.lstrip().startswith('<section id="live"')
    assert 'id="job-stage">matching<' in live.text and 'value="0.500"' in live.text
    service.update_job(job_id, status="failed", stage="failed", error="the model <b>broke</b>")
    done = service.client.get(f"/ui/jobs/{job_id}/live")
    assert done.headers["hx-refresh"] == "true" and "hx-trigger" not in done.text
    page = assert_page(service.client.get(f"/ui/jobs/{job_id}"), "job-error")
    assert "hx-trigger" not in page and 'id="cancel"' not in page
    assert "the model &lt;b&gt;broke&lt;/b&gt;" in page


def test_cancel_from_the_job_page(service, tiny_model):
    (job_id,) = _submit_jobs(service, tiny_model, 1)
    response = service.client.post(f"/ui/jobs/{job_id}/cancel", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == f"/ui/jobs/{job_id}"
    with service.db() as session:
        assert session.get(Job, job_id).status == JobStatus.cancelled
    page = service.client.get(f"/ui/jobs/{job_id}").text
    assert 'data-status="cancelled"' in page and 'id="cancel-form"' not in page
    # Again (a race with the end of the job): no error, the page shows what it is.
    again = service.client.post(f"/ui/jobs/{job_id}/cancel", follow_redirects=False)
    assert again.status_code == 303


def test_cancel_only_by_post(service, tiny_model):
    (job_id,) = _submit_jobs(service, tiny_model, 1)
    assert service.client.get(f"/ui/jobs/{job_id}/cancel").status_code == 405
    with service.db() as session:
        assert session.get(Job, job_id).status == JobStatus.queued


def test_submit_creates_and_enqueues_a_job(service):
    model = conv_bn_relu().SerializeToString()
    form = multipart(
        model, target="onnxruntime", strategy="vision", model_name="net.onnx", profile="on"
    )
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    assert response.status_code == 303, response.text
    job_id = response.headers["location"].removeprefix("/ui/jobs/")
    assert service.enqueued == [job_id]
    with service.db() as session:
        job = session.get(Job, job_id)
        assert job.model_name == "net.onnx" and job.strategy == "vision"
        assert job.config == {"target": "onnxruntime", "profile": True}
    assert service.uploads_left() == []
    measured = multipart(model, target="onnxruntime", measure="on")
    response = service.client.post("/ui/submit", **measured, follow_redirects=False)
    job_id = response.headers["location"].removeprefix("/ui/jobs/")
    with service.db() as session:
        assert session.get(Job, job_id).config == {"target": "onnxruntime", "measure": True}


def test_submit_takes_the_models_data_files(service):
    """The form's data input (multiple files): each a data part named as the model names
    it; a file input left empty (a part with an empty file name) is no file."""
    weights = np.arange(16, dtype=np.float32)
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Add", ["x", "w"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
            [numpy_helper.from_array(weights, "w")],
        )
    )
    external_data_helper.convert_model_to_external_data(model, location="w.bin", size_threshold=0)
    parts = [
        ('name="model"; filename="net.onnx"', model.SerializeToString()),
        ('name="data"; filename="w.bin"', weights.tobytes()),
        ('name="data"; filename=""', b""),  # what a browser sends for an empty input
        ('name="target"', b"generic"),
    ]
    body = b"".join(
        b"--b0undary\r\nContent-Disposition: form-data; " + head.encode() + b"\r\n\r\n" + content
        + b"\r\n"
        for head, content in parts
    ) + b"--b0undary--\r\n"  # fmt: skip
    form = service.client.get("/ui/submit").text
    assert 'name="data" multiple' in form and "2 GiB" in form
    response = service.client.post(
        "/ui/submit",
        content=body,
        headers={"Content-Type": "multipart/form-data; boundary=b0undary"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    with service.db() as session:
        job = session.query(Job).one()
        assert [f["name"] for f in job.data_files] == ["w.bin"]


def test_submit_leaves_the_target_to_the_strategy_unless_one_is_picked(service):
    strategy = {"name": "acme.ort", "target": "onnxruntime"}
    assert service.client.post("/v1/strategies", json=strategy).status_code == 201
    form_page = service.client.get("/ui/submit").text
    assert '<option value="" selected>' in form_page  # no target picked by default
    form = multipart(conv_bn_relu().SerializeToString(), target="", strategy="acme.ort")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    assert response.status_code == 303, response.text
    with service.db() as session:
        job = session.query(Job).one()
        assert job.strategy == "acme.ort" and "target" not in job.config


def test_submit_without_options_uses_the_defaults(service):
    form = multipart(conv_bn_relu().SerializeToString(), "mine.onnx", target="generic", strategy="")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    assert response.status_code == 303
    with service.db() as session:
        job = session.query(Job).one()
        assert job.model_name == "mine.onnx" and job.strategy is None
        assert job.config == {"target": "generic"}


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [
        (b"this is not onnx", {}, "model"),
        (None, {"model_name": "../escape.onnx"}, "model_name"),
        (None, {"target": "tpu"}, "target"),
    ],
    ids=["not-onnx", "bad-name", "bad-target"],
)
def test_submit_rejects_what_the_api_rejects(service, model, fields, field):
    model = model or conv_bn_relu().SerializeToString()
    response = service.client.post("/ui/submit", **multipart(model, **fields))
    html = assert_page(response, "submit-form", status=422)
    assert f'class="field-error" data-field="{field}"' in html
    assert service.job_count() == 0 and service.enqueued == []
    assert service.uploads_left() == []


def test_the_bad_model_error_sits_next_to_the_file_input(service):
    html = service.client.post("/ui/submit", **multipart(b"junk")).text
    file_input = html.index('name="model"')
    error = html.index('class="field-error"')
    target = html.index('name="target"')
    assert file_input < error < target


# --- auth --------------------------------------------------------------------------------


def _key(service, scopes: list[str], tenant: str = "acme") -> str:
    with session_scope(service.settings.resolved_database_url) as session:
        return create_key(session, tenant, scopes)


def _sign_in(service, token: str) -> str:
    """Sign in on the dashboard with ``token``; the cookie's value."""
    response = service.client.post("/ui/login", data={"key": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return service.client.cookies["af_key"]


@pytest.fixture
def keyed(make_service):
    return make_service(require_api_keys=True)


def test_the_header_offers_sign_in_only_where_keys_are_required(service, keyed):
    """Issue 27, item 6: a server that needs no key offered "Sign in" anyway."""
    assert 'id="nav-login"' not in service.client.get("/ui/jobs").text
    assert 'id="nav-login"' in keyed.client.get("/ui/login").text


def test_without_a_cookie_pages_send_to_login(keyed):
    response = keyed.client.get("/ui/jobs?status=queued", follow_redirects=False)
    assert response.status_code == 303
    location = response.headers["location"]
    assert location.startswith("/ui/login?reason=required&next=")
    assert "%2Fui%2Fjobs%3Fstatus%3Dqueued" in location
    html = assert_page(keyed.client.get(location), "login-form", "login-message")
    assert "requires an API key" in html
    assert 'name="next" value="/ui/jobs?status=queued"' in html


def test_a_bad_key_is_refused_on_the_login_page(keyed):
    response = keyed.client.post("/ui/login", data={"key": "af_wrong"}, follow_redirects=False)
    html = assert_page(response, "login-form", status=401)
    assert 'class="field-error" data-field="key"' in html and "set-cookie" not in response.headers


def test_a_good_key_sets_the_cookie_and_pages_work(keyed, tiny_model):
    token = _key(keyed, ["jobs:write"])
    response = keyed.client.post("/ui/login", data={"key": token}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/ui/jobs"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("af_key=")
    for attribute in ("HttpOnly", "Path=/ui", "SameSite=strict"):
        assert attribute.lower() in cookie.lower()
    assert_page(keyed.client.get("/ui/jobs"), "jobs", "logout")
    job_id = keyed.submit(tiny_model, headers={"Authorization": f"Bearer {token}"}).json()["id"]
    assert f'data-job-id="{job_id}"' in keyed.client.get("/ui/jobs").text
    out = keyed.client.post("/ui/logout", follow_redirects=False)
    assert out.status_code == 303 and 'af_key=""' in out.headers["set-cookie"]
    assert keyed.client.get("/ui/jobs", follow_redirects=False).status_code == 303
    # Another tenant's key sees none of it.
    _sign_in(keyed, _key(keyed, ["jobs:write"], tenant="other"))
    assert f'data-job-id="{job_id}"' not in keyed.client.get("/ui/jobs").text
    assert keyed.client.get(f"/ui/jobs/{job_id}").status_code == 404


def test_an_unknown_cookie_sends_to_login_with_a_reason(keyed):
    keyed.client.cookies.set("af_key", "af_revoked_or_made_up", path="/ui")
    response = keyed.client.get("/ui/patterns", follow_redirects=False)
    assert response.headers["location"].startswith("/ui/login?reason=invalid")
    polled = keyed.client.get(
        "/ui/jobs/rows", headers={"HX-Request": "true"}, follow_redirects=False
    )
    assert polled.headers["hx-redirect"].startswith("/ui/login?")


def test_a_key_without_patterns_write_cannot_create_patterns(keyed):
    _sign_in(keyed, _key(keyed, ["jobs:write"]))
    text = "name: acme.nope\nnodes: [{id: a, op: Relu}]\nrewriter: {name: fused_region}\n"
    response = keyed.client.post("/ui/patterns/new", data={"yaml": text})
    html = assert_page(response, "error", status=403)
    assert "patterns:write" in html
    assert keyed.client.get("/ui/patterns/acme.nope").status_code == 404
    toggle = keyed.client.post("/ui/patterns/conv_bn/toggle")
    assert toggle.status_code == 403


def test_a_key_without_jobs_write_cannot_submit_or_cancel(keyed, tiny_model):
    writer = _key(keyed, ["jobs:write"])
    job_id = keyed.submit(tiny_model, headers={"X-API-Key": writer}).json()["id"]
    _sign_in(keyed, _key(keyed, ["patterns:write"]))
    model = conv_bn_relu().SerializeToString()
    assert keyed.client.post("/ui/submit", **multipart(model)).status_code == 403
    assert keyed.client.post(f"/ui/jobs/{job_id}/cancel").status_code == 403
    assert keyed.job_count() == 1 and keyed.uploads_left() == []


def test_login_never_redirects_to_another_host(keyed):
    token = _key(keyed, ["jobs:write"])
    for target in ("https://evil.example/", "//evil.example/ui", "/v1/jobs"):
        response = keyed.client.post(
            "/ui/login", data={"key": token, "next": target}, follow_redirects=False
        )
        assert response.headers["location"] == "/ui/jobs"
