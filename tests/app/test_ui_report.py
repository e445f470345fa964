"""The job page of a finished job: the report, downloads by cookie, and escaping.

Jobs here really run: ``execute_job`` (the worker's attempt, sandbox included) runs in
the test, as a worker would after taking the job from the queue.
"""

from __future__ import annotations

import json
import re

import pytest
from ui_testing import ESCAPED_XSS, XSS, assert_page, conv_bn_relu, multipart, run_job

from autofusion.fusion_core.report import saved_text


@pytest.fixture
def finished(service):
    """A profiled job that fused conv_bn_relu, finished by the worker."""
    form = multipart(conv_bn_relu().SerializeToString(), "net.onnx", profile="on")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    job_id = response.headers["location"].removeprefix("/ui/jobs/")
    return service, run_job(service, job_id)


def _section(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return html[start : start + 20000]


def test_a_finished_job_shows_its_report(finished):
    service, job = finished
    html = assert_page(
        service.client.get(f"/ui/jobs/{job.id}"),
        "job-status",
        "job-stage",
        "job-progress",
        "report",
        "summary",
        "fusions",
        "near-misses",
        "left-alone",
        "rollbacks",
        "validation",
        "op-type-chart",
        "regions",
        "download-model",
        "download-original",
        "download-report",
        "download-trace",
        "graph-viewer",
        "error-histograms",
        "slowest-nodes",
        "job-phases",
        "job-took",
    )
    assert 'data-status="succeeded"' in html and "hx-trigger" not in html
    assert "every part is standard ONNX the rules read" in _section(html, "left-alone")
    assert 'id="live"' not in html and 'id="cancel"' not in html
    summary = _section(html, "summary")
    assert 'data-level="ORT_ENABLE_ALL"' in summary and 'data-level="ORT_DISABLE_ALL"' in summary
    before = int(re.search(r'id="nodes-before">(\d+)<', summary).group(1))
    after = int(re.search(r'id="nodes-after">(\d+)<', summary).group(1))
    assert before > after >= 1
    fusions = re.search(r'<table id="fusions">.*?</table>', html, re.S).group(0)
    assert '<tr data-pattern="conv_bn_relu" data-count="1">' in fusions
    assert '<td class="count">1</td>' in fusions
    # predicted (cost model) and measured (profile) time per run in words (a loss as
    # "lost 1.6 ms/run", never "saved -1581"), then after / before
    report = service.client.get(f"/v1/jobs/{job.id}/report").json()
    (fusion,) = report["applied"]
    cells = re.findall(r"<td>([^<]*)</td>", fusions)
    predicted, measured = fusion["predicted_gain"], fusion["measured_gain"]
    assert cells[0] == saved_text(predicted["saved_us"]) and "-" not in cells[0]
    assert float(cells[1]) == pytest.approx(predicted["ratio"], rel=1e-2)
    assert cells[2] == saved_text(measured["saved_us"]) and "-" not in cells[2]
    assert float(cells[3]) == pytest.approx(measured["ratio"], rel=1e-2)
    validation = re.search(r'<table id="validation">.*?</table>', html, re.S).group(0)
    assert 'data-output="y" data-passed="true"' in validation
    (output,) = report["check"]["outputs"]
    cosine = re.search(r'<td class="cosine">([^<]*)</td>', validation).group(1)
    assert float(cosine) == pytest.approx(output["cosine_similarity"], rel=1e-5)
    assert f"0 of {output['elements']:,}" in validation  # elements outside the tolerance
    # The error histogram: one column per decade, the counts of the report's.
    counts = re.findall(r'<g class="bin" data-count="(\d+)"', _section(html, "error-histograms"))
    assert [int(c) for c in counts] == output["histogram"]
    slowest = _section(html, "slowest-nodes")
    assert 'id="chart-slowest-original"' in slowest and 'id="chart-slowest-fused"' in slowest
    slowest_original = max(
        report["profile"]["nodes"]["original"]["nodes"], key=lambda n: n["total_us"]
    )
    assert f"{slowest_original['name']} ({slowest_original['op_type']})" in slowest
    assert "<svg" in _section(html, "op-type-chart")[:3000]
    assert _section(html, "regions").count('class="region"') >= 2  # before and after
    assert f'href="/ui/jobs/{job.id}/download/report.html"' in html
    # The worker recorded when each phase began; the page shows what each took.
    stages = [p["stage"] for p in job.phases]
    assert stages == [
        "starting",
        "fetching",
        "prepasses",
        "fusing",
        "checking",
        "saving",
        "profiling",
        "report",
        "storing",
    ]
    phases = _section(html, "job-phases")
    assert re.findall(r'<span class="phase" data-stage="([^"]+)"', phases) == stages
    rows = service.client.get("/ui/jobs").text
    row = re.search(rf'<tr data-job-id="{job.id}".*?</tr>', rows, re.S).group(0)
    assert 'data-status="succeeded"' in row and "passed" in row and "data-ratio=" in row


def test_the_job_page_draws_regions_without_loading_a_model(finished, monkeypatch):
    """The pictures come from the sandbox's regions.json: the API never parses a model."""
    import onnx

    def refuse(*args, **kwargs):
        raise AssertionError("the API process loaded a model")

    for name in ("load", "load_model", "load_model_from_string", "load_from_string"):
        monkeypatch.setattr(onnx, name, refuse)
    service, job = finished
    links = service.client.get(f"/v1/jobs/{job.id}").json()["links"]["artifacts"]
    assert "regions.json" in links
    html = service.client.get(f"/ui/jobs/{job.id}").text
    assert _section(html, "regions").count('class="region"') >= 2


def test_downloads_go_through_the_cookie_routes(finished):
    service, job = finished
    base = f"/ui/jobs/{job.id}/download"
    model = service.client.get(f"{base}/model")
    assert model.status_code == 200 and model.content == service.app.state.store.read_bytes(
        job.fused_digest
    )
    assert "net.fused.onnx" in model.headers["content-disposition"]
    original = service.client.get(f"{base}/original")  # for a graph viewer, beside it
    assert original.status_code == 200 and original.content == conv_bn_relu().SerializeToString()
    assert 'filename="net.onnx"' in original.headers["content-disposition"]
    report = service.client.get(f"{base}/report")
    assert report.json()["report_version"] == 2
    trace = service.client.get(f"{base}/trace")
    assert trace.headers["content-type"] == "application/json"
    assert any(e.get("cat") == "Node" for e in trace.json())
    page = service.client.get(f"{base}/report.html")
    assert (
        page.headers["content-security-policy"] == "default-src 'none'; style-src 'unsafe-inline'"
    )
    assert service.client.get(f"{base}/report.md").status_code == 200
    assert service.client.get(f"{base}/secrets").status_code == 404
    # The API serves the trace too, as an artifact.
    api = service.client.get(f"/v1/jobs/{job.id}/artifacts/profile_trace.json")
    assert api.status_code == 200 and api.headers["content-type"] == "application/json"
    assert json.loads(api.content) == trace.json()


def test_downloads_of_a_job_without_results_are_a_conflict(service, tiny_model):
    job_id = service.submit(tiny_model).json()["id"]
    response = service.client.get(f"/ui/jobs/{job_id}/download/model")
    assert_page(response, "error", status=409)
    page = service.client.get(f"/ui/jobs/{job_id}").text
    assert 'id="download-model"' not in page and 'id="download-trace"' not in page


def test_user_strings_never_render_as_markup(service):
    """Model name, doc strings, node names and a pattern description hold a tag: every page
    shows it as text."""
    model = conv_bn_relu(prefix=XSS, doc=XSS).SerializeToString()
    form = multipart(model, "m.onnx", model_name=f"{XSS}.onnx", profile="on")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    assert response.status_code == 303, response.text
    job = run_job(service, response.headers["location"].removeprefix("/ui/jobs/"))
    assert job.model_name == f"{XSS}.onnx"
    pattern = (
        "name: acme.xss\n"
        f'description: "{XSS}"\n'
        "nodes: [{id: a, op: Relu}]\n"
        "rewriter: {name: fused_region, params: {domain: ai.acme}}\n"
    )
    created = service.client.post("/ui/patterns/new", data={"yaml": pattern})
    assert created.status_code == 200  # followed to the pattern's page
    broken_text = pattern.replace("acme.xss", "acme.xss2") + f"{XSS}: 1\n"
    broken = service.client.post("/ui/patterns/new", data={"yaml": broken_text})
    assert broken.status_code == 422
    trial = service.client.post("/ui/patterns/conv_bn_relu/try", **multipart(model))
    pages = {
        "jobs": service.client.get("/ui/jobs"),
        "job": service.client.get(f"/ui/jobs/{job.id}"),
        "patterns": service.client.get("/ui/patterns"),
        "pattern": service.client.get("/ui/patterns/acme.xss"),
        "pattern form with errors": broken,
        "trial": trial,
    }
    for name, response in pages.items():
        html = response.text
        assert XSS not in html, name
        assert "onerror=alert(1)>" not in html, name
        assert ESCAPED_XSS in html, name
    job_page = pages["job"].text
    # Node names reached the report (fusions, regions) and were escaped there too.
    assert f"{ESCAPED_XSS}conv" in _section(job_page, "fusions")
    assert ESCAPED_XSS in _section(job_page, "regions")
    assert f"<mark>{ESCAPED_XSS}conv</mark>" in pages["trial"].text


def test_what_folding_left_unfolded_is_on_the_job_page(service):
    """Issue 26: the report's ``folding`` (values left as the nodes that make them, past
    the fold budget) is one more part under "Left as it is", as in report.md."""
    from autofusion.fusion_core.testing import constant_fills

    model = constant_fills(4, (64, 256)).SerializeToString()  # 64 kB per fill
    budget = {"fold_growth_ratio": 0, "fold_growth_floor_bytes": 100_000}
    response = service.submit(model, config=budget)
    assert response.status_code == 202, response.text
    job = run_job(service, response.json()["id"])
    report = service.client.get(f"/v1/jobs/{job.id}/report").json()
    assert report["folding"]["unfolded_count"] == 3  # one fill fits the 100 kB budget
    left = _section(service.client.get(f"/ui/jobs/{job.id}").text, "left-alone")
    assert "constant folding (3 nodes)" in left
    assert "past the fold budget" in left and "fold_growth_ratio" in left


@pytest.mark.parametrize(
    ("value", "shown"),
    [(126000.4, "126000"), (-1581.2, "-1581"), (12.3456, "12.35"), (4.2e-07, "4.2e-07")],
)
def test_numbers_read_without_an_exponent_where_they_are_large(value, shown):
    """The job page printed 1.26e+05 µs/run (issue 27, item 6); errors stay as 4.2e-07."""
    from autofusion.app.ui.report_view import fmt

    assert fmt(value) == shown
