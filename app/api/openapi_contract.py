"""The published OpenAPI document: what FastAPI cannot derive from the routes alone.

``install_openapi(app)`` makes ``app.openapi()`` (``/openapi.json``, ``/docs``,
``docs/openapi.json``) say what the server really sends:

- Errors: every error is ``application/problem+json`` (``#/components/schemas/Problem``).
  FastAPI's default ``422 HTTPValidationError`` is replaced by it, and the statuses that
  come from shared mechanisms rather than from a route are added where they apply: 401
  wherever a key is checked (with ``WWW-Authenticate``), 403 where the key needs a scope
  (the scope is named in the operation's security requirement), 408 and 413 wherever a
  body is read (``app/api/limits.py``; 400 too for a JSON body that does not decode),
  503 (``Retry-After``) wherever the database is read, 500 everywhere
  (``CatchAllProblems``). Route-specific statuses stay in the routes' ``responses=``;
  where one is 428, its ``If-Match`` header is declared required.
- Security: the schemes come from ``app/api/deps.py`` (``Authorization: Bearer`` and
  ``X-API-Key``), per operation, as FastAPI derives them.
- Response headers (``Location``, ``ETag``, ``Retry-After``, ``Repr-Digest``, ...) and
  links (``POST /v1/optimize``'s 202 to ``GET /v1/jobs/{job_id}`` and the rest): the
  tables below, in one place. The schemathesis run (tests/app/test_schemathesis.py)
  checks every required header against a live server.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI

from autofusion.app.api.problems import MEDIA_TYPE, PROBLEM_SCHEMA

__all__ = ["HEADERS", "LINKS", "SENT_HEADERS", "install_openapi", "publish"]

_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def _header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


# Each header the API sends, described once (inlined where sent: a $ref could not say
# whether it is required there).
HEADERS: dict[str, dict[str, Any]] = {
    "Location": _header("The new resource's path."),
    "ETag": _header(
        "The resource's version: a job's revision (\"3\"), a pattern's or strategy's "
        '"<name>@<version>", a download\'s sha256. Send it back in If-None-Match (304 '
        "while unchanged) or If-Match (a change of what you read)."
    ),
    "Retry-After": _header(
        "Seconds to wait before the next poll or retry.", {"type": "integer", "minimum": 0}
    ),
    "Cache-Control": _header("no-cache (a job) or private, no-cache (a download)."),
    "Idempotent-Replayed": _header(
        "true: the Idempotency-Key was seen before; this is the job that request created.",
        {"type": "string", "enum": ["true"]},
    ),
    "Repr-Digest": _header(
        "RFC 9530: the sha-256 of the whole file, base64 (sha-256=:...:), the same as its ETag.",
        {"type": "string", "pattern": "^sha-256=:[A-Za-z0-9+/]+=*:$"},
    ),
    "Last-Modified": _header("When the job finished, and so when its files were written."),
    "Content-Disposition": _header("attachment, with the suggested file name."),
    "Accept-Ranges": _header("bytes: the model can be fetched in parts (Range, If-Range)."),
    "Content-Security-Policy": _header("The stored renderings' own policy: no scripts."),
    "WWW-Authenticate": _header('Bearer realm="autofusion": send the key as a Bearer token.'),
}

# Response headers by operation and status; a trailing "?" marks one not always sent.
_DOWNLOAD = ("ETag", "Repr-Digest", "Last-Modified", "Cache-Control", "Content-Disposition")
_NOT_MODIFIED = ("ETag", "Cache-Control", "Last-Modified")
_DOWNLOADS = {
    "/v1/jobs/{job_id}/model": (*_DOWNLOAD, "Accept-Ranges"),
    "/v1/jobs/{job_id}/model/data/{name}": (*_DOWNLOAD, "Accept-Ranges"),
    "/v1/jobs/{job_id}/report": _DOWNLOAD,
    "/v1/jobs/{job_id}/artifacts/{name}": (*_DOWNLOAD, "Content-Security-Policy"),
}
SENT_HEADERS: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {
    ("post", "/v1/optimize"): {
        "202": ("Location", "Retry-After", "ETag", "Cache-Control", "Idempotent-Replayed?")
    },
    ("get", "/v1/jobs/{job_id}"): {
        "200": ("ETag", "Cache-Control", "Retry-After?"),
        "304": ("ETag", "Cache-Control", "Retry-After?"),
    },
    ("post", "/v1/jobs/{job_id}/cancel"): {"202": ("ETag",)},
    ("get", "/v1/jobs/{job_id}/events"): {"200": ("Cache-Control",)},
    **{
        (method, path): {"200": headers, "304": _NOT_MODIFIED}
        for path, headers in _DOWNLOADS.items()
        for method in ("get", "head")
    },
    ("post", "/v1/patterns"): {"201": ("Location", "ETag")},
    ("get", "/v1/patterns/{name}"): {"200": ("ETag",)},
    ("put", "/v1/patterns/{name}"): {"200": ("ETag",)},
    ("post", "/v1/patterns/{name}/enable"): {"200": ("ETag",)},
    ("post", "/v1/patterns/{name}/disable"): {"200": ("ETag",)},
    ("post", "/v1/strategies"): {"201": ("Location", "ETag")},
    ("get", "/v1/strategies/{name}"): {"200": ("ETag",)},
    ("put", "/v1/strategies/{name}"): {"200": ("ETag",)},
}


def _links(
    parameters: dict[str, str], targets: dict[str, tuple[str, str]]
) -> dict[str, tuple[tuple[str, str], dict[str, str]]]:
    return {name: (target, parameters) for name, target in targets.items()}


_JOB = {
    "GetJob": ("get", "/v1/jobs/{job_id}"),
    "FollowJob": ("get", "/v1/jobs/{job_id}/events"),
    "CancelJob": ("post", "/v1/jobs/{job_id}/cancel"),
    "DeleteJob": ("delete", "/v1/jobs/{job_id}"),
    "DownloadModel": ("get", "/v1/jobs/{job_id}/model"),
    "DownloadReport": ("get", "/v1/jobs/{job_id}/report"),
}
_PATTERN_READS = {
    "GetPattern": ("get", "/v1/patterns/{name}"),
    "ListPatternVersions": ("get", "/v1/patterns/{name}/versions"),
}
_PATTERN_CHANGES = {
    "ReplacePattern": ("put", "/v1/patterns/{name}"),
    "DeletePattern": ("delete", "/v1/patterns/{name}"),
    "DisablePattern": ("post", "/v1/patterns/{name}/disable"),
    "EnablePattern": ("post", "/v1/patterns/{name}/enable"),
}
_STRATEGY_READS = {
    "GetStrategy": ("get", "/v1/strategies/{name}"),
    "ListStrategyVersions": ("get", "/v1/strategies/{name}/versions"),
}
_STRATEGY_CHANGES = {"ReplaceStrategy": ("put", "/v1/strategies/{name}")}
_BY_ID = {"job_id": "$response.body#/id"}
_BY_NAME = {"name": "$response.body#/name"}
# A change of what was just read names its version: If-Match is the ETag it came with.
_CHANGE = {**_BY_NAME, "header.If-Match": "$response.header.ETag"}

# Links by operation and status: name -> ((method, path) of the target, its parameters).
LINKS: dict[tuple[str, str], dict[str, dict[str, tuple[tuple[str, str], dict[str, str]]]]] = {
    ("post", "/v1/optimize"): {"202": _links(_BY_ID, _JOB)},
    ("get", "/v1/jobs/{job_id}"): {"200": _links(_BY_ID, _JOB)},
    ("post", "/v1/patterns"): {
        "201": {**_links(_BY_NAME, _PATTERN_READS), **_links(_CHANGE, _PATTERN_CHANGES)}
    },
    ("get", "/v1/patterns/{name}"): {"200": _links(_CHANGE, _PATTERN_CHANGES)},
    ("post", "/v1/strategies"): {
        "201": {**_links(_BY_NAME, _STRATEGY_READS), **_links(_CHANGE, _STRATEGY_CHANGES)}
    },
    ("get", "/v1/strategies/{name}"): {"200": _links(_CHANGE, _STRATEGY_CHANGES)},
}

# The statuses shared mechanisms answer, described once.
_SHARED = {
    "400": "The request body cannot be read as JSON.",
    "401": "No valid API key: none sent to a server that requires one, or an unknown or "
    "revoked one (WWW-Authenticate names the scheme).",
    "403": "The key lacks the scope this operation needs (named in its security).",
    "408": "The request body did not arrive in time (body_* settings).",
    "413": "The request body is over this endpoint's size limit.",
    "422": "Invalid request: errors names each field that was wrong.",
    "500": "Internal error: the server's log has the error_id.",
    "503": "The service cannot do this right now (its database cannot be reached); retry "
    "after Retry-After.",
}
_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
# 507: Retry-After when retention will free room (app/services/quotas.py).
_STATUS_HEADERS = {
    "401": ("WWW-Authenticate",),
    "429": ("Retry-After",),
    "503": ("Retry-After?",),
    "507": ("Retry-After?",),
}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` return the published document (built once, then cached)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = publish(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def publish(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (FastAPI's) as the contract: problems, headers, links. In place."""
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Problem"] = copy.deepcopy(PROBLEM_SCHEMA)
    operation_ids = {key: op["operationId"] for key, op in _operations(document)}
    for key, operation in _operations(document):
        responses = operation["responses"]
        for status in _shared_statuses(operation):
            _declare_problem(responses, status)
        for response in responses.values():  # the routes' own problems, by reference
            if MEDIA_TYPE in response.get("content", {}):
                response["content"][MEDIA_TYPE] = {"schema": dict(_PROBLEM_REF)}
        if "428" in responses:  # the route answers 428 without If-Match: it is required
            _require_header(operation, "if-match")
        for status, names in _STATUS_HEADERS.items():
            if status in responses:
                _add_headers(responses[status], names)
        for status, names in SENT_HEADERS.get(key, {}).items():
            _add_headers(responses[status], names)
        for status, links in LINKS.get(key, {}).items():
            responses[status]["links"] = {
                name: {"operationId": operation_ids[target], "parameters": dict(parameters)}
                for name, (target, parameters) in links.items()
            }
        operation["responses"] = dict(sorted(responses.items()))
    return document


