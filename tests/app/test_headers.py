"""Headers and exposure (issue 15, item 8): downloads are attachments and never sniffed,
report.md escapes what a model names, 401s say how to authenticate, /metrics needs a key
on a keyed server, and the pure-Python protobuf backend is refused at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autofusion.app.services.artifacts import download_headers, safe_filename
from autofusion.app.services.auth import create_key
from autofusion.fusion_core.report import format_markdown

REPO = Path(__file__).resolve().parents[2]
HOSTILE_NAME = 'x"; filename=evil.exe; <img src=x onerror=alert(1)> [a](e) é.onnx'


def _succeed_with_artifacts(service, job_id: str) -> None:
    store = service.app.state.store
    artifacts = {
        "report.html": store.put_bytes(b"<!doctype html><script>alert(1)</script>"),
        "report.md": store.put_bytes(b"# report"),
        "profile_trace.json": store.put_bytes(b"[]"),
    }
    service.succeed(job_id, b"fused", {"fusions": {}}, {"fusions": 0, "artifacts": artifacts})


def test_every_download_is_an_attachment_that_is_never_sniffed(service, tiny_model):
    # The name passes the upload's plain-file-name check: quotes, ';', '<' are allowed.
    job_id = service.submit(tiny_model, model_name=HOSTILE_NAME).json()["id"]
    _succeed_with_artifacts(service, job_id)
    base = f"/v1/jobs/{job_id}"
    paths = [f"{base}/model", f"{base}/report"]
    paths += [
        f"{base}/artifacts/{name}" for name in ("report.html", "report.md", "profile_trace.json")
    ]
    for path in paths:
        response = service.client.get(path)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["x-content-type-options"] == "nosniff", path
        disposition = response.headers["content-disposition"]
        assert disposition.startswith('attachment; filename="'), (path, disposition)
        plain = disposition.split('filename="', 1)[1].split('"', 1)[0]
        assert set(plain) <= set(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
        )
        assert disposition.count(";") == 2  # filename and filename*, nothing smuggled in
    html = service.client.get(f"{base}/artifacts/report.html")
    assert html.headers["content-disposition"].endswith(".report.html")


def test_download_file_names_are_sanitized():
    assert safe_filename("relu.fused.onnx") == "relu.fused.onnx"
    assert safe_filename('a"b;c\r\n.onnx') == "a_b_c_.onnx"
    assert safe_filename("..hidden") == "hidden"
    assert safe_filename("\u00e9\u00e9") == "download"
    headers = download_headers("mod\u00e8le.onnx")
    assert headers["Content-Disposition"] == (
        "attachment; filename=\"mod_le.onnx\"; filename*=UTF-8''mod%C3%A8le.onnx"
    )


def test_report_md_escapes_the_model_name_and_other_user_text():
    report = {
        "model": "<img src=x onerror=alert(1)>[click](http://evil)|`x`.onnx",
        "target": "generic",
        "nodes": {"before": 2, "after": 1},
        "fusions": {"conv_bn_relu": 1},
        "near_misses": [
            {"pattern": "p*q*", "nodes": ["n|1", "<b>n2</b>"], "reason": "![i](http://t/x.png)"}
        ],
    }
    text = format_markdown(report)
    heading = text.splitlines()[0]
    assert "<img" not in text and "<b>" not in text
    assert "&lt;img src=x onerror=alert(1)>" in heading
    assert "\\[click\\](http://evil)\\|\\`x\\`.onnx" in heading
    assert "| p\\*q\\* | n\\|1, &lt;b>n2&lt;/b> | !\\[i\\](http://t/x.png) |" in text
    assert "| conv_bn_relu | 1 |" in text  # a name's inner underscores stay readable


@pytest.fixture
def keyed(make_service):
    service = make_service(require_api_keys=True)
    with service.db() as session:
        keys = {
            "jobs": create_key(session, "t", ["jobs:write"]),
            "metrics": create_key(session, "ops", ["metrics:read"]),
            "admin": create_key(session, "ops", ["admin"]),
        }
    return service, keys


def test_401s_carry_www_authenticate(keyed):
    service, _ = keyed
    for headers in ({}, {"Authorization": "Bearer af_wrong"}, {"X-API-Key": "nope"}):
        response = service.client.get("/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="autofusion"'
    login = service.client.post("/ui/login", data={"key": "af_wrong"})
    assert login.status_code == 401
    assert login.headers["www-authenticate"].startswith("Bearer")


def test_metrics_need_a_metrics_or_admin_key_on_a_keyed_server(keyed, problem):
    service, keys = keyed
    problem(service.client.get("/metrics"), 401, "unauthorized")
    jobs_only = {"Authorization": f"Bearer {keys['jobs']}"}
    body = problem(service.client.get("/metrics", headers=jobs_only), 403, "forbidden")
    assert "metrics:read" in body["detail"]
    for key in (keys["metrics"], keys["admin"]):
        scraped = service.client.get("/metrics", headers={"Authorization": f"Bearer {key}"})
        assert scraped.status_code == 200 and "autofusion" in scraped.text


def test_metrics_stay_open_without_keys(service):
    assert service.client.get("/metrics").status_code == 200


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_the_pure_python_protobuf_backend_is_refused_at_start_up(command, tmp_path):
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    env["AUTOFUSION_DATA_DIR"] = str(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from autofusion.app.cli import main; sys.exit(main())",
            command,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pure-Python backend" in lines[0], done.stderr
    assert "Traceback" not in done.stderr
