"""``autofusion registry`` against a live server: get records the ETag, put and delete
send it as If-Match, and a change someone else made in between is refused (412, exit 7)
with what to do."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from cli_server import Server
from cli_server import run_cli as cli

from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_OK, EXIT_USAGE
from autofusion.app.cli.registry import EtagStore

# A pattern of its own (no built-in has this name): Relu after Sigmoid, made a region.
PATTERN = {
    "name": "test.sigmoid_relu",
    "description": "Sigmoid then Relu, one fused region",
    "priority": 5,
    "nodes": [
        {"id": "s", "op": "Sigmoid", "inputs": {"0": "$x"}},
        {"id": "r", "op": "Relu", "inputs": {"0": "s"}},
    ],
    "rewriter": {"name": "fused_region"},
}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.upper().startswith("AUTOFUSION_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("registry") / "data", "--no-embedded-worker")
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


def registry(capsys, server: Server, *args: str | Path) -> tuple[int, str, str]:
    return cli(capsys, "registry", *args, "--server", server.url)


@pytest.mark.slow
def test_create_get_put_delete_with_etags(capsys, server, tmp_path):
    source = tmp_path / "p.yaml"
    source.write_text(yaml.safe_dump({"patterns": [PATTERN]}))
    code, out, err = registry(capsys, server, "patterns", "create", source)
    assert code == EXIT_OK, err
    assert out.strip() == f"created pattern {PATTERN['name']} v1"
    code, out, _ = registry(capsys, server, "patterns", "list")
    assert any(line.startswith(f"{PATTERN['name']}  v1") for line in out.splitlines())

    # get -o writes what put takes; put sends the ETag get recorded.
    edited = tmp_path / "edited.yaml"
    code, _, err = registry(capsys, server, "patterns", "get", PATTERN["name"], "-o", edited)
    assert code == EXIT_OK, err
    spec = yaml.safe_load(edited.read_text())
    assert spec["nodes"] == PATTERN["nodes"]
    stored = EtagStore().get(f"{server.url} pattern {PATTERN['name']}")
    assert stored == f'"{PATTERN["name"]}@1"'
    edited.write_text(yaml.safe_dump({**spec, "priority": 6}))
    code, out, err = registry(capsys, server, "patterns", "put", PATTERN["name"], edited)
    assert code == EXIT_OK, err
    assert out.strip() == f"updated pattern {PATTERN['name']} to v2"
    answer = httpx.get(f"{server.url}/v1/patterns/{PATTERN['name']}").json()
    assert answer["version"] == 2 and answer["spec"]["priority"] == 6

    code, out, _ = registry(capsys, server, "patterns", "history", PATTERN["name"])
    assert [line.split()[0] for line in out.splitlines()] == ["v1", "v2"]

    code, out, err = registry(capsys, server, "patterns", "delete", PATTERN["name"])
    assert code == EXIT_OK, err
    assert httpx.get(f"{server.url}/v1/patterns/{PATTERN['name']}").status_code == 404
    assert EtagStore().get(f"{server.url} pattern {PATTERN['name']}") is None


@pytest.mark.slow
def test_a_change_made_in_between_is_refused_with_what_to_do(capsys, server, tmp_path):
    name = "test.lost_update"
    source = tmp_path / "p.json"
    source.write_text(json.dumps({**PATTERN, "name": name}))
    assert registry(capsys, server, "patterns", "create", source)[0] == EXIT_OK
    mine = tmp_path / "mine.yaml"
    assert registry(capsys, server, "patterns", "get", name, "-o", mine)[0] == EXIT_OK

    # Someone else changes it through the API after our get.
    theirs = httpx.put(
        f"{server.url}/v1/patterns/{name}",
        json={**PATTERN, "name": name, "priority": 9},
        headers={"If-Match": f'"{name}@1"'},
    )
    assert theirs.status_code == 200, theirs.text

    mine.write_text(yaml.safe_dump({**yaml.safe_load(mine.read_text()), "priority": 7}))
    code, out, err = registry(capsys, server, "patterns", "put", name, mine)
    assert code == EXIT_CONFLICT
    assert f"pattern {name} was changed on the server since you read it" in err
    assert f"autofusion registry patterns get {name}" in err and "nothing was written" in err
    assert out == ""
    answer = httpx.get(f"{server.url}/v1/patterns/{name}").json()
    assert answer["version"] == 2 and answer["spec"]["priority"] == 9  # theirs stands

    # Read again, redo, put: it goes through.
    assert registry(capsys, server, "patterns", "get", name, "-o", tmp_path / "v2.yaml")[0] == 0
    code, out, err = registry(capsys, server, "patterns", "put", name, mine)
    assert code == EXIT_OK, err
    assert httpx.get(f"{server.url}/v1/patterns/{name}").json()["spec"]["priority"] == 7


@pytest.mark.slow
def test_put_without_a_recorded_etag_says_to_get_first(capsys, server, tmp_path):
    name = "test.no_etag"
    source = tmp_path / "p.yaml"
    source.write_text(yaml.safe_dump({**PATTERN, "name": name}))
    assert registry(capsys, server, "patterns", "create", source)[0] == EXIT_OK
    (tmp_path / "state").joinpath("autofusion", "etags.json").unlink()  # as on another machine
    code, _, err = registry(capsys, server, "patterns", "put", name, source)
    assert code == EXIT_USAGE
    assert f"run `autofusion registry patterns get {name}` first" in err
    code, out, err = registry(capsys, server, "patterns", "put", name, source, "--if-match", "*")
    assert code == EXIT_OK, err


@pytest.mark.slow
def test_strategies_and_refusals(capsys, server, tmp_path):
    code, out, _ = registry(capsys, server, "strategies", "list")
    assert code == EXIT_OK and any(line.startswith("vision  v1") for line in out.splitlines())
    code, out, _ = registry(capsys, server, "strategies", "get", "vision", "--json")
    assert json.loads(out)["name"] == "vision"

    doc = tmp_path / "s.yaml"
    doc.write_text(yaml.safe_dump({"name": "test.mine", "patterns": ["conv_bn"]}))
    code, out, err = registry(capsys, server, "strategies", "create", doc)
    assert code == EXIT_OK, err
    code, _, err = registry(capsys, server, "strategies", "create", doc)
    assert code == EXIT_CONFLICT and "(409)" in err  # it exists
    doc.write_text(yaml.safe_dump({"name": "test.mine", "patterns": ["no_such_pattern"]}))
    assert registry(capsys, server, "strategies", "get", "test.mine")[0] == EXIT_OK
    code, _, err = registry(capsys, server, "strategies", "put", "test.mine", doc)
    assert code == EXIT_USAGE and "(422)" in err  # a config error, as optimize --strategy

    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({**PATTERN, "name": "test.broken", "nodes": []}))
    code, _, err = registry(capsys, server, "patterns", "create", broken)
    assert code == EXIT_BAD_INPUT and "(422)" in err  # as optimize --pattern-file
    broken.write_text("patterns: [oops")
    code, _, err = registry(capsys, server, "patterns", "create", broken)
    assert code == EXIT_BAD_INPUT and "cannot read" in err
    code, _, err = registry(capsys, server, "patterns", "get", "no.such")
    assert code == EXIT_USAGE and "(404)" in err
