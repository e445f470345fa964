"""docs/service.md documents every route and every header of the contract (issue 18):
both lists are read from the app itself, so a new route or header without its
paragraph fails here."""

from __future__ import annotations

from pathlib import Path

from autofusion.app.core.config import Settings
from autofusion.app.main import create_app

SERVICE_DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def _app(tmp_path: Path):
    return create_app(Settings(data_dir=tmp_path, embedded_worker=False))


def test_every_route_is_in_the_service_docs(tmp_path):
    doc = SERVICE_DOC.read_text()
    paths = {route.path for route in _app(tmp_path).routes if hasattr(route, "methods")}
    # /ui pages are the dashboard's, described by page in the dashboard section.
    missing = sorted(p for p in paths if not p.startswith("/ui") and f"`{p}" not in doc)
    assert not missing, f"routes docs/service.md does not name (in backquotes): {missing}"


def _openapi_headers(document: dict) -> set[str]:
    headers = set()
    for operations in document["paths"].values():
        for operation in operations.values():
            headers |= {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
            for response in operation.get("responses", {}).values():
                headers |= set(response.get("headers", {}))
    return headers


def test_every_header_of_the_contract_is_in_the_service_docs(tmp_path):
    doc = SERVICE_DOC.read_text().lower()
    headers = _openapi_headers(_app(tmp_path).openapi())
    assert {"ETag", "Location", "Retry-After"} <= headers  # the walk reads real headers
    missing = sorted(h for h in headers if h.lower() not in doc)
    assert not missing, f"headers docs/service.md does not name: {missing}"
