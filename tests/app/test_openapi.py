"""``docs/openapi.json`` (the published contract) matches what the app serves."""

from __future__ import annotations

import json

from app.openapi_dump import DEFAULT_PATH, openapi_document


def test_the_committed_openapi_document_is_up_to_date():
    committed = json.loads(DEFAULT_PATH.read_text(encoding="utf-8"))
    assert committed == openapi_document(), (
        "docs/openapi.json is out of date: run `python -m app.openapi_dump` and commit it"
    )


def test_the_job_routes_are_in_the_contract():
    document = openapi_document()
    paths = document["paths"]
    for path in ("/v1/optimize", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events"):
        assert path in paths, path
    body = paths["/v1/optimize"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert body["schema"]["required"] == ["model"]
    assert "202" in paths["/v1/optimize"]["post"]["responses"]
    assert "JobPublic" in document["components"]["schemas"]
    json.dumps(document)  # serializable as is
