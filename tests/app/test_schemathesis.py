"""Schemathesis over the published OpenAPI document, against a live server.

The server is the real thing in embedded mode (uvicorn in a thread, SQLite, the worker
thread, local artifacts in a temporary folder) with API keys required and two tenants,
``alice`` and ``bob``. Alice has one succeeded job before the run, so the job routes
(downloads, HEAD, events, cancel) answer with real bodies and headers, not only 404s.

Every check schemathesis has runs, bob included: the
object-level-authorization check replays alice's reads of her job as bob, who must not
get it. The run is bounded (a few examples per operation, one worker, a fixed seed) and
must end with zero failures; where the check's expectation cannot hold for this API,
the config below says so per operation, with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from autofusion.app.cli.serve import service_app
from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.migrate import upgrade
from autofusion.app.services.auth import create_key
from tests.app.conftest import relu_model
from tests.serve_process import free_port, run_job

pytestmark = pytest.mark.slow

SCOPES = ["jobs:write", "patterns:write", "metrics:read"]
TENANTS = ("alice", "bob")
MAX_EXAMPLES = 5
SEED = 18
RUN_TIMEOUT_S = 300

# Every check, and what the checks may not expect of this API, per operation. (Checks
# named on the command line would override an operation's "enabled = false".)
CHECKS = """
[checks]
enabled = true

# The pattern registry and the strategies are shared by every tenant by design
# (docs/service.md, "API keys and tenants"): bob reads what alice made.
[[operations]]
include-path-regex = "^/v1/(patterns|strategies)"
checks.object_level_authorization.enabled = false

# A schema-valid body can still be refused on what JSON Schema cannot say: bytes that
# are no ONNX model, a spec that does not compile, a strategy naming a pattern that does
# not exist (422); an If-Match that is not the current ETag (412).
[[operations]]
include-name = ["POST /v1/optimize", "POST /v1/patterns/{name}/test"]
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "401", "403", "404", "409", "422", "429",
]

# Data uploads (issue 29): a schema-valid upload may be refused on what the schema cannot
# say: its size over max_data_file_bytes (413) or the tenant's stored-bytes quota (507),
# a name that is not a plain file name (422); a PATCH of bytes past the declared size
# (413), from the wrong offset (409), of a client that left (400), or whose file is not
# the sha256 declared (422).
[[operations]]
include-name = "POST /v1/uploads"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "401", "403", "413", "422", "429", "507",
]
# 507 is the stored-bytes quota (every upload reserves its size), not a server error.
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "507"]

[[operations]]
include-name = "PATCH /v1/uploads/{upload_id}"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "400", "401", "403", "404", "409", "413", "415", "422", "429",
]

# A request schemathesis made invalid elsewhere (an unknown header) may still be refused
# first for its size: past the upload's declared size (413), or the quota (507).
[[operations]]
include-name = ["POST /v1/uploads", "PATCH /v1/uploads/{upload_id}"]
checks.negative_data_rejection.expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx",
]

# A page_token is opaque: one this server did not issue is 400, as a stale If-Match is
# 412; page_token with offset is 422, a rule between parameters OpenAPI cannot state.
[[operations]]
include-name = ["GET /v1/jobs", "GET /v1/verdicts"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "422"]

# A callback URL is checked against the operator's webhook_allowed_hosts (none here:
# webhooks are off), a rule on the server's settings that JSON Schema cannot state.
[[operations]]
include-name = "PUT /v1/webhooks"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "422"]

[[operations]]
include-name = ["POST /v1/patterns", "POST /v1/strategies"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]

# A pattern is disabled on a machine class on the evidence of its verdicts there: a
# class it has none on is 422 no-verdicts, one it is disabled on already 409 (issue 28).
[[operations]]
include-name = "POST /v1/patterns/{name}/rules"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "422"]

[[operations]]
include-name = ["PUT /v1/patterns/{name}", "PUT /v1/strategies/{name}"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "412", "422"]

