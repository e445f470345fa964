"""``Client``: submit a model, wait for its job, download what it made, read its report;
the server's verdict store."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import httpx

from autofusion.app.client import _verdicts
from autofusion.app.client._http import Transport, Upload, read_json
from autofusion.app.client._jobs import Job, poll
from autofusion.app.client._model_files import download_model_files, model_data_links
from autofusion.app.client._uploads import (
    CHUNK_BYTES,
    CHUNKED_UPLOAD_BYTES,
    UploadProgress,
    submit_upload,
)

__all__ = ["Client"]

_ARTIFACTS = ("model", "report")  # GET /v1/jobs/{id}/model, /report; the rest are artifacts


class Client:
    """An autofusion server, for scripts. Every call raises an ``AutofusionError`` when it
    cannot do what it says: ``RequestRefused`` (with the problem+json fields) when the
    server said no, ``Unreachable`` when it could not be reached, ``WaitTimeout`` when
    a wait ran out. A failed job is not an error: ``wait`` returns it, ``Job.error`` says
    why."""

    def __init__(self, url: str, api_key: str | None = None, *, poll_interval: float = 1.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the server's URL must be http(s), not {url!r}")
        self._transport = Transport(url, api_key, user_agent="autofusion-client/1")
        self.poll_interval = poll_interval

    @property
    def server(self) -> str:
        return self._transport.server

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        model: str | PathLike[str],
        *,
        data: Iterable[str | PathLike[str]] = (),
        config: Mapping[str, Any] | None = None,
        callback_url: str | None = None,
        idempotency_key: str | None = None,
        chunked_upload_bytes: int = CHUNKED_UPLOAD_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
        on_upload_progress: UploadProgress | None = None,
    ) -> Job:
        """Upload ``model`` (and its external-data files) with these config options
        (target, strategy, profile, ...). The server answers at once with the queued
        job. ``idempotency_key``: the same key again returns the job it first created;
        by default each call makes a new job (its own retries stay safe).

        A data file over ``chunked_upload_bytes`` goes first through ``/v1/uploads`` in
        ``chunk_bytes`` PATCHes, resumed after a broken connection or a 5xx (a server
        without that route gets it in the body); ``on_upload_progress(name, sent,
        size)`` follows it. The same file again, from this client, is sent once."""
        options = dict(config or {})
        if callback_url is not None:  # POSTed the job's summary when it ends
            options["callback_url"] = callback_url
        upload = Upload(Path(model), [Path(p) for p in data], options)
        key = idempotency_key or f"autofusion-client-{uuid.uuid4().hex}"
        response = submit_upload(
            self._transport,
            upload,
            key,
            chunked_upload_bytes=chunked_upload_bytes,
            chunk_bytes=chunk_bytes,
            on_progress=on_upload_progress,
        )
        resource = read_json(response)
        location = response.headers.get("Location") or f"/v1/jobs/{resource['id']}"
        return self._job(resource, httpx.URL(location).path)

    def job(self, job: Job | str) -> Job:
        """The job as it is now."""
        path = self._path(job)
        return self._job(read_json(self._transport.send("GET", path)), path)

    def wait(
        self,
        job: Job | str,
        *,
        timeout: float = 3600.0,
        on_update: Callable[[Job], Any] | None = None,
    ) -> Job:
        """Follow the job until it ends (succeeded, failed or cancelled) and return it;
        ``WaitTimeout`` after ``timeout`` seconds (the job goes on)."""
        current = job if isinstance(job, Job) else self.job(job)
        path = self._path(current)

        def seen(resource: dict) -> None:
            if on_update is not None:
                on_update(self._job(resource, path))

        final = poll(self._transport, path, current.data, self.poll_interval, timeout, seen)
        return self._job(final, path)

    def cancel(self, job: Job | str) -> Job:
        """Ask the job to stop; it does at its next step."""
        path = self._path(job)
        return self._job(read_json(self._transport.send("POST", f"{path}/cancel")), path)

    def report(self, job: Job | str) -> dict:
        """The job's JSON report (docs/report.schema.json)."""
        return read_json(self._transport.send("GET", self._link(job, "report")))

    def download(self, job: Job | str, what: str, dest: str | PathLike[str]) -> Path:
        """Write ``what`` to ``dest``, whole or not at all: ``"model"`` (the fused model),
        ``"report"`` (the JSON report) or an artifact's name (``"report.html"``,
        ``"report.md"``, ...). The model comes with its data files when its weights went
        to one (it came with one, or it is over 2 GB): each is written beside ``dest``
        under the name the model gives it (``model_files`` lists what was written)."""
        destination = Path(dest)
        if what == "model":
            return self.model_files(job, destination)[0]
        self._transport.download(self._link(job, what), destination)
        return destination

    def model_files(self, job: Job | str, dest: str | PathLike[str]) -> list[Path]:
        """The fused model written to ``dest`` and its data files beside it, under the
        names its external-data entries give (the job's ``links.model_data``); an
        interrupted transfer resumes where it stopped. Returns the files written."""
        current = job if isinstance(job, Job) and job.done else self.job(job)
        return download_model_files(
            self._transport.download,
            self._link(current, "model"),
            model_data_links(current.data),
            Path(dest),
        )

    def list_verdicts(
        self, *, page_size: int | None = None, page_token: str | None = None, **filters: Any
    ) -> dict:
        """One page of the server's verdict store, newest measurement first: ``items``,
        ``total``, ``next_page_token`` (send it back as ``page_token``). ``filters``:
        pattern, verdict, signature, machine_key, onnxruntime, cpu, since, source."""
        params = _verdicts.verdicts_query(filters, page_size=page_size, page_token=page_token)
        return _verdicts.list_verdicts(self._transport, params)

    def export_verdicts(
        self, dest: str | PathLike[str] | None = None, *, limit: int | None = None, **filters: Any
    ) -> dict:
        """The filtered verdicts (the newest, up to ``limit``) as a verdicts file; also
        written to ``dest`` when given (``autofusion verdicts import`` reads it)."""
        params = _verdicts.verdicts_query(filters, limit=limit)
        document = _verdicts.export_verdicts(self._transport, params)
        if dest is not None:
            Path(dest).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        return document

    def import_verdicts(self, source: str | PathLike[str] | Mapping[str, Any]) -> dict:
        """Store a verdicts file's verdicts on the server (an admin key's): ``imported``,
        ``duplicates`` (stored already: importing twice stores once), ``skipped`` (why)."""
        if isinstance(source, Mapping):
            document = source
        else:
            document = json.loads(Path(source).read_text(encoding="utf-8"))
        if not isinstance(document, Mapping):
            raise ValueError(f"{source} is not a verdicts file (a JSON object)")
        return _verdicts.import_verdicts(self._transport, document)

    def _job(self, resource: Mapping[str, Any], path: str) -> Job:
        return Job.from_resource(resource, self.server + path)

    def _path(self, job: Job | str) -> str:
        if isinstance(job, Job):
            return httpx.URL(job.url).path
        if not job or "/" in job:
            raise ValueError(f"not a job id: {job!r}")
        return f"/v1/jobs/{job}"

    def _link(self, job: Job | str, what: str) -> str:
        """Where ``what`` of the job is: the link the job resource names, else the
        documented route."""
        path = self._path(job)
        links = job.links if isinstance(job, Job) else {}
        if what in _ARTIFACTS:
            return links.get(what) or f"{path}/{what}"
        artifacts = links.get("artifacts") if isinstance(links.get("artifacts"), dict) else {}
        return artifacts.get(what) or f"{path}/artifacts/{what}"
