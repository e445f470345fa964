"""Hot update through the API: a pattern registered while the embedded worker runs
applies to the next job, with no restart; disabled, it no longer applies.

Also the embedded end to end: no Redis, no PostgreSQL, one process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from fastapi.testclient import TestClient

from autofusion.app.cli.serve import service_app
from autofusion.app.core.config import Settings
from autofusion.fusion_core.validate import make_session

RESNET = Path(__file__).resolve().parents[1] / "data" / "resnet" / "resnet50_w8_torchscript.onnx"
NEW_PATTERN = {
    "name": "test.gap_flatten",
    "priority": 100,
    "nodes": [
        {"id": "pool", "op": "GlobalAveragePool"},
        {"id": "flat", "op": "Flatten", "inputs": {"0": "pool"}},
    ],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test", "op_type": "GapFlatten"}},
}


def _run_job(client: TestClient, config: dict) -> dict:
    files = [("model", ("resnet.onnx", RESNET.read_bytes(), "application/octet-stream"))]
    response = client.post("/v1/optimize", files=files, data={"config": json.dumps(config)})
    assert response.status_code == 202, response.text
    location = response.headers["Location"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.get(location).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.2)
    pytest.fail(f"job {location} did not finish in 120 s: {job}")


@pytest.mark.slow
def test_pattern_registered_through_the_api_applies_to_the_next_job(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, reaper_interval_s=1.0)
    with TestClient(service_app(settings)) as client:
        config = {"target": "onnxruntime"}
        first = _run_job(client, config)
        assert first["status"] == "succeeded", first
        assert "test.gap_flatten" not in first["summary"]["counts"]

        created = client.post("/v1/patterns", json=NEW_PATTERN)
        assert created.status_code == 201, created.text
        version_with = client.get("/v1/patterns").json()["registry_version"]

        second = _run_job(client, config)
        assert second["status"] == "succeeded", second
        assert second["summary"]["counts"]["test.gap_flatten"] == 1
        assert second["registry_version"] == version_with > first["registry_version"]
        fused = onnx.load_from_string(client.get(f"/v1/jobs/{second['id']}/model").content)
        assert any(n.domain == "ai.test" and n.op_type == "GapFlatten" for n in fused.graph.node)

        # The embedded end to end: the downloaded model runs and matches the original.
        x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
        want = make_session(onnx.load(RESNET)).run(None, {"input": x})[0]
        got = make_session(fused).run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)

        disabled = client.post("/v1/patterns/test.gap_flatten/disable")
        assert disabled.status_code == 200, disabled.text
        third = _run_job(client, config)
        assert third["status"] == "succeeded", third
        assert "test.gap_flatten" not in third["summary"]["counts"]
        assert third["registry_version"] > second["registry_version"]
