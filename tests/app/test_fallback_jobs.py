"""A job whose check fails falls back (docs/validation.md): it succeeds with the largest
set of fusions that passes, its summary and report say what was dropped, and its page
says so beside the verdict; ``config.strict`` fails the job instead.

Zero tolerance makes the Conv+BatchNormalization fold fail the check (folding the
statistics into the weights changes the last bits), as a wrong fusion would.
"""

from __future__ import annotations

from ui_testing import assert_page, conv_bn_relu, run_job

ZERO = {"check": {"rtol": 0, "atol": 0}}


def test_a_failed_check_falls_back_and_the_job_succeeds(service):
    model = conv_bn_relu().SerializeToString()
    job_id = service.submit(model, config=ZERO).json()["id"]
    job = run_job(service, job_id)

    fallback = job.summary["fallback"]
    assert fallback["reason"].startswith("the fused model does not match the original")
    assert fallback["dropped"] >= 1 and fallback["unchanged"] is False
    assert job.summary["check"]["passed"] is True
    report = service.client.get(f"/v1/jobs/{job_id}/report").json()
    assert report["fallback"]["failure"] == "mismatch"
    assert {d["pattern"] for d in report["fallback"]["dropped"]} <= {"conv_bn", "conv_bn_relu"}
    assert service.client.get(f"/v1/jobs/{job_id}/model").status_code == 200

    html = assert_page(service.client.get(f"/ui/jobs/{job_id}"), "fallback-note", "fallback")
    assert "fell back after a failed check" in html
    assert "Dropped after the failed check" in html


def test_strict_fails_the_job_with_the_kinds_words(service):
    from autofusion.app.core.models import Job
    from autofusion.worker.execute import Outcome, execute_job

    model = conv_bn_relu().SerializeToString()
    job_id = service.submit(model, config={**ZERO, "strict": True}).json()["id"]
    store = service.app.state.store
    assert execute_job(service.settings, job_id, "worker-1", store) == Outcome.failed
    with service.db() as session:
        job = session.get(Job, job_id)
        assert job.error_type == "check-failed"
        assert "the fused model does not match the original" in job.error
        assert "fallback" not in (job.summary or {})
