"""The speed verdict on the dashboard and in the job resource's summary.

One job really runs (the worker's attempt, sandbox and profiling included) and its page,
its row and its API summary must show the speed ``read_report`` reads from its report.
The three verdicts are shown from real reports (``report_testing.real_report``) whose
measured paired ratio is replaced by one with the verdict under test.
"""

from __future__ import annotations

import html as html_lib
import json
import re

import pytest
from report_testing import paired, real_report
from ui_testing import assert_page, conv_bn_relu, multipart, run_job

from autofusion.app.api.schemas.jobs import JobSummary
from autofusion.app.cli._submit_output import speed_dict
from autofusion.fusion_core.report import read_report


def _row(rows_html: str, job_id: str) -> str:
    return re.search(rf'<tr data-job-id="{job_id}".*?</tr>', rows_html, re.S).group(0)


def _text(fragment: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", "", fragment))


@pytest.fixture
def profiled_job(service):
    form = multipart(conv_bn_relu(width=16).SerializeToString(), "net.onnx", profile="on")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    job = run_job(service, response.headers["location"].removeprefix("/ui/jobs/"))
    report = json.loads(service.app.state.store.read_bytes(job.report_digest))
    return service, job, read_report(report)


def test_a_profiled_job_shows_its_verdict(profiled_job):
    service, job, facts = profiled_job
    speed = facts.speed
    assert speed is not None and speed.runs > 0
    page = assert_page(service.client.get(f"/ui/jobs/{job.id}"), "speed", "speed-verdict")
    verdict = re.search(r'id="speed-verdict" class="speed ([^"]+)" data-verdict="([^"]+)"', page)
    assert verdict.group(2) == speed.verdict
    expected_class = {
        "faster": "speed-faster",
        "slower": "speed-slower",
        "no measurable change": "speed-no-change",
    }
    assert verdict.group(1) == expected_class[speed.verdict]
    cell = _text(re.search(r'<td id="speed">.*?</td>', page, re.S).group(0))
    assert f"{speed.speedup:.2f}×" in cell and speed.verdict in cell
    assert f"fused / original {speed.ratio:.3f}" in cell
    assert f"{speed.low:.3f}–{speed.high:.3f}" in cell and f"{speed.runs} paired runs" in cell
    assert speed.level in cell and f"{speed.threads} thread" in cell
    assert ('id="speed-note"' in page) == (speed.verdict != "faster")
    # The detail table's deployment row is the same paired median.
    row = re.search(rf'<tr data-level="{speed.level}">.*?</tr>', page, re.S).group(0)
    assert f'<td class="ratio">{speed.ratio:.3f}</td>' in row
    # The jobs list: the speedup and the verdict.
    jobs_row = _row(service.client.get("/ui/jobs").text, job.id)
    assert f'data-ratio="{speed.ratio:.3f}"' in jobs_row
    assert f'data-verdict="{speed.verdict}"' in jobs_row
    assert f"{speed.speedup:.2f}×" in jobs_row
    assert f'<span class="speed-verdict">{speed.verdict}</span>' in jobs_row
    # File size and peak memory: shown when the report has them, else left out.
    assert ('id="file-size"' in page) == (facts.size_before_bytes is not None)
    assert ('id="peak-memory"' in page) == (facts.peak_memory_before_bytes is not None)


def test_the_job_summary_carries_the_speed(profiled_job):
    service, job, facts = profiled_job
    resource = service.client.get(f"/v1/jobs/{job.id}").json()
    summary = resource["summary"]
    assert summary["speed"] == pytest.approx(speed_dict(facts.speed))
    assert summary["check"]["passed"] is True and summary["check"]["failure"] is None
    assert summary["nodes"] == {"before": facts.nodes_before, "after": facts.nodes_after}
    assert summary["fusions"] == facts.fusions == sum(summary["counts"].values())
    assert JobSummary.model_validate(summary).speed.verdict == facts.speed.verdict
    # The contract documents it.
    document = service.client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    job_summary = schemas["JobPublic"]["properties"]["summary"]["anyOf"][0]["$ref"]
    assert job_summary.endswith("/JobSummary")
    speed_ref = schemas["JobSummary"]["properties"]["speed"]["anyOf"][0]["$ref"]
    speed_schema = schemas[speed_ref.rsplit("/", 1)[1]]
    assert {"verdict", "ratio", "speedup", "low", "high", "runs"} <= set(speed_schema["properties"])


def test_an_unprofiled_job_says_so_and_keeps_its_summary_keys(service):
    form = multipart(conv_bn_relu().SerializeToString(), "net.onnx")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    job = run_job(service, response.headers["location"].removeprefix("/ui/jobs/"))
    page = service.client.get(f"/ui/jobs/{job.id}").text
    cell = _text(re.search(r'<td id="speed">.*?</td>', page, re.S).group(0))
    assert "not profiled" in cell and 'id="speed-verdict"' not in page
    assert 'id="latency"' not in page
    row = _row(service.client.get("/ui/jobs").text, job.id)
    assert "data-ratio" not in row and "—" in row
    summary = service.client.get(f"/v1/jobs/{job.id}").json()["summary"]
    assert summary["speed"] is None
    # Only what the worker wrote: an older job's summary keeps its own keys.
    other = service.submit(conv_bn_relu().SerializeToString()).json()["id"]
    service.update_job(other, status="succeeded", stage="succeeded", summary={"fusions": 0})
    assert service.client.get(f"/v1/jobs/{other}").json()["summary"] == {"fusions": 0}


@pytest.mark.parametrize(
    "verdict, css, note",
    [
        pytest.param("faster", "speed-faster", None, id="faster"),
        pytest.param(
            "no measurable change", "speed-no-change", "not measurably faster", id="no-change"
        ),
        pytest.param("slower", "speed-slower", "slower than the original", id="slower"),
    ],
)
def test_each_verdict_is_shown_plainly(service, tmp_path, verdict, css, note):
    report = real_report(tmp_path / "report", paired=paired(verdict))
    speed = read_report(report).speed
    assert speed.verdict == verdict
    store = service.app.state.store
    job_id = service.submit(conv_bn_relu().SerializeToString()).json()["id"]
    digest = store.put_bytes(json.dumps(report).encode())
    service.update_job(job_id, status="succeeded", stage="succeeded", report_digest=digest)
    page = assert_page(service.client.get(f"/ui/jobs/{job_id}"), "speed-verdict")
    assert f'class="speed {css}" data-verdict="{verdict}"' in page
    if note is None:
        assert 'id="speed-note"' not in page
    else:
        found = re.search(r'<p id="speed-note" class="speed-note ([^"]+)">([^<]+)</p>', page)
        assert found.group(1) == css and note in found.group(2)
    row = _row(service.client.get("/ui/jobs").text, job_id)
    assert f'class="speedup {css}"' in row and f"{speed.speedup:.2f}×" in row
    assert f'title="{html_lib.escape(speed.describe())}"' in row


def test_a_measured_job_shows_each_group_and_its_decision(service):
    config = {"target": "onnxruntime", "measure": True, "measure_options": {"budget_s": 1}}
    response = service.submit(conv_bn_relu(width=16).SerializeToString(), config=config)
    job = run_job(service, response.json()["id"])
    report = json.loads(service.app.state.store.read_bytes(job.report_digest))
    groups = report["measurement"]["groups"]
    assert groups
    page = assert_page(service.client.get(f"/ui/jobs/{job.id}"), "measurement")
    rows = re.findall(r'<tr data-kept="(true|false)"><td>(.*?)</td>', page)
    assert [(kept == "true", html_lib.unescape(name)) for kept, name in rows] == [
        (g["kept"], g["group"]) for g in groups
    ]
    kept = sum(g["kept"] for g in groups)
    summary = _text(re.search(r'<p id="measurement-summary">.*?</p>', page, re.S).group(0))
    assert summary.startswith(f"{kept} of {len(groups)} group(s) kept")
    # unprofiled, the verdict comes from measured selection's final comparison
    assert 'id="speed-verdict"' in page
    assert f'data-verdict="{report["measurement"]["final"]["verdict"]}"' in page
