"""Celery tasks: thin adapters that take a job id (placeholder until the worker lands)."""

from __future__ import annotations

from celery import Celery

__all__ = ["RUN_JOB", "enqueue_job"]

RUN_JOB = "autofusion.run_job"


def enqueue_job(celery: Celery, job_id: str) -> None:
    """Send the job id (never model bytes) to the queue; call after the commit."""
    celery.send_task(RUN_JOB, args=[job_id])
