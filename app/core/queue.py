"""The queue as the API sees it: publish a job id by its task's name, import no task code.

The API process never does model work, so it never imports the worker: ``publish_job``
sends ``RUN_JOB`` by name (Celery's ``send_task``), and the worker registers its task under
the same name (``autofusion.worker.tasks``). The name is explicit and stable, so jobs queued
before an upgrade are still taken after it.

``queue_app`` is the Celery application a publisher needs: the broker, its transport
options, JSON only and the default queue. The worker builds on it
(``autofusion.worker.celery_app.make_celery``) and adds its side: the task module, late
acknowledgement, prefetch. Embedded mode uses kombu's ``filesystem://`` transport (folders
under data_dir, no server); distributed mode uses Redis.
"""

from __future__ import annotations

from celery import Celery

from autofusion.app.core import tracing
from autofusion.app.core.config import Settings

__all__ = ["QUEUE", "RUN_JOB", "publish_job", "queue_app"]

QUEUE = "autofusion"
RUN_JOB = "autofusion.run_job"


def publish_job(celery: Celery, job_id: str, *, countdown: float | None = None) -> None:
    """Send the job id (never model bytes) to the queue; call after the commit.
    ``countdown``: not before this many seconds (a job held by its tenant's running limit).
    While tracing, the message's headers carry this send's span context (W3C
    ``traceparent``), so the worker's spans for the job join the request's trace."""
    tracing.annotate(job_id=job_id)  # the request that created the job names it too
    with tracing.span("autofusion.enqueue", kind="producer", job_id=job_id):
        headers = tracing.carrier() or None
        celery.send_task(RUN_JOB, args=[job_id], countdown=countdown, headers=headers)


def queue_app(settings: Settings) -> Celery:
    """A Celery application that publishes to the service's broker and queue."""
    app = Celery("autofusion", broker=settings.resolved_broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_default_queue=QUEUE,
        broker_transport_options=_transport_options(settings),
        broker_connection_retry_on_startup=True,
    )
    return app


def _transport_options(settings: Settings) -> dict:
    if not settings.is_embedded_broker:
        return {"visibility_timeout": settings.visibility_timeout_s}
    folder = settings.broker_dir.resolve()
    for sub in ("out", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folder / "out"),
        "data_folder_out": str(folder / "out"),
        "processed_folder": str(folder / "processed"),
        # kombu's default is ./control, relative to whatever the cwd is
        "control_folder": str(folder / "control"),
        "store_processed": False,
    }
