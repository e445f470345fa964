"""The pattern registry API: CRUD with ETags, immutable versions, snapshots, auth, and
trying one pattern on an uploaded model (``/test``) without creating a job.

Every test runs the real app (migrations, seeding) on SQLite in ``tmp_path``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from fastapi.testclient import TestClient

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.main import create_app
from autofusion.app.services.auth import create_key
from autofusion.app.services.registry import snapshot
from autofusion.fusion_core.catalog import builtin_pattern_data

BUILTINS = len(builtin_pattern_data())

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"
PROBLEM = "application/problem+json"
BASE = "https://autofusion.dev/problems/"

CONV_RELU = {
    "name": "acme.conv_relu",
    "description": "A Relu after a Conv, as one fused op.",
    "priority": 5,
    "targets": ["generic", "onnxruntime"],
    "nodes": [
        {"id": "conv", "op": "Conv"},
        {"id": "act", "op": "Relu", "inputs": {"0": "conv"}},
    ],
    "constraints": [{"kind": "attr", "node": "conv", "name": "group", "eq": 1}],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.acme"}},
}
# conv_bn with a constraint no ResNet conv satisfies: every place is a near miss.
GROUPED_CONV_BN = {
    "name": "acme.grouped.conv_bn",
    "nodes": [
        {"id": "conv", "op": "Conv"},
        {"id": "bn", "op": "BatchNormalization", "inputs": {"0": "conv"}},
    ],
    "constraints": [{"kind": "attr", "node": "conv", "name": "group", "eq": 2}],
    "rewriter": {"name": "fused_region"},
}
TINY_CONV = """\
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[1, 2, 4, 4] x) => (float[1, 2, 4, 4] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    y = Relu (c)
}
"""


def make_client(tmp_path: Path, **options) -> TestClient:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False, **options)
    return TestClient(create_app(settings))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as c:
        yield c


def settings_of(client: TestClient) -> Settings:
    return client.app.state.settings


def registry_version(client: TestClient) -> int:
    return client.get("/v1/patterns").json()["registry_version"]


def create(client: TestClient, spec: dict, **headers: str):
    response = client.post("/v1/patterns", json=spec, headers=headers)
    assert response.status_code == 201, response.text
    return response


# If-Match for a change that overwrites whatever version is there (required on PUT, DELETE).
ANY = {"If-Match": "*"}


def assert_problem(response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["type"] == BASE + slug
    assert body["status"] == status
    assert body["detail"]
    return body


def versions(client: TestClient, name: str) -> list[tuple[int, str, bool]]:
    response = client.get(f"/v1/patterns/{name}/versions")
    assert response.status_code == 200, response.text
    return [(v["version"], v["change"], v["enabled"]) for v in response.json()["data"]]


def upload(client: TestClient, name: str, content: bytes, **options):
    files = {"model": ("model.onnx", content, "application/octet-stream")}
    return client.post(f"/v1/patterns/{name}/test", files=files, **options)


# --- listing and reading --------------------------------------------------------------


def test_builtins_are_listed_after_start(client):
    body = client.get("/v1/patterns").json()
    builtin_names = sorted(raw["name"] for raw in builtin_pattern_data())
    assert body["count"] == len(body["data"]) == BUILTINS
    assert [p["name"] for p in body["data"]] == builtin_names
    assert all(p["builtin"] and p["enabled"] and p["version"] == 1 for p in body["data"])
    assert body["registry_version"] >= 1
    conv_bn = next(p for p in body["data"] if p["name"] == "conv_bn")
    assert conv_bn["rewriter"] == "fold_batchnorm"
    assert conv_bn["targets"] == ["generic", "onnxruntime"]
    assert conv_bn["priority"] == 20
    assert conv_bn["description"].startswith("BatchNormalization after a Conv")


def test_get_pattern_has_spec_and_etag(client):
    response = client.get("/v1/patterns/conv_bn")
    assert response.status_code == 200
    assert response.headers["etag"] == '"conv_bn@1"'
    body = response.json()
    assert body["spec"]["rewriter"]["name"] == "fold_batchnorm"
    assert (body["version"], body["enabled"], body["builtin"]) == (1, True, True)
    assert body["updated_at"].endswith("Z")  # UTC, also from SQLite


def test_unknown_pattern_is_a_404_problem(client):
    for response in (
        client.get("/v1/patterns/nope"),
        client.put("/v1/patterns/nope", json=CONV_RELU),
        client.delete("/v1/patterns/nope"),
        client.post("/v1/patterns/nope/disable"),
        client.get("/v1/patterns/nope/versions"),
    ):
        assert_problem(response, 404, "pattern-not-found")


# --- create ---------------------------------------------------------------------------


def test_create_valid_pattern(client):
    before = registry_version(client)
    response = create(client, CONV_RELU)
    assert response.headers["etag"] == '"acme.conv_relu@1"'
    assert response.headers["location"] == "/v1/patterns/acme.conv_relu"
    body = response.json()
    assert (body["name"], body["version"], body["enabled"], body["builtin"]) == (
        "acme.conv_relu",
        1,
        True,
        False,
    )
    assert body["spec"] == CONV_RELU
    assert registry_version(client) == before + 1
    listed = {p["name"]: p for p in client.get("/v1/patterns").json()["data"]}
    assert listed["acme.conv_relu"]["rewriter"] == "fused_region"
    assert listed["acme.conv_relu"]["priority"] == 5
    assert client.get(response.headers["location"]).json()["spec"] == CONV_RELU


def test_listing_fills_in_the_spec_defaults(client):
    minimal = {key: CONV_RELU[key] for key in ("name", "nodes", "rewriter")}
    create(client, minimal)
    listed = {p["name"]: p for p in client.get("/v1/patterns").json()["data"]}
    row = listed["acme.conv_relu"]
    assert (row["description"], row["priority"], row["targets"]) == (
        "",
        0,
        ["generic", "onnxruntime"],
    )


def _with(**changes) -> dict:
    spec = copy.deepcopy(CONV_RELU)
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        pytest.param(
            _with(nodes=[{"id": "conv", "op": "Convv"}]),
            "nodes.0.op",
            "Convv",
            id="unknown-op-type",
        ),
        pytest.param(
            _with(rewriter={"name": "fold_bn"}),
            "rewriter.name",
            "unknown rewriter 'fold_bn'",
            id="unknown-rewriter",
        ),
        pytest.param(
            _with(constraints=[{"kind": "magic", "node": "conv"}]),
            "constraints.0",
            "magic",
            id="unknown-constraint-kind",
        ),
        pytest.param(
            _with(constraints=[{"kind": "attr", "node": "nope", "name": "group", "eq": 1}]),
            "constraints.0",
            "names no node",
            id="constraint-names-no-node",
        ),
        pytest.param(
            _with(rewriter={"name": "fold_batchnorm", "params": {"producer_node": "cnv"}}),
            "rewriter.params.producer_node",
            "cnv",
            id="rewriter-param-names-no-node",
        ),
        pytest.param(_with(name="bad name"), "name", "not a pattern name", id="bad-name"),
        pytest.param(
            _with(
                nodes=[
                    {"id": "conv", "op": "Conv"},
                    {
                        "id": "act",
                        "op": "Relu",
                        "inputs": {"0": "conv"},
                        "optional": "act",
                        "through": 1,
                    },
                ]
            ),
            "nodes.1.through",
            "has no input 1",
            id="optional-node-passes-on-no-input",
        ),  # fmt: skip
    ],
)
def test_invalid_spec_is_rejected_naming_the_field(client, spec, field, message):
    before = registry_version(client)
    body = assert_problem(client.post("/v1/patterns", json=spec), 422, "invalid-pattern")
    matching = [e for e in body["errors"] if e["field"] == field]
    assert matching, body["errors"]
    assert message in matching[0]["message"]
    assert registry_version(client) == before
    assert client.get("/v1/patterns").json()["count"] == BUILTINS


def test_body_that_is_not_an_object_is_rejected(client):
    assert_problem(client.post("/v1/patterns", json=[CONV_RELU]), 422, "invalid-request")


def test_duplicate_name_is_a_conflict(client):
    create(client, CONV_RELU)
    assert_problem(client.post("/v1/patterns", json=CONV_RELU), 409, "pattern-exists")
    assert_problem(client.post("/v1/patterns", json=_with(name="conv_bn")), 409, "pattern-exists")


# --- update, enable/disable, delete, history --------------------------------------------


def test_put_with_if_match(client):
    etag = create(client, CONV_RELU).headers["etag"]
    changed = _with(priority=50)
    response = client.put("/v1/patterns/acme.conv_relu", json=changed, headers={"If-Match": etag})
    assert response.status_code == 200, response.text
    assert response.headers["etag"] == '"acme.conv_relu@2"'
    assert response.json()["version"] == 2
    assert response.json()["spec"]["priority"] == 50

    stale = client.put("/v1/patterns/acme.conv_relu", json=CONV_RELU, headers={"If-Match": etag})
    body = assert_problem(stale, 412, "precondition-failed")
    assert '"acme.conv_relu@2"' in body["detail"]
    assert client.get("/v1/patterns/acme.conv_relu").json()["spec"]["priority"] == 50
    assert versions(client, "acme.conv_relu") == [(1, "create", True), (2, "update", True)]


def test_put_if_match_accepts_star_and_lists(client):
    create(client, CONV_RELU)
    url = "/v1/patterns/acme.conv_relu"
    assert client.put(url, json=CONV_RELU, headers={"If-Match": "*"}).json()["version"] == 2
    listed = 'W/"x", "acme.conv_relu@2", "other@1"'
    assert client.put(url, json=CONV_RELU, headers={"If-Match": listed}).json()["version"] == 3
    weak = client.put(url, json=CONV_RELU, headers={"If-Match": 'W/"acme.conv_relu@3"'})
    assert_problem(weak, 412, "precondition-failed")  # If-Match compares strongly


def test_put_rejects_invalid_spec_and_name_mismatch(client):
    create(client, CONV_RELU)
    invalid = client.put(
        "/v1/patterns/acme.conv_relu", json=_with(rewriter={"name": "nope"}), headers=ANY
    )
    assert assert_problem(invalid, 422, "invalid-pattern")["errors"][0]["field"] == "rewriter.name"
    other = client.put("/v1/patterns/acme.conv_relu", json=_with(name="acme.other"), headers=ANY)
    assert_problem(other, 422, "pattern-name-mismatch")
    assert versions(client, "acme.conv_relu") == [(1, "create", True)]


def test_disable_and_enable_make_new_versions(client):
    create(client, CONV_RELU)
    disabled = client.post("/v1/patterns/acme.conv_relu/disable")
    assert disabled.status_code == 200
    assert (disabled.json()["enabled"], disabled.json()["version"]) == (False, 2)
    assert disabled.headers["etag"] == '"acme.conv_relu@2"'
    listed = {p["name"]: p for p in client.get("/v1/patterns").json()["data"]}
    assert listed["acme.conv_relu"]["enabled"] is False  # listed, but off

    # Disabling a disabled pattern changes nothing.
    before = registry_version(client)
    assert client.post("/v1/patterns/acme.conv_relu/disable").json()["version"] == 2
    assert registry_version(client) == before

    stale = client.post("/v1/patterns/acme.conv_relu/enable", headers={"If-Match": '"x@1"'})
    assert_problem(stale, 412, "precondition-failed")
    enabled = client.post(
        "/v1/patterns/acme.conv_relu/enable", headers={"If-Match": '"acme.conv_relu@2"'}
    )
    assert (enabled.json()["enabled"], enabled.json()["version"]) == (True, 3)
    assert versions(client, "acme.conv_relu") == [
        (1, "create", True),
        (2, "disable", False),
        (3, "enable", True),
    ]


def test_delete_then_404_and_history_remains(client):
    create(client, CONV_RELU)
    client.post("/v1/patterns/acme.conv_relu/disable")
    stale = client.delete("/v1/patterns/acme.conv_relu", headers={"If-Match": '"acme.conv_relu@1"'})
    assert_problem(stale, 412, "precondition-failed")

    response = client.delete(
        "/v1/patterns/acme.conv_relu", headers={"If-Match": '"acme.conv_relu@2"'}
    )
    assert response.status_code == 204
    assert response.content == b""
    assert_problem(client.get("/v1/patterns/acme.conv_relu"), 404, "pattern-not-found")
    assert_problem(client.delete("/v1/patterns/acme.conv_relu"), 404, "pattern-not-found")
    assert "acme.conv_relu" not in [p["name"] for p in client.get("/v1/patterns").json()["data"]]
    assert versions(client, "acme.conv_relu") == [
        (1, "create", True),
        (2, "disable", False),
        (3, "delete", False),
    ]
    old = client.get("/v1/patterns/acme.conv_relu/versions/1")
    assert old.status_code == 200
    assert old.json()["spec"] == CONV_RELU
    assert_problem(
        client.get("/v1/patterns/acme.conv_relu/versions/9"), 404, "pattern-version-not-found"
    )

    # Created again, its history continues.
    assert create(client, CONV_RELU).json()["version"] == 4
    assert [v[1] for v in versions(client, "acme.conv_relu")][-1] == "create"


def test_versions_carry_registry_versions_and_actor(client):
    create(client, CONV_RELU)
    client.post("/v1/patterns/acme.conv_relu/disable")
    data = client.get("/v1/patterns/acme.conv_relu/versions").json()["data"]
    assert data[1]["registry_version"] == data[0]["registry_version"] + 1
    assert data[1]["registry_version"] == registry_version(client)
    assert {v["created_by"] for v in data} == {"anonymous"}
    builtin = client.get("/v1/patterns/conv_bn/versions").json()
    assert builtin["count"] == 1
    assert builtin["data"][0]["created_by"] == "builtin"


def test_dotted_names_work_on_every_route(client):
    spec = _with(name="acme.vision.v2.conv_relu")
    name = spec["name"]
    assert create(client, spec).headers["location"] == f"/v1/patterns/{name}"
    assert client.get(f"/v1/patterns/{name}").json()["name"] == name
    assert client.put(f"/v1/patterns/{name}", json=spec, headers=ANY).json()["version"] == 2
    assert client.post(f"/v1/patterns/{name}/disable").json()["enabled"] is False
    assert client.post(f"/v1/patterns/{name}/enable").json()["enabled"] is True
    assert len(versions(client, name)) == 4
    assert upload(client, name, RESNET.read_bytes()).json()["pattern"] == name
    assert client.delete(f"/v1/patterns/{name}", headers=ANY).status_code == 204


def test_builtin_patterns_can_be_disabled_and_changed(client):
    spec = client.get("/v1/patterns/conv_bn").json()["spec"]
    spec["priority"] = 99
    response = client.put("/v1/patterns/conv_bn", json=spec, headers={"If-Match": '"conv_bn@1"'})
    assert response.status_code == 200
    assert response.json()["builtin"] is True
    assert client.post("/v1/patterns/conv_bn/disable").json()["enabled"] is False


# --- snapshots (what a job uses) -------------------------------------------------------


def test_snapshot_excludes_disabled_and_deleted_and_old_versions_reproduce(client):
    url = settings_of(client).resolved_database_url
    create(client, CONV_RELU)
    created_at = registry_version(client)
    client.put("/v1/patterns/acme.conv_relu", json=_with(priority=50), headers=ANY)
    client.post("/v1/patterns/conv_mul/disable")
    client.delete("/v1/patterns/conv_add", headers=ANY)
    with session_scope(url) as session:
        version, specs = snapshot(session)
        old_version, old_specs = snapshot(session, created_at)
        seeded_version, seeded_specs = snapshot(session, 1)
    assert version == registry_version(client)
    names = {s["name"] for s in specs}
    assert "conv_mul" not in names and "conv_add" not in names
    assert len(specs) == BUILTINS - 1  # built-ins + 1 created - 1 disabled - 1 deleted
    current = next(s for s in specs if s["name"] == "acme.conv_relu")
    assert current["priority"] == 50

    assert old_version == created_at
    old_names = {s["name"] for s in old_specs}
    assert {"conv_mul", "conv_add", "acme.conv_relu"} <= old_names
    assert len(old_specs) == BUILTINS + 1
    assert next(s for s in old_specs if s["name"] == "acme.conv_relu") == CONV_RELU
    assert seeded_version == 1
    assert sorted(s["name"] for s in seeded_specs) == sorted(
        raw["name"] for raw in builtin_pattern_data()
    )


# --- trying a pattern on a model (/test) -----------------------------------------------


def test_conv_bn_matches_every_conv_bn_pair_of_resnet50(client):
    response = upload(client, "conv_bn", RESNET.read_bytes())
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["pattern"], body["version"], body["enabled"]) == ("conv_bn", 1, True)
    assert body["match_count"] == len(body["matches"]) == 53
    assert body["near_miss_count"] == 0
    assert body["matches"][0]["nodes"] == ["/conv1/Conv", "/bn1/BatchNormalization"]
    for match in body["matches"]:
        conv, bn = match["nodes"]
        assert conv.endswith("Conv") and bn.endswith("BatchNormalization")
    assert body["model_nodes"] > 100
    # No job was created: the jobs table is untouched.
    from autofusion.app.core.models import Job

    with session_scope(settings_of(client).resolved_database_url) as session:
        assert session.query(Job).count() == 0


def test_unsatisfiable_constraint_gives_near_misses_with_the_reason(client):
    create(client, GROUPED_CONV_BN)
    body = upload(client, GROUPED_CONV_BN["name"], RESNET.read_bytes()).json()
    assert body["match_count"] == 0
    assert body["near_miss_count"] == len(body["near_misses"]) == 53
    miss = body["near_misses"][0]
    assert miss["nodes"] == ["/conv1/Conv", "/bn1/BatchNormalization"]
    assert "group" in miss["reason"] and "expected eq 2" in miss["reason"]


def test_test_endpoint_works_on_a_disabled_pattern_and_a_tiny_model(client, tmp_path):
    create(client, CONV_RELU)
    client.post("/v1/patterns/acme.conv_relu/disable")
    model = onnx.parser.parse_model(TINY_CONV)
    w = np.ones((2, 2, 3, 3), dtype=np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    body = upload(client, "acme.conv_relu", model.SerializeToString()).json()
    assert body["enabled"] is False
    assert body["match_count"] == 1
    assert body["matches"][0]["nodes"] == ["<Conv>", "<Relu>"]  # unnamed nodes


def test_a_pattern_with_an_optional_group_matches_with_and_without_it(client):
    """An ML engineer's pattern whose Relu may be absent: the Conv alone matches a model
    without it, the Conv and the Relu a model with it, one match each."""
    spec = _with(
        name="acme.conv_maybe_relu",
        nodes=[
            {"id": "conv", "op": "Conv"},
            {"id": "act", "op": "Relu", "inputs": {"0": "conv"}, "optional": "act"},
        ],
    )
    create(client, spec)
    assert client.get("/v1/patterns/acme.conv_maybe_relu").json()["spec"] == spec
    w = np.ones((2, 2, 3, 3), dtype=np.float32)
    with_relu = onnx.parser.parse_model(TINY_CONV)
    without = onnx.parser.parse_model(
        TINY_CONV.replace("c = Conv", "y = Conv").replace("    y = Relu (c)\n", "")
    )
    for model, nodes in ((with_relu, ["<Conv>", "<Relu>"]), (without, ["<Conv>"])):
        model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
        body = upload(client, "acme.conv_maybe_relu", model.SerializeToString()).json()
        assert body["match_count"] == 1, body
        assert body["matches"][0]["nodes"] == nodes


def test_test_endpoint_rejects_a_bad_model(client):
    body = assert_problem(upload(client, "conv_bn", b"this is not onnx"), 422, "invalid-model")
    assert "not a valid ONNX model" in body["detail"]
    assert_problem(upload(client, "nope", RESNET.read_bytes()), 404, "pattern-not-found")
    missing = client.post("/v1/patterns/conv_bn/test", files={"other": ("x", b"x")})
    assert_problem(missing, 422, "invalid-upload")
    data_part = client.post(
        "/v1/patterns/conv_bn/test",
        files=[("model", ("m.onnx", RESNET.read_bytes())), ("data", ("w.bin", b"0000"))],
    )
    assert_problem(data_part, 422, "invalid-upload")
    not_multipart = client.post("/v1/patterns/conv_bn/test", content=RESNET.read_bytes())
    assert_problem(not_multipart, 415, "unsupported-media-type")
    assert_no_upload_left(client)


def assert_no_upload_left(client: TestClient) -> None:
    uploads = settings_of(client).uploads_dir
    assert not uploads.exists() or list(uploads.iterdir()) == []


def test_test_endpoint_refuses_external_data(client, tmp_path):
    model = onnx.parser.parse_model(TINY_CONV)
    w = np.ones((2, 2, 3, 3), dtype=np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    path = tmp_path / "external.onnx"
    onnx.save(model, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    response = upload(client, "conv_bn", path.read_bytes())
    body = assert_problem(response, 422, "unsafe-external-data")
    assert "external data" in body["detail"] and "'w'" in body["detail"]
    assert_no_upload_left(client)


def test_test_endpoint_refuses_a_model_of_a_disallowed_op_domain(client):
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17, "evil.ops" : 1]>
        g (float[2] x) => (float[2] y) { y = evil.ops.Launch (x) }"""
    )
    response = upload(client, "conv_bn", model.SerializeToString())
    assert_problem(response, 422, "op-domain-not-allowed")


