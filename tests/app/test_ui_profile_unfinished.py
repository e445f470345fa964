"""A job whose profiling ran out of time, through the service (issue 27): the worker
keeps the checked model, the API's summary says why the speed is unknown, and the job
page says so above a working download of the fused model."""

from __future__ import annotations

import html as html_lib

import onnx
from ui_testing import assert_page, conv_bn_relu, run_job

from autofusion.worker.sandbox import TEST_CRASH_ENV

LIMIT_S = 12  # the sandbox starts, fuses and checks the small model well within it


def test_the_job_page_keeps_the_model_and_says_the_speed_is_unknown(
    make_service, monkeypatch
) -> None:
    service = make_service(job_time_limit_s=LIMIT_S)
    monkeypatch.setenv(TEST_CRASH_ENV, "profiling:sleep:120")  # waits once profiling starts
    created = service.submit(conv_bn_relu().SerializeToString(), config={"profile": True})
    job = run_job(service, created.json()["id"])

    public = service.client.get(f"/v1/jobs/{job.id}").json()
    assert public["status"] == "succeeded" and public["error"] is None
    warning = public["summary"]["profile_error"]
    assert warning.startswith(f"Profiling did not finish within the time limit of {LIMIT_S} s")
    assert public["summary"]["speed"] is None and public["links"]["model"]

    page = assert_page(service.client.get(f"/ui/jobs/{job.id}"), "job-profile-error")
    shown = page.split('id="job-profile-error"', 1)[1].split("</p>", 1)[0]
    assert html_lib.unescape(shown.split(">", 1)[1]) == warning
    assert 'id="job-error"' not in page  # succeeded: no failure shown
    download = service.client.get(f"/ui/jobs/{job.id}/download/model")
    assert download.status_code == 200
    fused = onnx.load_model_from_string(download.content)
    assert "BatchNormalization" not in {n.op_type for n in fused.graph.node}