def _operations(document: dict[str, Any]) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    for path, item in document.get("paths", {}).items():
        for method, operation in item.items():
            if method in _METHODS:
                yield (method, path), operation


def _shared_statuses(operation: dict[str, Any]) -> list[str]:
    """The statuses the shared mechanisms can answer to this operation."""
    statuses = ["500"]
    security = operation.get("security") or []
    if security:  # a key is checked, against the database
        statuses += ["401", "503"]
        if any(scopes for requirement in security for scopes in requirement.values()):
            statuses.append("403")
    if "requestBody" in operation:
        statuses += ["408", "413", "422"]
        if "application/json" in operation["requestBody"].get("content", {}):
            statuses.append("400")  # FastAPI: a body that does not decode
    if "422" in operation["responses"]:  # FastAPI's: the route validates parameters
        statuses.append("422")
    return statuses


def _declare_problem(responses: dict[str, Any], status: str) -> None:
    """``status`` answers a Problem; a route's own description of it is kept."""
    response = responses.setdefault(status, {})
    phrase = HTTPStatus(int(status)).phrase
    if response.get("description") in (None, "", phrase, "Validation Error"):
        response["description"] = _SHARED.get(status, phrase)
    response["content"] = {MEDIA_TYPE: {"schema": dict(_PROBLEM_REF)}}


def _require_header(operation: dict[str, Any], name: str) -> None:
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "header" and parameter["name"].lower() == name:
            parameter["required"] = True
            parameter["schema"] = {"type": "string"}  # not "string or null" any more


def _add_headers(response: dict[str, Any], names: tuple[str, ...]) -> None:
    headers = response.setdefault("headers", {})
    for name in names:
        optional = name.endswith("?")
        name = name.removesuffix("?")
        headers[name] = {**copy.deepcopy(HEADERS[name]), "required": not optional}
