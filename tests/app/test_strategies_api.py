"""Named strategies: the seeded presets, CRUD with ETags and versions, validation of the
pattern names against the registry, auth, and the config a job gets from a strategy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Strategy
from autofusion.app.main import create_app
from autofusion.app.services.auth import create_key
from autofusion.app.services.strategies import PRESETS, StrategySpec, seed_strategies
from autofusion.fusion_core import OptimizeConfig

PROBLEM = "application/problem+json"
BASE = "https://autofusion.dev/problems/"
VISION = [
    "conv_bn_relu",
    "conv_bn_add_relu",
    "dwconv_bn",
    "pool_bn",
    "conv_bn",
    "conv_add",
    "conv_mul",
    "conv_activation",
    "pad_conv",
]
# If-Match for a change that overwrites whatever version is there (required on PUT, DELETE).
ANY = {"If-Match": "*"}
MOBILE = {
    "name": "acme.mobile",
    "description": "What our phones run.",
    "patterns": ["conv_bn", "dwconv_bn"],
    "exclude": [],
    "target": "onnxruntime",
    "check": {"rtol": 0.01, "samples": 3},
}


def make_client(tmp_path: Path, **options) -> TestClient:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False, **options)
    return TestClient(create_app(settings))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with make_client(tmp_path) as c:
        yield c


def db_url(client: TestClient) -> str:
    return client.app.state.settings.resolved_database_url


def assert_problem(response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["type"] == BASE + slug
    return body


def test_presets_are_seeded(client):
    body = client.get("/v1/strategies").json()
    assert body["count"] == 3
    by_name = {s["name"]: s for s in body["data"]}
    assert sorted(by_name) == ["default", "nlp", "vision"]
    assert by_name["default"]["patterns"] is None  # every pattern
    assert by_name["vision"]["patterns"] == VISION
    nlp = by_name["nlp"]["patterns"]
    # every transformer fusion, none of the convolutional ones
    assert {"attention", "qkv_bias_merge", "skip_layer_norm", "matmul_add"} <= set(nlp)
    assert "gelu_erf_bias" in nlp and not any(p.startswith("conv") for p in nlp)
    assert all(s["version"] == 1 and s["exclude"] == [] for s in body["data"])
    # Presets choose among overlapping fusions with the cost model.
    assert {n: s["selection"] for n, s in by_name.items()} == {
        "default": "auto",
        "vision": "dp",
        "nlp": "dp",
    }
    # Every preset names patterns the registry has.
    registry = {p["name"] for p in client.get("/v1/patterns").json()["data"]}
    for preset in PRESETS:
        assert set(preset.patterns or []) <= registry


def test_seeding_brings_an_unchanged_preset_to_this_release(client):
    """A preset at version 1 that an older release wrote (here: naming a pattern this
    release retired) follows the built-ins; its version and history stay one."""
    with session_scope(db_url(client)) as session:
        stored = session.get(Strategy, "nlp")
        stored.data = {**stored.data, "patterns": ["attention_mha", "matmul_add"]}
        session.flush()
        assert seed_strategies(session) == 1
        assert seed_strategies(session) == 0
    nlp = client.get("/v1/strategies/nlp").json()
    assert nlp["version"] == 1 and "attention" in nlp["patterns"]
    assert "attention_mha" not in nlp["patterns"]


def test_seeding_again_keeps_changed_presets(client):
    client.put("/v1/strategies/nlp", json={"name": "nlp", "patterns": ["matmul_add"]}, headers=ANY)
    with session_scope(db_url(client)) as session:
        assert seed_strategies(session) == 0
    assert client.get("/v1/strategies/nlp").json()["patterns"] == ["matmul_add"]


def test_create_and_read(client):
    response = client.post("/v1/strategies", json=MOBILE)
    assert response.status_code == 201, response.text
    assert response.headers["location"] == "/v1/strategies/acme.mobile"
    assert response.headers["etag"] == '"acme.mobile@1"'
    body = response.json()
    assert body["version"] == 1
    assert body["target"] == "onnxruntime"
    assert body["check"]["rtol"] == 0.01 and body["check"]["samples"] == 3
    read = client.get("/v1/strategies/acme.mobile")
    assert read.headers["etag"] == '"acme.mobile@1"'
    assert read.json() == body
    assert_problem(client.post("/v1/strategies", json=MOBILE), 409, "strategy-exists")


def test_unknown_pattern_names_are_rejected(client):
    spec = {**MOBILE, "patterns": ["conv_bn", "conv_bnn"], "exclude": ["nope"]}
    body = assert_problem(client.post("/v1/strategies", json=spec), 422, "invalid-strategy")
    assert body["errors"] == [
        {"field": "patterns.1", "message": "unknown pattern 'conv_bnn'"},
        {"field": "exclude.0", "message": "unknown pattern 'nope'"},
    ]
    assert_problem(client.get("/v1/strategies/acme.mobile"), 404, "strategy-not-found")


def test_deleted_patterns_cannot_be_named_but_disabled_ones_can(client):
    client.delete("/v1/patterns/dwconv_bn", headers=ANY)
    assert_problem(client.post("/v1/strategies", json=MOBILE), 422, "invalid-strategy")
    client.post("/v1/patterns/conv_bn/disable")
    spec = {**MOBILE, "patterns": ["conv_bn"]}
    assert client.post("/v1/strategies", json=spec).status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param({"target": "tensorrt"}, "body.target", id="unknown-target"),
        pytest.param({"colour": "red"}, "body.colour", id="unknown-field"),
        pytest.param({"name": "bad name"}, "body.name", id="bad-name"),
        pytest.param({"check": {"samples": 0}}, "body.check.samples", id="bad-check-option"),
        pytest.param({"patterns": "conv_bn"}, "body.patterns", id="patterns-not-a-list"),
    ],
)
def test_malformed_strategy_is_rejected(client, change, field):
    body = assert_problem(
        client.post("/v1/strategies", json={**MOBILE, **change}), 422, "invalid-request"
    )
    assert field in [e["field"] for e in body["errors"]]


def test_put_with_if_match_makes_versions(client):
    etag = client.post("/v1/strategies", json=MOBILE).headers["etag"]
    changed = {**MOBILE, "patterns": None, "exclude": ["pad_conv"]}
    response = client.put("/v1/strategies/acme.mobile", json=changed, headers={"If-Match": etag})
    assert response.status_code == 200, response.text
    assert response.headers["etag"] == '"acme.mobile@2"'
    assert (response.json()["version"], response.json()["patterns"]) == (2, None)

    stale = client.put("/v1/strategies/acme.mobile", json=MOBILE, headers={"If-Match": etag})
    assert_problem(stale, 412, "precondition-failed")
    unknown = client.put(
        "/v1/strategies/acme.mobile", json={**MOBILE, "exclude": ["nope"]}, headers=ANY
    )
    assert_problem(unknown, 422, "invalid-strategy")
    renamed = client.put(
        "/v1/strategies/acme.mobile", json={**MOBILE, "name": "acme.other"}, headers=ANY
    )
    assert_problem(renamed, 422, "strategy-name-mismatch")
    assert_problem(client.put("/v1/strategies/nope", json=MOBILE), 404, "strategy-not-found")

    history = client.get("/v1/strategies/acme.mobile/versions").json()
    assert history["count"] == 2
    assert [v["version"] for v in history["data"]] == [1, 2]
    assert history["data"][0]["patterns"] == MOBILE["patterns"]  # old versions are kept
    assert history["data"][1]["exclude"] == ["pad_conv"]


def test_presets_can_be_changed(client):
    response = client.put(
        "/v1/strategies/vision",
        json={"name": "vision", "patterns": [*VISION, "conv_add_relu"]},
        headers={"If-Match": '"vision@1"'},
    )
    assert response.status_code == 200, response.text
    assert response.json()["version"] == 2


def test_writes_need_the_patterns_write_scope(tmp_path):
    with make_client(tmp_path, require_api_keys=True) as client:
        with session_scope(client.app.state.settings.resolved_database_url) as session:
            jobs_key = create_key(session, "acme", ["jobs:write"])
            patterns_key = create_key(session, "acme", ["patterns:write"])
        assert_problem(client.post("/v1/strategies", json=MOBILE), 401, "unauthorized")
        assert_problem(client.get("/v1/strategies"), 401, "unauthorized")
        jobs = {"Authorization": f"Bearer {jobs_key}"}
        assert_problem(client.post("/v1/strategies", json=MOBILE, headers=jobs), 403, "forbidden")
        assert_problem(
            client.put("/v1/strategies/nlp", json={"name": "nlp"}, headers=jobs), 403, "forbidden"
        )
        assert client.get("/v1/strategies/nlp", headers=jobs).status_code == 200
        writer = {"Authorization": f"Bearer {patterns_key}"}
        assert client.post("/v1/strategies", json=MOBILE, headers=writer).status_code == 201


def test_a_strategy_becomes_optimize_config_fields():
    spec = StrategySpec.model_validate(MOBILE)
    config = OptimizeConfig(**{"target": "generic", **spec.config_overrides()})
    assert config.target == "onnxruntime"
    assert config.patterns == ["conv_bn", "dwconv_bn"]
    assert config.check.rtol == 0.01 and config.check.samples == 3
    plain = StrategySpec(name="plain", exclude=["pad_conv"]).config_overrides()
    assert plain == {"patterns": None, "exclude": ["pad_conv"]}  # leaves target and check


def test_a_strategy_can_choose_by_predicted_gain():
    spec = StrategySpec(
        name="fast", selection="dp", target_profile="gpu", cost_threshold=1.05, memory_limit=1 << 20
    )
    config = OptimizeConfig(**spec.config_overrides())
    assert (config.selection, config.target_profile) == ("dp", "gpu")
    assert (config.cost_threshold, config.memory_limit) == (1.05, 1 << 20)
    with pytest.raises(ValueError, match="selection"):
        StrategySpec(name="bad", selection="simulated_annealing")


def test_a_strategy_carries_switches_stages_and_precision(client):
    body = {
        "name": "acme.large_images",
        "patterns": ["conv_bn_relu", "conv_bn", "conv_activation"],
        "switches": [{"when": "dim('$x', -1) > 1024", "disable": ["conv_bn_relu"]}],
        "progressive": True,
        "stages": [["conv_bn"], ["conv_*"]],
        "precision": "fp16",
    }
    created = client.post("/v1/strategies", json=body)
    assert created.status_code == 201, created.text
    stored = client.get("/v1/strategies/acme.large_images").json()
    assert stored["switches"] == [{**body["switches"][0], "enable": []}]
    assert stored["stages"] == body["stages"] and stored["precision"] == "fp16"
    config = OptimizeConfig(**StrategySpec(**body).config_overrides())
    assert config.progressive and config.stages == [["conv_bn"], ["conv_*"]]
    assert config.precision == "fp16" and config.switches[0].disable == ["conv_bn_relu"]


def test_a_switch_that_does_not_parse_is_refused_with_its_field(client):
    body = {"name": "bad_switch", "switches": [{"when": "open('/etc/x') > 0", "disable": ["x"]}]}
    response = client.post("/v1/strategies", json=body)
    assert response.status_code == 422
    assert "body.switches.0.when" in response.text
    assert "the functions are sqrt(x) and dim(ref, axis)" in response.text


def test_a_strategy_can_ask_for_measured_selection_but_not_name_a_folder(client):
    measured = {"name": "acme.measured", "selection": "measured"}
    measured["measure_options"] = {"budget_s": 20}
    created = client.post("/v1/strategies", json=measured)
    assert created.status_code == 201, created.text
    assert created.json()["measure_options"]["budget_s"] == 20
    overrides = StrategySpec.model_validate(measured).config_overrides()
    assert overrides["selection"] == "measured" and overrides["measure_options"] == {"budget_s": 20}
    assert OptimizeConfig(**overrides).measure_options.budget_s == 20
    hostile = {"name": "acme.hostile", "measure": True, "measure_options": {"cache_dir": "/etc"}}
    response = client.post("/v1/strategies", json=hostile)
    assert response.status_code == 422 and "chosen by each worker" in response.text