def test_test_endpoint_refuses_an_upload_over_the_limit(tmp_path):
    with make_client(tmp_path, max_upload_bytes=1024) as client:
        # Over the limit by its declared length: refused before the body is read.
        big = upload(client, "conv_bn", RESNET.read_bytes())
        assert_problem(big, 413, "payload-too-large")
        # Streamed without a Content-Length: counted as it arrives.
        boundary = "b0undary"
        head = (
            f"--{boundary}\r\nContent-Disposition: form-data; name=model; "
            'filename="m.onnx"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()

        def chunks() -> Iterator[bytes]:
            yield head
            for _ in range(100):
                yield b"x" * 4096
            yield f"\r\n--{boundary}--\r\n".encode()

        streamed = client.post(
            "/v1/patterns/conv_bn/test",
            content=chunks(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert_problem(streamed, 413, "payload-too-large")
        assert_no_upload_left(client)


# --- auth ------------------------------------------------------------------------------


def test_writes_need_the_patterns_write_scope(tmp_path):
    with make_client(tmp_path, require_api_keys=True) as client:
        with session_scope(settings_of(client).resolved_database_url) as session:
            jobs_key = create_key(session, "acme", ["jobs:write"])
            patterns_key = create_key(session, "acme", ["patterns:write"])

        def auth(key: str) -> dict:
            return {"Authorization": f"Bearer {key}"}

        assert_problem(client.post("/v1/patterns", json=CONV_RELU), 401, "unauthorized")
        assert_problem(client.get("/v1/patterns"), 401, "unauthorized")
        assert_problem(client.get("/v1/patterns", headers=auth("af_unknown")), 401, "unauthorized")
        forbidden = client.post("/v1/patterns", json=CONV_RELU, headers=auth(jobs_key))
        assert "patterns:write" in assert_problem(forbidden, 403, "forbidden")["detail"]
        for path in ("/v1/patterns/conv_bn/disable", "/v1/patterns/conv_bn/enable"):
            assert_problem(client.post(path, headers=auth(jobs_key)), 403, "forbidden")
        assert_problem(
            client.delete("/v1/patterns/conv_bn", headers=auth(jobs_key)), 403, "forbidden"
        )
        # A key without the scope still reads.
        assert client.get("/v1/patterns", headers=auth(jobs_key)).status_code == 200

        created = client.post("/v1/patterns", json=CONV_RELU, headers=auth(patterns_key))
        assert created.status_code == 201, created.text
        history = client.get("/v1/patterns/acme.conv_relu/versions", headers=auth(jobs_key))
        assert history.json()["data"][0]["created_by"].startswith("key:")


def test_openapi_documents_the_registry(client):
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {"get", "post"} <= set(paths["/v1/patterns"])
    assert {"get", "put", "delete"} <= set(paths["/v1/patterns/{name}"])
    assert (
        "multipart/form-data" in paths["/v1/patterns/{name}/test"]["post"]["requestBody"]["content"]
    )
    schemas = spec["components"]["schemas"]
    for name in ("PatternCreate", "PatternPublic", "PatternsPublic", "PatternTestResult"):
        assert name in schemas
