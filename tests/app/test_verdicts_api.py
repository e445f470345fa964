"""The verdict store's routes (``/v1/verdicts``, its export and import) and
``autofusion verdicts``: any key reads, only ``admin`` imports, a bad file is a 422
problem, another tenant's job id is hidden, and the CLI's export of one server imported
into a second, fresh one gives the same store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from cli_server import (
    Server,
    clean_client_env,  # noqa: F401 (autouse: no AUTOFUSION_*, GITHUB_* variables)
    started_server,
)
from cli_server import run_cli as cli

from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_OK
from autofusion.app.client import Client
from autofusion.app.core.db import session_scope
from autofusion.app.services.auth import create_key
from autofusion.fusion_core.profiling.verdicts import VERDICTS_FORMAT
from tests.app.test_cli_imports import loaded_by
from tests.app.verdicts_testing import NOW, record, row

HEAVY = ("onnx", "onnxruntime", "numpy", "autofusion.fusion_core.pipeline")
WHO = ("id", "job_id", "job_visible", "source")  # what an import sets anew


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(make_service):
    """A server that requires keys, with verdicts of two tenants' jobs and an import."""
    service = make_service(require_api_keys=True)
    with service.db() as session:
        keys = {
            "acme": create_key(session, "acme", ["jobs:write"]),
            "globex": create_key(session, "globex", []),
            "admin": create_key(session, "ops", ["admin"]),
        }
        session.add_all(
            [
                row(0, job_id="job-acme", tenant_id="acme"),
                row(1, job_id="job-globex", tenant_id="globex", measured_at=NOW - timedelta(1)),
                row(2, tenant_id="ops", source="imported", measured_at=NOW - timedelta(2)),
            ]
        )
    return service, keys


def test_any_key_lists_the_store_and_sees_only_its_own_jobs(secured, problem):
    service, keys = secured
    problem(service.client.get("/v1/verdicts"), 401, "unauthorized")
    page = service.client.get("/v1/verdicts", headers=bearer(keys["globex"])).json()
    assert page["total"] == 3 and page["next_page_token"] is None
    assert [(v["job_id"], v["job_visible"]) for v in page["items"]] == [
        (None, False),  # acme's job: the verdict is shared, the job is not
        ("job-globex", True),
        (None, False),
    ]
    assert {"id", "signature", "machine", "ratio", "region", "source"} <= set(page["items"][0])
    first = service.client.get(
        "/v1/verdicts", params={"page_size": 2}, headers=bearer(keys["acme"])
    ).json()
    assert len(first["items"]) == 2 and first["items"][0]["job_id"] == "job-acme"
    rest = service.client.get(
        "/v1/verdicts",
        params={"page_size": 2, "page_token": first["next_page_token"]},
        headers=bearer(keys["acme"]),
    ).json()
    assert [v["signature"] for v in rest["items"]] == [record(2)["signature"]]
    filtered = service.client.get(
        "/v1/verdicts", params={"source": "imported"}, headers=bearer(keys["acme"])
    )
    assert filtered.json()["total"] == 1
    other = {"source": "measured", "page_token": first["next_page_token"]}
    problem(
        service.client.get("/v1/verdicts", params=other, headers=bearer(keys["acme"])),
        400,
        "invalid-page-token",
    )
    body = problem(
        service.client.get(
            "/v1/verdicts", params={"signature": "nope"}, headers=bearer(keys["acme"])
        ),
        422,
        "invalid-request",
    )
    assert "signature" in body["detail"]


