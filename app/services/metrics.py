"""Prometheus metrics, one registry per app (tests create many apps; no global state).

* ``autofusion_http_requests_total{method, route, status}``: counted by an ASGI
  middleware (``app.api.request_metrics``); ``route`` is the route's path template
  (``/v1/jobs/{job_id}``), or ``unmatched``, so ids never become label values.
* ``autofusion_http_request_duration_seconds{method, route, status_class}``: the same
  middleware's latency histogram, from the request's arrival to its response's last
  byte (a stream's whole life: an event stream lands in the top buckets), by status
  class (``2xx``, ``4xx``, ...) so that the series stay few.
* ``autofusion_jobs{status}``: a gauge read from the database at scrape time, so it is
  right whichever process changed the jobs.
* ``autofusion_job_duration_seconds{status}`` and ``autofusion_job_stage_seconds{stage}``:
  histograms of jobs that finished since this process started, observed at scrape time
  (the stage times come from ``summary["timings"]`` when the worker recorded them).
  Every API process observes every job: with several replicas, read one, don't sum.
"""

from __future__ import annotations

import threading
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autofusion.app.core.models import Job, JobStatus, as_utc, utcnow

__all__ = ["METHODS", "Metrics"]

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_JOB_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600)
_STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900)
# Polls answer in milliseconds, uploads of big models in seconds to minutes.
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "autofusion_http_requests",
            "HTTP requests answered, by method, route template and status code.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "autofusion_http_request_duration_seconds",
            "Time from a request's arrival to its response's last byte, by method, route "
            "template and status class.",
            ["method", "route", "status_class"],
            buckets=_REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.jobs = Gauge(
            "autofusion_jobs",
            "Jobs in the database, by status (read at scrape time).",
            ["status"],
            registry=self.registry,
        )
        self.job_seconds = Histogram(
            "autofusion_job_duration_seconds",
            "Run time (start to finish) of jobs that finished since this process started.",
            ["status"],
            buckets=_JOB_BUCKETS,
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "autofusion_job_stage_seconds",
            "Time per pipeline stage of jobs that finished since this process started "
            "(from the job summary's timings).",
            ["stage"],
            buckets=_STAGE_BUCKETS,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._watermark: datetime = utcnow()
        self._seen_at_watermark: set[str] = set()

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One answered request: counted, and its latency observed."""
        method = method if method in METHODS else "other"
        self.requests.labels(method, route, str(status)).inc()
        self.request_seconds.labels(method, route, f"{status // 100}xx").observe(seconds)

    def scrape(self, session: Session) -> bytes:
        """Refresh what comes from the database, then render the text format."""
        with self._lock:
            self._count_jobs(session)
            self._observe_finished(session)
        return generate_latest(self.registry)

    def _count_jobs(self, session: Session) -> None:
        counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        for status in JobStatus:
            self.jobs.labels(status.value).set(counts.get(status.value, 0))

    def _observe_finished(self, session: Session) -> None:
        rows = session.execute(
            select(Job.id, Job.status, Job.started_at, Job.finished_at, Job.summary)
            .where(Job.finished_at.is_not(None), Job.finished_at >= self._watermark)
            .order_by(Job.finished_at)
        ).all()
        for job_id, status, started_at, finished_at, summary in rows:
            if job_id in self._seen_at_watermark:
                continue
            if started_at is not None:
                seconds = (as_utc(finished_at) - as_utc(started_at)).total_seconds()
                self.job_seconds.labels(status).observe(max(seconds, 0.0))
            timings = (summary or {}).get("timings")
            if isinstance(timings, dict):
                for stage, seconds in timings.items():
                    if isinstance(seconds, int | float) and seconds >= 0:
                        self.stage_seconds.labels(str(stage)).observe(seconds)
            if as_utc(finished_at) > as_utc(self._watermark):
                self._watermark, self._seen_at_watermark = as_utc(finished_at), set()
            self._seen_at_watermark.add(job_id)
