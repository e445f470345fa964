"""The Celery application, configured from Settings.

Embedded mode uses kombu's ``filesystem://`` transport (folders under data_dir, no
server); distributed mode uses Redis. Either way tasks carry job ids only, JSON only,
are acknowledged late (after the job ends) and rejected back to the queue if the
worker process dies, and each worker prefetches one task at a time.
"""

from __future__ import annotations

from celery import Celery

from autofusion.app.core.config import Settings

__all__ = ["QUEUE", "make_celery"]

QUEUE = "autofusion"


def make_celery(settings: Settings) -> Celery:
    app = Celery(
        "autofusion", broker=settings.resolved_broker_url, include=["autofusion.worker.tasks"]
    )
    transport_options: dict = {}
    if settings.is_embedded_broker:
        folder = settings.broker_dir.resolve()
        for sub in ("out", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        transport_options = {
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "processed_folder": str(folder / "processed"),
            # kombu's default is ./control, relative to whatever the cwd is
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    else:
        transport_options = {"visibility_timeout": settings.visibility_timeout_s}
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.conf.autofusion_settings = settings
    return app
