"""The typed Python client of an autofusion server, for scripts: the standard library and
httpx only, so it comes with the base install (``pip install autofusion``; nothing of the
engine or the server). The CLI's ``submit``, ``jobs`` and ``registry`` use the same HTTP.

    from autofusion.app.client import Client

    with Client("http://127.0.0.1:8000", api_key=None) as client:
        job = client.submit("model.onnx", config={"target": "onnxruntime", "profile": True})
        job = client.wait(job, timeout=600)
        if job.succeeded:
            client.download(job, "model", "model.fused.onnx")
            speed = client.report(job).get("speed")

The verdict store (what measured selection learned): ``client.list_verdicts(pattern=...)``,
``client.export_verdicts("verdicts.json")``, ``client.import_verdicts("verdicts.json")``.

Errors are exceptions (``AutofusionError``); a refusal carries the problem+json fields
(``RequestRefused.status``, ``.type``, ``.title``, ``.detail``, ``.problem``).
docs/service.md, "The light client", has more.
"""

from autofusion.app.client._client import Client
from autofusion.app.client._errors import (
    AutofusionError,
    RequestRefused,
    UnexpectedResponse,
    Unreachable,
    WaitTimeout,
)
from autofusion.app.client._http import Transport, Upload, read_json, retry_after
from autofusion.app.client._jobs import FINAL, Job, poll
from autofusion.app.client._model_files import download_model_files, model_data_links
from autofusion.app.client._uploads import (
    CHUNK_BYTES,
    CHUNKED_UPLOAD_BYTES,
    UploadProgress,
    file_sha256,
    send_data_files,
    submit_upload,
)
from autofusion.app.client._verdicts import (
    VERDICT_FILTERS,
    export_verdicts,
    import_verdicts,
    list_verdicts,
    verdicts_query,
)

__all__ = [
    "CHUNKED_UPLOAD_BYTES",
    "CHUNK_BYTES",
    "FINAL",
    "VERDICT_FILTERS",
    "AutofusionError",
    "Client",
    "Job",
    "RequestRefused",
    "Transport",
    "UnexpectedResponse",
    "Unreachable",
    "Upload",
    "UploadProgress",
    "WaitTimeout",
    "download_model_files",
    "export_verdicts",
    "file_sha256",
    "import_verdicts",
    "list_verdicts",
    "model_data_links",
    "poll",
    "read_json",
    "retry_after",
    "send_data_files",
    "submit_upload",
    "verdicts_query",
]