[[operations]]
include-name = [
    "DELETE /v1/patterns/{name}",
    "POST /v1/patterns/{name}/enable",
    "POST /v1/patterns/{name}/disable",
]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "412"]

# The changes that take If-Match: 428 without one; a stale one is refused with 412,
# whatever else the request holds.
[[operations]]
include-name = [
    "PUT /v1/patterns/{name}",
    "PUT /v1/strategies/{name}",
    "DELETE /v1/patterns/{name}",
    "POST /v1/patterns/{name}/enable",
    "POST /v1/patterns/{name}/disable",
]
checks.negative_data_rejection.expected-statuses = [
    "400", "401", "403", "404", "409", "412", "415", "422", "428", "429",
]
checks.missing_required_header.expected-statuses = ["428"]
"""


# PATCH /v1/uploads/{upload_id} takes raw bytes as application/offset+octet-stream (tus);
# schemathesis sends them as it sends application/octet-stream.
HOOKS = """import schemathesis
schemathesis.serializer.alias("application/offset+octet-stream", "application/octet-stream")
"""


@dataclass
class LiveServer:
    url: str
    keys: dict[str, str]
    job_id: str
    settings: Settings


def _wait_until_up(url: str, thread: threading.Thread, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and thread.is_alive():
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server at {url} did not start")


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """An embedded server requiring keys, with tenants alice and bob, on 127.0.0.1."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("schemathesis"), require_api_keys=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    with session_scope(settings.resolved_database_url) as session:
        keys = {tenant: create_key(session, tenant, SCOPES, "schemathesis") for tenant in TENANTS}
    port = free_port()
    config = uvicorn.Config(
        service_app(settings), host="127.0.0.1", port=port, log_level="error", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="schemathesis-server", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(url, thread)
        alice = {"Authorization": f"Bearer {keys['alice']}"}
        with httpx.Client(base_url=url, headers=alice, timeout=60) as client:
            # The server logs in this process (pytest shows it): no log file to quote.
            job = run_job(client, relu_model().SerializeToString(), log=Path(os.devnull))
        yield LiveServer(url, keys, job["id"], settings)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _config_files(server: LiveServer, folder: Path) -> Path:
    auth = {
        "auth": [
            {"name": tenant, "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {key}"}]}
            for tenant, key in server.keys.items()
        ]
    }
    (folder / "auth.json").write_text(json.dumps(auth), encoding="utf-8")
    (folder / "hooks.py").write_text(HOOKS, encoding="utf-8")
    config = folder / "schemathesis.toml"
    config.write_text(
        f"""
request-timeout = 60

[auth.wfc]
path = "{folder / "auth.json"}"
user = "alice"
peers = ["alice", "bob"]

# Half the job ids drawn are alice's succeeded job, and half the artifact names are
# files it has; the rest anything.
[dictionaries.jobs]
values = ["{server.job_id}"]

[dictionaries.artifacts]
values = ["report.html", "report.md"]

[parameters]
"path.job_id" = {{ dictionary = "jobs", probability = 0.5 }}

[[operations]]
include-path = "/v1/jobs/{{job_id}}/artifacts/{{name}}"
parameters = {{ "path.name" = {{ dictionary = "artifacts", probability = 0.5 }} }}
{CHECKS}""",
        encoding="utf-8",
    )
    return config


def test_schemathesis_finds_nothing_with_two_tenants(live_server: LiveServer, tmp_path: Path):
    config = _config_files(live_server, tmp_path)
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{live_server.url}/openapi.json",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--no-color",
        "--report-dir",
        str(tmp_path / "report"),
    ]
    run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(tmp_path / "hooks.py")},
    )
    output = run.stdout + run.stderr
    print(output[-4000:])  # the summary, with -s or -rP
    assert run.returncode == 0, output[-12000:]
    assert "29/29" in output or "Tested:" in output, output[-2000:]