def test_the_export_is_a_verdicts_file_to_download(secured):
    service, keys = secured
    answer = service.client.get(
        "/v1/verdicts/export", params={"limit": 2}, headers=bearer(keys["acme"])
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-disposition"] == 'attachment; filename="verdicts.json"'
    document = answer.json()
    assert (document["format"], document["total"], len(document["verdicts"])) == (
        VERDICTS_FORMAT,
        3,
        2,
    )
    assert [v["job_id"] for v in document["verdicts"]] == ["job-acme", None]


def test_only_an_admin_imports_and_a_bad_file_is_a_422(secured, problem):
    service, keys = secured
    file = {"format": VERDICTS_FORMAT, "verdicts": [record(5), record(0), {"pattern": "x"}]}
    problem(service.client.post("/v1/verdicts/import", json=file), 401, "unauthorized")
    body = problem(
        service.client.post("/v1/verdicts/import", json=file, headers=bearer(keys["acme"])),
        403,
        "forbidden",
    )
    assert "'admin'" in body["detail"]
    admin = bearer(keys["admin"])
    answer = service.client.post("/v1/verdicts/import", json=file, headers=admin)
    assert answer.status_code == 200, answer.text
    counts = answer.json()
    # record(0) was stored by acme's job at the same moment: the same measurement
    assert (counts["imported"], counts["duplicates"]) == (1, 1)
    assert counts["skipped"] == ["verdict 2: signature must be 64 lowercase hex digits"]
    not_a_file = {"format": "something/2", "verdicts": []}
    body = problem(
        service.client.post("/v1/verdicts/import", json=not_a_file, headers=admin),
        422,
        "invalid-verdicts-file",
    )
    assert "autofusion verdicts export" in body["detail"]
    junk = {"format": VERDICTS_FORMAT, "verdicts": [{"signature": "0" * 64}]}
    body = problem(
        service.client.post("/v1/verdicts/import", json=junk, headers=admin),
        422,
        "invalid-verdicts-file",
    )
    assert "verdict 0: pattern_hash must be" in body["detail"]
    problem(
        service.client.post(
            "/v1/verdicts/import",
            content=b"{not json",
            headers={**admin, "Content-Type": "application/json"},
        ),
        422,
        "invalid-request",
    )


def test_unshared_verdicts_are_listed_to_their_own_tenant_only(make_service):
    service = make_service(require_api_keys=True, verdicts_shared=False)
    with service.db() as session:
        key = create_key(session, "globex", [])
        session.add_all([row(0, job_id="job-a", tenant_id="acme"), row(1, tenant_id="globex")])
    page = service.client.get("/v1/verdicts", headers=bearer(key)).json()
    assert [v["signature"] for v in page["items"]] == [record(1)["signature"]]
    exported = service.client.get("/v1/verdicts/export", headers=bearer(key)).json()
    assert exported["total"] == 1


# --- the CLI against live servers (no keys: the default tenant, every scope) ---


@pytest.fixture(scope="module")
def trusted(tmp_path_factory) -> Iterator[Server]:
    yield from started_server(tmp_path_factory, "trusted", "--no-embedded-worker")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Iterator[Server]:
    yield from started_server(tmp_path_factory, "fresh", "--no-embedded-worker")


def _database(server: Server) -> str:
    return f"sqlite:///{(server.log.parent / 'data' / 'autofusion.db').resolve()}"


def test_the_cli_exports_one_server_and_seeds_another(trusted, fresh, capsys, tmp_path):
    with session_scope(_database(trusted)) as session:
        session.add_all(
            [
                row(
                    n,
                    job_id=f"job-{n}",
                    tenant_id="default",
                    measured_at=NOW - timedelta(minutes=n),
                )
                for n in range(3)
            ]
            + [
                row(
                    3,
                    job_id="theirs",
                    tenant_id="globex",
                    pattern="gelu",
                    measured_at=NOW - timedelta(hours=1),
                )
            ]
        )
    exported = tmp_path / "verdicts.json"
    code, out, err = cli(capsys, "verdicts", "export", "-o", exported, "--server", trusted.url)
    assert code == EXIT_OK and "wrote 4 verdicts" in err, err
    code, out, err = cli(capsys, "verdicts", "import", exported, "--server", fresh.url)
    assert code == EXIT_OK, err
    assert "imported:   4" in out and "duplicates: 0" in out
    code, out, _ = cli(capsys, "verdicts", "import", exported, "--server", fresh.url, "--json")
    assert json.loads(out) == {"imported": 0, "duplicates": 4, "skipped": []}

    def listed(server: Server) -> list[dict]:
        with Client(server.url) as client:
            items = client.list_verdicts(page_size=200)["items"]
        return [{k: v for k, v in i.items() if k not in WHO} for i in items]

    assert listed(fresh) == listed(trusted)
    code, out, _ = cli(
        capsys, "verdicts", "list", "--pattern", "gelu", "--server", fresh.url, "--json"
    )
    assert code == EXIT_OK and [v["source"] for v in json.loads(out)] == ["imported"]
    code, out, _ = cli(capsys, "verdicts", "list", "--verdict", "faster", "--server", trusted.url)
    assert code == EXIT_OK and out.count("faster") == 4 and "(hidden)" in out and "job-0" in out


def test_the_cli_refuses_a_file_that_is_not_a_verdicts_file(fresh, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "nope", "verdicts": []}))
    code, _, err = cli(capsys, "verdicts", "import", bad, "--server", fresh.url)
    assert code == EXIT_BAD_INPUT and "not a verdicts file" in err, err
    bad.write_text("{")
    code, _, err = cli(capsys, "verdicts", "import", bad, "--server", fresh.url)
    assert code == EXIT_BAD_INPUT and "is not JSON" in err


def test_the_client_imports_a_big_file_in_parts(fresh, tmp_path):
    big = [record(100 + n, measured_at=NOW - timedelta(minutes=n)) for n in range(1100)]
    big[700] = {"pattern": "broken"}
    with Client(fresh.url) as client:
        counts = client.import_verdicts({"format": VERDICTS_FORMAT, "verdicts": big})
        assert (counts["imported"], counts["duplicates"]) == (1099, 0)
        assert counts["skipped"] == ["verdict 700: signature must be 64 lowercase hex digits"]
        page = client.list_verdicts(page_size=1, pattern="conv_bn_relu", source="imported")
        assert page["total"] >= 1099


def test_the_verdicts_command_is_light():
    code, modules = loaded_by("verdicts", "list", "--server", "http://127.0.0.1:9")
    assert code == 5
    assert sorted(m for m in HEAVY if m in modules) == []


def test_a_client_cannot_name_the_verdicts_file(service, tiny_model, problem):
    config = {"selection": "measured", "measure_options": {"verdicts_file": "/etc/passwd"}}
    body = problem(service.submit(tiny_model, config=config), 422, "invalid-config")
    assert "verdicts_file is the worker's" in body["detail"]
    assert service.job_count() == 0
