"""Shared fixtures for the service tests: a real app on SQLite in ``tmp_path``.

``make_service(**settings)`` starts an app (lifespan included: migrations, seeding) with
its own data folder and returns a ``Service``: the TestClient, the app, its settings and
``enqueued``, the job ids the app sent to the queue (``app.state.enqueue`` is replaced
by a recorder once the lifespan has started; no worker runs).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import onnx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from onnx import TensorProto, helper
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job, JobStatus
from autofusion.app.main import create_app
from tests import services  # the real PostgreSQL and Redis, isolated per test


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards. Without PostgreSQL the test skips,
    naming it; it fails instead under ``AUTOFUSION_REQUIRE_SERVICES=1`` (.ci/run)."""
    with services.fresh_postgres_database() as url:
        yield url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """An empty Redis database number of our own, flushed afterwards (without Redis: as
    ``postgres_url``)."""
    with services.empty_redis_db() as client:
        yield services.redis_url(client)


PROBLEM_JSON = "application/problem+json"
PROBLEM_BASE = "https://autofusion.dev/problems/"


@dataclass
class Service:
    client: TestClient
    app: FastAPI
    settings: Settings
    enqueued: list[str] = field(default_factory=list)

    def db(self) -> AbstractContextManager[Session]:
        return session_scope(self.settings.resolved_database_url)

    def submit(
        self,
        model: bytes,
        *,
        model_name: str = "model.onnx",
        data: Sequence[tuple[str, bytes]] = (),
        config: dict[str, Any] | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """``POST /v1/optimize`` as multipart: the model, ``data`` parts and ``config``."""
        files = [("model", (model_name, model, "application/octet-stream"))]
        files += [("data", (name, content, "application/octet-stream")) for name, content in data]
        form = {}
        if config is not None:
            form["config"] = config if isinstance(config, str) else json.dumps(config)
        return self.client.post("/v1/optimize", files=files, data=form, headers=headers or {})

    def update_job(self, job_id: str, **values: Any) -> None:
        """Change the job row as a worker would (the revision moves on)."""
        with self.db() as session:
            job = session.get(Job, job_id)
            for name, value in values.items():
                setattr(job, name, value)
            job.revision += 1

    def succeed(self, job_id: str, model: bytes, report: dict, summary: dict | None = None) -> None:
        """Finish the job as a worker would: the fused model and the report in the store."""
        store = self.app.state.store
        self.update_job(
            job_id,
            status=JobStatus.succeeded.value,
            stage="succeeded",
            progress=1.0,
            finished_at=datetime.now(UTC),
            fused_digest=store.put_bytes(model),
            report_digest=store.put_bytes(json.dumps(report).encode()),
            summary={"fusions": 1} if summary is None else summary,
        )

    def job_count(self) -> int:
        with self.db() as session:
            return session.query(Job).count()

    def uploads_left(self) -> list[Path]:
        folder = self.settings.uploads_dir
        return sorted(folder.iterdir()) if folder.exists() else []


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    counter = itertools.count()
    with ExitStack() as stack:

        def make(**overrides: Any) -> Service:
            # No worker runs here: /readyz asks for one only where a test says so
            # (tests/app/test_liveness.py).
            options = {
                "embedded_worker": False,
                "events_poll_s": 0.02,
                "readyz_requires_worker": False,
                **overrides,
            }
            settings = Settings(data_dir=tmp_path / f"service{next(counter)}", **options)
            app = create_app(settings)
            client = stack.enter_context(TestClient(app))
            service = Service(client, app, settings)
            app.state.enqueue = service.enqueued.append
            return service

        yield make


@pytest.fixture
def service(make_service: Callable[..., Service]) -> Service:
    return make_service()


def relu_model(width: int = 4) -> onnx.ModelProto:
    """The smallest useful model: y = Relu(x), x of shape [1, width]."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def tiny_model() -> bytes:
    return relu_model().SerializeToString()


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem of this status and type; returns the body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
    body = response.json()
    assert body["type"] == PROBLEM_BASE + slug, body
    assert body["status"] == status
    assert body["title"] and body["detail"]
    return body


@pytest.fixture
def problem() -> Callable[..., dict[str, Any]]:
    """``problem(response, status, slug)``: assert an RFC 9457 problem, return its body."""
    return assert_problem
