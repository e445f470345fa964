"""What the worker tests share: ``WorkerEnv`` (settings, a local store, ``submit``,
``job``, ``wait_for``), ``new_env`` (a migrated SQLite database in its own folder), the
test model and a user pattern, and model comparisons; imported as
``tests.worker.worker_testing`` (pyproject.toml's ``pythonpath`` puts the repository
root on sys.path).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job
from autofusion.app.migrate import upgrade
from autofusion.app.services.artifacts import LocalStore
from autofusion.app.services.auth import SCOPES, Principal, ensure_tenant
from autofusion.app.services.jobs import create_job
from autofusion.app.services.registry import sync_builtins

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"
TENANT = "acme"

# A user pattern: the classifier head's pooling and flattening as one op.
GAP_FLATTEN = {
    "name": "test.gap_flatten",
    "description": "GlobalAveragePool + Flatten as one region",
    "nodes": [
        {"id": "pool", "op": "GlobalAveragePool"},
        {"id": "flat", "op": "Flatten", "inputs": {"0": "pool"}},
    ],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test", "op_type": "GapFlatten"}},
}


@dataclass
class WorkerEnv:
    settings: Settings
    store: LocalStore

    def db(self) -> AbstractContextManager[Session]:
        return session_scope(self.settings.resolved_database_url)

    def submit(
        self,
        model: Path | bytes = RESNET,
        *,
        config: dict[str, Any] | None = None,
        strategy: str | None = None,
        max_attempts: int | None = None,
        model_name: str = "resnet.onnx",
        data_files: tuple[Path, ...] = (),
        tenant: str = TENANT,
    ) -> str:
        """Store the model (and its external-data files) and create a queued job for it
        for ``tenant``, as the upload route does (its sizes counted for the quotas)."""
        data = model if isinstance(model, bytes) else model.read_bytes()
        digest = self.store.put_bytes(data)
        files, sizes = [], {digest: len(data)}
        for path in data_files:
            files.append({"name": path.name, "digest": self.store.put_file(path)})
            sizes[files[-1]["digest"]] = path.stat().st_size
        with self.db() as session:
            ensure_tenant(session, tenant)
            job, _ = create_job(
                session,
                Principal(tenant, frozenset(SCOPES)),
                model_name=model_name,
                model_digest=digest,
                data_files=files,
                config=config if config is not None else {"target": "generic"},
                strategy=strategy,
                idempotency_key=None,
                max_attempts=max_attempts or self.settings.max_attempts,
                sizes=sizes,
            )
            return job.id

    def job(self, job_id: str) -> Job:
        with self.db() as session:
            job = session.get(Job, job_id)
            assert job is not None
            session.expunge(job)
            return job

    def wait_for(self, job_id: str, predicate: Callable[[Job], bool], timeout: float = 30.0) -> Job:
        """Poll the row until ``predicate`` holds; fail (never hang) after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if predicate(job):
                return job
            if time.monotonic() > deadline:
                pytest.fail(
                    f"job {job_id} still {job.status}/{job.stage} (attempts {job.attempts}, "
                    f"error {job.error!r}) after {timeout:g} s"
                )
            time.sleep(0.1)

    def wait_final(self, job_id: str, timeout: float = 30.0) -> Job:
        return self.wait_for(job_id, lambda j: j.status in FINAL, timeout)


FINAL = {"succeeded", "failed", "cancelled"}


def new_env(data_dir: Path, *, seed: bool = True, **overrides: Any) -> WorkerEnv:
    """Settings for ``data_dir`` (short leases, a fast reaper, a time limit that turns a
    hung child into a failed test rather than a stuck one), migrated and seeded."""
    options = {
        "embedded_worker": False,
        "lease_s": 6,
        "reaper_interval_s": 0.5,
        "job_time_limit_s": 60,
        **overrides,
    }
    settings = Settings(data_dir=data_dir, **options)
    data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    if seed:
        with session_scope(settings.resolved_database_url) as session:
            sync_builtins(session)
    return WorkerEnv(settings, LocalStore(settings.artifacts_dir))


def assert_same_outputs(original: Path, fused: Path, *, atol: float = 1e-4) -> None:
    """Both models on the same random input in onnxruntime (its optimizations off)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sessions = [
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for path in (original, fused)
    ]
    feed = {
        i.name: np.random.default_rng(0)
        .standard_normal([d or 1 for d in i.shape])
        .astype(np.float32)
        for i in sessions[0].get_inputs()
    }
    want, got = (s.run(None, feed) for s in sessions)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=atol)


def op_types(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(path).graph.node}
