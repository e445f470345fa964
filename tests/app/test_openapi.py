"""``docs/openapi.json`` (the published contract) matches what the app serves."""

from __future__ import annotations

import json
import re

from autofusion.app.openapi_dump import DEFAULT_PATH, openapi_document


def test_the_committed_openapi_document_is_up_to_date():
    committed = json.loads(DEFAULT_PATH.read_text(encoding="utf-8"))
    assert committed == openapi_document(), (
        "docs/openapi.json is out of date: "
        "run `python -m autofusion.app.openapi_dump` and commit it"
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


PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
WRITES = {
    ("post", "/v1/optimize"): "jobs:write",
    ("post", "/v1/jobs/{job_id}/cancel"): "jobs:write",
    ("delete", "/v1/jobs/{job_id}"): "jobs:write",
    # A data upload is the start of a job (issue 29).
    ("post", "/v1/uploads"): "jobs:write",
    ("patch", "/v1/uploads/{upload_id}"): "jobs:write",
    ("delete", "/v1/uploads/{upload_id}"): "jobs:write",
    ("post", "/v1/patterns"): "patterns:write",
    ("put", "/v1/patterns/{name}"): "patterns:write",
    ("delete", "/v1/patterns/{name}"): "patterns:write",
    ("post", "/v1/patterns/{name}/enable"): "patterns:write",
    ("post", "/v1/patterns/{name}/disable"): "patterns:write",
    ("post", "/v1/strategies"): "patterns:write",
    ("put", "/v1/strategies/{name}"): "patterns:write",
    ("post", "/v1/patterns/{name}/rules"): "patterns:write",
    ("delete", "/v1/patterns/{name}/rules/{machine_key}"): "patterns:write",
    ("get", "/metrics"): "metrics:read",
    # The tenant's webhook settings hold its signing secret.
    ("get", "/v1/webhooks"): "jobs:write",
    ("put", "/v1/webhooks"): "jobs:write",
    ("post", "/v1/webhooks/secret"): "jobs:write",
    # An import adds to what every tenant's jobs reuse (issue 28).
    ("post", "/v1/verdicts/import"): "admin",
}


def _operations(document):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield method, path, operation


def test_every_error_is_a_problem_and_fastapis_validation_error_is_gone():
    document = openapi_document()
    assert "HTTPValidationError" not in json.dumps(document)
    assert document["components"]["schemas"]["Problem"]["required"] == [
        "type",
        "title",
        "status",
        "detail",
    ]
    for method, path, operation in _operations(document):
        responses = operation["responses"]
        assert "500" in responses, (method, path)  # the catch-all answers anywhere
        for status, response in responses.items():
            if int(status) >= 400:
                assert response["content"] == {"application/problem+json": {"schema": PROBLEM_REF}}
                assert response["description"], (method, path, status)


def test_security_is_the_two_ways_a_key_is_sent_and_names_the_scope():
    document = openapi_document()
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKeyAuth"]["in"] == "header" and schemes["apiKeyAuth"]["name"] == "X-API-Key"
    for method, path, operation in _operations(document):
        names = {p["name"].lower() for p in operation.get("parameters", [])}
        assert not names & {"authorization", "x-api-key"}, (method, path)  # schemes, not params
        if path in ("/healthz", "/readyz"):
            assert "security" not in operation and "401" not in operation["responses"]
            continue
        scope = WRITES.get((method, path))
        expected = [
            {"bearerAuth": [scope] if scope else []},
            {"apiKeyAuth": [scope] if scope else []},
        ]
        assert operation["security"] == expected, (method, path)
        assert "WWW-Authenticate" in operation["responses"]["401"]["headers"]
        assert ("403" in operation["responses"]) == bool(scope), (method, path)
        if "requestBody" in operation:
            assert {"408", "413", "422"} <= set(operation["responses"]), (method, path)


def test_the_headers_a_client_relies_on_are_declared():
    paths = openapi_document()["paths"]
    accepted = paths["/v1/optimize"]["post"]["responses"]["202"]["headers"]
    assert {name for name, h in accepted.items() if h["required"]} == {
        "Location",
        "Retry-After",
        "ETag",
        "Cache-Control",
    }
    assert accepted["Retry-After"]["schema"]["type"] == "integer"
    polled = paths["/v1/jobs/{job_id}"]["get"]["responses"]
    assert polled["200"]["headers"]["Retry-After"]["required"] is False  # not once final
    assert "ETag" in polled["304"]["headers"]
    for suffix in ("model", "report", "artifacts/{name}"):
        for method in ("get", "head"):
            sent = paths[f"/v1/jobs/{{job_id}}/{suffix}"][method]["responses"]
            assert {"ETag", "Repr-Digest", "Content-Disposition"} <= set(sent["200"]["headers"])
            assert "ETag" in sent["304"]["headers"]
    assert "content" not in paths["/v1/jobs/{job_id}/model"]["head"]["responses"]["200"]
    created = paths["/v1/patterns"]["post"]["responses"]["201"]["headers"]
    assert created["Location"]["required"] and created["ETag"]["required"]


def test_every_link_names_an_operation_and_its_parameters():
    document = openapi_document()
    by_id = {op["operationId"]: op for _, _, op in _operations(document)}
    links = 0
    for method, path, operation in _operations(document):
        for status, response in operation["responses"].items():
            for name, link in response.get("links", {}).items():
                links += 1
                target = by_id[link["operationId"]]
                declared = {f"{p['in']}.{p['name'].lower()}" for p in target.get("parameters", [])}
                for parameter in link["parameters"]:
                    qualified = parameter.lower() if "." in parameter else f"path.{parameter}"
                    assert qualified in declared, (method, path, status, name, parameter)
    paths = document["paths"]
    get_job = paths["/v1/optimize"]["post"]["responses"]["202"]["links"]["GetJob"]
    assert get_job == {
        "operationId": paths["/v1/jobs/{job_id}"]["get"]["operationId"],
        "parameters": {"job_id": "$response.body#/id"},
    }
    assert links >= 20


# Operation ids a generated client reads as method names: lower camelCase, a verb first.
_OPERATION_ID = re.compile(r"^[a-z]+(?:[A-Z][a-z0-9]*)*$")
# The published names: a client generated from them breaks when one changes, so each
# stays as it is whatever the Python function is called (issue 27).
PUBLISHED_OPERATION_IDS = {
    ("get", "/healthz"): "getHealth",
    ("get", "/readyz"): "getReadiness",
    ("get", "/metrics"): "getMetrics",
    ("post", "/v1/optimize"): "optimize",
    ("get", "/v1/jobs"): "listJobs",
    ("get", "/v1/jobs/{job_id}"): "getJob",
    ("delete", "/v1/jobs/{job_id}"): "deleteJob",
    ("post", "/v1/jobs/{job_id}/cancel"): "cancelJob",
    ("get", "/v1/jobs/{job_id}/events"): "followJob",
    ("get", "/v1/jobs/{job_id}/model"): "downloadJobModel",
    ("head", "/v1/jobs/{job_id}/model"): "headJobModel",
    ("get", "/v1/jobs/{job_id}/report"): "downloadJobReport",
    ("head", "/v1/jobs/{job_id}/report"): "headJobReport",
    ("get", "/v1/jobs/{job_id}/artifacts/{name}"): "downloadJobArtifact",
    ("head", "/v1/jobs/{job_id}/artifacts/{name}"): "headJobArtifact",
    ("get", "/v1/patterns"): "listPatterns",
    ("post", "/v1/patterns"): "createPattern",
    ("get", "/v1/patterns/{name}"): "getPattern",
    ("put", "/v1/patterns/{name}"): "replacePattern",
    ("delete", "/v1/patterns/{name}"): "deletePattern",
    ("post", "/v1/patterns/{name}/enable"): "enablePattern",
    ("post", "/v1/patterns/{name}/disable"): "disablePattern",
    ("get", "/v1/patterns/{name}/versions"): "listPatternVersions",
    ("get", "/v1/patterns/{name}/versions/{version}"): "getPatternVersion",
    ("post", "/v1/patterns/{name}/test"): "testPattern",
    ("get", "/v1/strategies"): "listStrategies",
    ("post", "/v1/strategies"): "createStrategy",
    ("get", "/v1/strategies/{name}"): "getStrategy",
    ("put", "/v1/strategies/{name}"): "replaceStrategy",
    ("get", "/v1/strategies/{name}/versions"): "listStrategyVersions",
    ("get", "/v1/info"): "getServerInfo",
    ("get", "/v1/verdicts"): "listVerdicts",
    ("get", "/v1/verdicts/export"): "exportVerdicts",
    ("post", "/v1/verdicts/import"): "importVerdicts",
    ("get", "/v1/patterns/{name}/verdicts"): "getPatternVerdicts",
    ("get", "/v1/pattern-rules"): "listPatternRules",
    ("post", "/v1/patterns/{name}/rules"): "disablePatternOnClass",
    ("delete", "/v1/patterns/{name}/rules/{machine_key}"): "enablePatternOnClass",
}


def test_every_operation_has_an_explicit_stable_unique_id(tmp_path):
    from fastapi.routing import APIRoute
    from fastapi.utils import generate_unique_id

    from autofusion.app.core.config import Settings
    from autofusion.app.main import create_app

    # Set on the route itself, so renaming its function cannot change the contract.
    app = create_app(Settings(data_dir=tmp_path))
    for route in app.routes:
        if isinstance(route, APIRoute) and route.include_in_schema:
            assert route.operation_id, f"{sorted(route.methods)} {route.path}: no operation_id"
            assert route.operation_id != generate_unique_id(route), route.path
    ids = {
        (method, path): op["operationId"] for method, path, op in _operations(openapi_document())
    }
    assert len(set(ids.values())) == len(ids), "operation ids must be unique"
    for key, operation_id in ids.items():
        assert _OPERATION_ID.match(operation_id), (key, operation_id)
    published = {key: ids.get(key) for key in PUBLISHED_OPERATION_IDS}
    assert published == PUBLISHED_OPERATION_IDS


def test_found_by_schemathesis_undecodable_json_and_a_required_if_match():
    for method, path, operation in _operations(openapi_document()):
        body = operation.get("requestBody", {}).get("content", {})
        if "application/json" in body:
            assert "400" in operation["responses"], (method, path)
        if_match = [p for p in operation.get("parameters", []) if p["name"] == "if-match"]
        if "428" in operation["responses"]:  # PUT and DELETE: 428 without If-Match
            assert if_match and if_match[0]["required"] is True, (method, path)
        elif if_match:  # enable/disable: honoured, not required
            assert if_match[0]["required"] is False, (method, path)


def test_docs_load_everything_from_this_server(service, problem):
    """/docs names no other host: it works offline (tests/browser/test_docs_page.py renders it)."""
    html = service.client.get("/docs")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
    assert "/openapi.json" in urls, html.text
    assert all(url.startswith("/") for url in urls), urls  # this server only
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        url = f"/docs/assets/{asset}"
        assert url in urls, urls
        got = service.client.get(url)
        assert got.status_code == 200 and len(got.content) > 10_000, url
    # ReDoc is not offered: its page fetches its logo from its CDN.
    problem(service.client.get("/redoc"), 404, "not-found")
