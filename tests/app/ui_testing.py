"""Helpers of the dashboard tests: page checks and small models."""

from __future__ import annotations

import re

import httpx
import onnx

from autofusion.fusion_core import testing

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'"
)
XSS = "<img src=x onerror=alert(1)>"
ESCAPED_XSS = "&lt;img src=x onerror=alert(1)&gt;"
_EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def assert_page(response: httpx.Response, *ids: str, status: int = 200) -> str:
    """An HTML page of ``status`` with the CSP, nothing from another host, and ``ids``."""
    assert response.status_code == status, response.text[:2000]
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["content-security-policy"] == CSP
    html = response.text
    assert not _EXTERNAL.search(html), _EXTERNAL.search(html)
    assert "<script>" not in html and "<script " not in html.replace(
        '<script src="/ui/static/htmx.min.js" defer>', ""
    )
    for element_id in ids:
        assert f'id="{element_id}"' in html, f"#{element_id} missing"
    return html


def conv_bn_relu(prefix: str = "", doc: str = "", width: int = 4) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> Relu -> y: the built-in conv_bn_relu fuses it."""
    return testing.conv_bn_relu(
        in_channels=2, out_channels=3, height=width, width=width, prefix=prefix, doc=doc
    )


def multipart(
    model: bytes, filename: str = "model.onnx", **fields: str
) -> dict[str, list[tuple[str, tuple]]]:
    """``files=`` for httpx: the model and text fields, as a browser sends the form."""
    parts = [("model", (filename, model, "application/octet-stream"))]
    parts += [(name, (None, value)) for name, value in fields.items()]
    return {"files": parts}


def run_job(service, job_id: str):
    """Run the job the way a worker does and return its (detached) row; it must succeed."""
    from autofusion.app.core.models import Job
    from autofusion.worker.execute import Outcome, execute_job

    store = service.app.state.store
    assert execute_job(service.settings, job_id, "worker-1", store) == Outcome.succeeded
    with service.db() as session:
        job = session.get(Job, job_id)
        session.expunge(job)
        return job
