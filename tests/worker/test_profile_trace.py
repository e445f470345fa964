"""A profiled job keeps onnxruntime's raw profiler trace of the fused model as an artifact."""

from __future__ import annotations

import json

from autofusion.worker.execute import Outcome, execute_job
from tests.worker.worker_testing import WorkerEnv


def test_a_profiled_job_stores_the_fused_models_trace(env: WorkerEnv) -> None:
    job_id = env.submit(config={"profile": True})
    assert execute_job(env.settings, job_id, "worker-1", env.store) == Outcome.succeeded
    artifacts = env.job(job_id).summary["artifacts"]
    assert set(artifacts) == {"report.html", "report.md", "profile_trace.json", "regions.json"}
    events = json.loads(env.store.read_bytes(artifacts["profile_trace.json"]))
    kernels = [e for e in events if e.get("cat") == "Node"]
    assert kernels, "the trace has no kernel events"
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    assert len(runs) == 3
    # The fused model's nodes, not the original's: a fused Conv node ran.
    report = json.loads(env.store.read_bytes(env.job(job_id).report_digest))
    new_nodes = {name for fusion in report["applied"] for name in fusion["new_nodes"]}
    traced = {str(e["name"]).removesuffix("_kernel_time") for e in kernels}
    assert traced & new_nodes


def test_a_job_without_profiling_has_no_trace(env: WorkerEnv) -> None:
    job_id = env.submit()
    assert execute_job(env.settings, job_id, "worker-1", env.store) == Outcome.succeeded
    assert "profile_trace.json" not in env.job(job_id).summary["artifacts"]
