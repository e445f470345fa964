"""Dashboard pages: the jobs list, one job (live while it runs, its report once done),
cancel, delete, and downloads authenticated by the dashboard's cookie."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import RedirectResponse

from autofusion.app.api.deps import SessionDep, SettingsDep, StoreDep
from autofusion.app.api.downloads import JobDownloads
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.job_records import fused_data_names
from autofusion.app.core.models import Job, JobStatus, utcnow
from autofusion.app.services import job_files
from autofusion.app.services.job_pages import decode_page_token, encode_page_token, list_jobs
from autofusion.app.services.job_phases import recent_phases
from autofusion.app.services.jobs import cancel_job, get_job
from autofusion.app.services.retention import delete_job
from autofusion.app.services.webhooks import job_webhooks
from autofusion.app.services.worker_health import job_with_waiting
from autofusion.app.ui.common import UIPrincipal, render, require
from autofusion.app.ui.job_data import LIVE, job_problem, job_row, load_report_view
from autofusion.app.ui.progress import history_for, progress_view

__all__ = ["router"]

router = APIRouter(prefix="/ui/jobs", include_in_schema=False)

PAGE_SIZE = 20
STATUSES = [status.value for status in JobStatus]
# What /ui/jobs/{id}/download/{what} serves: the API's files, by a short name.
DOWNLOADS = {"report.html", "report.md", "trace", "model", "original", "report"}


def _status_filter(status: str | None) -> str | None:
    if not status:
        return None
    if status not in STATUSES:
        raise ProblemError(
            422, "invalid-request", "Invalid request", f"status must be one of {STATUSES}"
        )
    return status


# A page token (the API's): absent for the newest jobs.
Page = Annotated[str | None, Query(max_length=1000)]


def _page_context(
    principal: UIPrincipal,
    session: SessionDep,
    store: StoreDep,
    status: str | None = None,
    page: Page = None,
) -> dict:
    """A page of the list, by the API's page tokens (app/services/job_pages.py): a job
    submitted meanwhile does not shift the older pages, and "newer" goes back. A
    dependency: the list page and its polled rows take the same query."""
    status = _status_filter(status)
    key = decode_page_token(page, status) if page else None
    listed = list_jobs(session, principal.tenant_id, status=status, page_size=PAGE_SIZE, key=key)
    rows = [job_row(job, store) for job in listed.jobs]
    return {
        "rows": rows,
        "status": status or "",
        "statuses": STATUSES,
        "page": page or "",
        "older": encode_page_token(listed.older, status) if listed.older else None,
        "newer": encode_page_token(listed.newer, status) if listed.newer else None,
        "total": listed.total,
        "live": any(row["live"] for row in rows),
    }


PageContext = Annotated[dict, Depends(_page_context)]


@router.get("")
def jobs_page(request: Request, context: PageContext):
    """The tenant's jobs, newest first, filtered by status, a page at a time."""
    return render(request, "jobs.html", context)


@router.get("/rows")
def jobs_rows(request: Request, context: PageContext):
    """The table body alone, polled while a job in view is live (then no more)."""
    return render(request, "_job_rows.html", context)


def _job_context(job: Job, session: SessionDep) -> dict:
    live = job.status in LIVE
    running = job.status == JobStatus.running.value
    past = None
    if running:
        database = str(session.get_bind().url)
        past = history_for(job, lambda tenant: recent_phases(session, tenant), database)
    return {
        "job": job,
        "live": live,
        "cancel_requested": bool(job.cancel_requested),
        "progress": max(0.0, min(1.0, job.progress or 0.0)),
        "timing": progress_view(job, utcnow(), past),
    }


@router.get("/{job_id}")
def job_page(
    job_id: str,
    request: Request,
    principal: UIPrincipal,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
):
    """One job: its state (live while queued or running), then its report."""
    job, waiting = job_with_waiting(session, principal.tenant_id, job_id, settings)
    context = {**_job_context(job, session), "waits_for": waiting}
    context["report"] = None if context["live"] else load_report_view(job, store)
    context["artifacts"] = sorted((job.summary or {}).get("artifacts") or {})
    context["model_data"] = fused_data_names(job)
    context["problem"] = job_problem(job)
    # the _webhooks.html partial
    context["webhooks"] = job_webhooks(session, job, settings.public_url)
    return render(request, "job.html", context)


@router.get("/{job_id}/live")
def job_live(
    job_id: str,
    request: Request,
    principal: UIPrincipal,
    session: SessionDep,
    settings: SettingsDep,
):
    """The live section; once the job has finished, HX-Refresh loads the whole page."""
    job, waiting = job_with_waiting(session, principal.tenant_id, job_id, settings)
    context = {**_job_context(job, session), "waits_for": waiting}
    headers = {} if context["live"] else {"HX-Refresh": "true"}
    return render(request, "_job_live.html", context, headers=headers)


@router.post("/{job_id}/cancel")
def job_cancel(job_id: str, principal: UIPrincipal, session: SessionDep):
    """Cancel the job (a POST form: see app/ui/common.py on CSRF), then show it."""
    require(principal, "jobs:write")
    job = get_job(session, principal.tenant_id, job_id)
    if not JobStatus(job.status).is_final:  # it may have finished meanwhile: just show it
        cancel_job(session, job)
        session.commit()
    return RedirectResponse(f"/ui/jobs/{job.id}", status_code=303)


@router.post("/{job_id}/delete")
def job_delete(job_id: str, principal: UIPrincipal, session: SessionDep):
    """Delete a finished job and its files (frees the tenant's quota), then the list."""
    require(principal, "jobs:write")
    delete_job(session, get_job(session, principal.tenant_id, job_id))  # 409 while it runs
    session.commit()
    return RedirectResponse("/ui/jobs", status_code=303)


def _download(
    request: Request,
    principal: UIPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
) -> JobDownloads:
    return JobDownloads(request, principal, session, settings, store)


DownloadDep = Annotated[JobDownloads, Depends(_download)]


@router.api_route("/{job_id}/download/{what}", methods=["GET", "HEAD"])
def job_download(job_id: str, what: str, download: DownloadDep) -> Response:
    """The API's downloads (model, report, artifacts), authenticated by the cookie."""
    if what not in DOWNLOADS:
        raise ProblemError(404, "not-found", "Not found", f"there is no download {what!r}")
    job = download.job(job_id)
    if what == "model":
        file = job_files.fused_model_file(job)
    elif what == "original":  # the upload itself, for a graph viewer beside the fused model
        file = job_files.original_model_file(job)
    elif what == "report":
        file = job_files.report_file(job)
    else:  # report.html too, as an attachment: its page is /report.html, sandboxed
        file = job_files.artifact_file(job, "profile_trace.json" if what == "trace" else what)
    return download.send(file)


@router.api_route("/{job_id}/download/model-data/{name}", methods=["GET", "HEAD"])
def job_download_model_data(job_id: str, name: str, download: DownloadDep) -> Response:
    """One of the fused model's data files (the API's /model/data/{name}), by the cookie."""
    return download.send(job_files.fused_data_file(download.job(job_id), name))


@router.api_route("/{job_id}/report.html", methods=["GET", "HEAD"])
def job_report_page(job_id: str, download: DownloadDep) -> Response:
    """report.html opened in the browser (inline) under a CSP with ``sandbox``: a job's
    HTML never runs script in the dashboard's origin. The download stays a download."""
    return download.send(job_files.report_page_file(download.job(job_id)))
