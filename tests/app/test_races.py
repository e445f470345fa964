"""Races on the registry end in 409, 412 or 428, never 500 (issue 15, item 3).

Two clients send the same request at the same moment to a real server (uvicorn in a
thread, so both requests run concurrently in its thread pool), on SQLite and on
PostgreSQL, ten rounds each. Before the fix: two creates of one new pattern answered 500
in 8/10 rounds on SQLite and 7/10 on PostgreSQL (the unique-constraint violation was not
mapped), strategies 10/10, and two PUTs with the same ETag gave 500 instead of one 412.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import pytest
import uvicorn
import yaml

from autofusion.app.core.config import Settings
from autofusion.app.main import create_app

ROUNDS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(settings: Settings) -> Iterator[str]:
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=_free_port(), log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(params=["sqlite", "postgresql"])
def server_url(request, tmp_path) -> Iterator[str]:
    database_url = ""
    if request.param == "postgresql":
        database_url = request.getfixturevalue("postgres_url")
    settings = Settings(
        data_dir=tmp_path / "data", embedded_worker=False, database_url=database_url
    )
    yield from _serve(settings)


def _at_once(url: str, send: Callable[[httpx.Client], httpx.Response], n: int = 2) -> list:
    """``send`` from ``n`` threads released by one barrier: the requests overlap."""
    barrier = threading.Barrier(n)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            barrier.wait()
            response = send(client)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == n, "a request did not finish"
    return answers


def _pattern(name: str, priority: int = 10) -> dict:
    return {
        "name": name,
        "priority": priority,
        "nodes": [
            {"id": "conv", "op": "Conv"},
            {"id": "act", "op": "Relu", "inputs": {"0": "conv"}},
        ],
        "rewriter": {"name": "fused_region", "params": {"domain": "ai.acme"}},
    }


def _statuses(rounds: list[list[httpx.Response]]) -> Counter:
    return Counter(tuple(sorted(r.status_code for r in answers)) for answers in rounds)


@pytest.mark.slow
def test_two_creates_of_one_new_pattern_are_one_201_and_one_409(server_url, problem):
    rounds = []
    for k in range(ROUNDS):
        body = _pattern(f"race.p{k}")
        rounds.append(_at_once(server_url, lambda c, b=body: c.post("/v1/patterns", json=b)))
    assert _statuses(rounds) == Counter({(201, 409): ROUNDS}), [
        [(r.status_code, r.text[:200]) for r in answers] for answers in rounds
    ]
    for answers in rounds:
        conflict = next(r for r in answers if r.status_code == 409)
        problem(conflict, 409, "pattern-exists")
    with httpx.Client(base_url=server_url) as client:
        for k in range(ROUNDS):
            history = client.get(f"/v1/patterns/race.p{k}/versions").json()
            assert [v["version"] for v in history["data"]] == [1]


@pytest.mark.slow
def test_two_creates_of_one_new_strategy_are_one_201_and_one_409(server_url, problem):
    rounds = []
    for k in range(ROUNDS):
        body = {"name": f"race.s{k}", "patterns": ["conv_bn"]}
        rounds.append(_at_once(server_url, lambda c, b=body: c.post("/v1/strategies", json=b)))
    assert _statuses(rounds) == Counter({(201, 409): ROUNDS}), [
        [(r.status_code, r.text[:200]) for r in answers] for answers in rounds
    ]
    for answers in rounds:
        problem(next(r for r in answers if r.status_code == 409), 409, "strategy-exists")


@pytest.mark.slow
def test_two_puts_with_one_etag_are_one_200_and_one_412(server_url, problem):
    with httpx.Client(base_url=server_url) as client:
        created = client.post("/v1/patterns", json=_pattern("race.put"))
        assert created.status_code == 201, created.text
        strategy = client.post("/v1/strategies", json={"name": "race.put", "exclude": []})
        assert strategy.status_code == 201, strategy.text
    rounds = []
    for k in range(ROUNDS):
        with httpx.Client(base_url=server_url) as client:
            etag = client.get("/v1/patterns/race.put").headers["ETag"]
        body = _pattern("race.put", priority=k)
        rounds.append(
            _at_once(
                server_url,
                lambda c, b=body, e=etag: c.put(
                    "/v1/patterns/race.put", json=b, headers={"If-Match": e}
                ),
            )
        )
    assert _statuses(rounds) == Counter({(200, 412): ROUNDS}), [
        [(r.status_code, r.text[:200]) for r in answers] for answers in rounds
    ]
    for answers in rounds:
        problem(next(r for r in answers if r.status_code == 412), 412, "precondition-failed")
    strategy_rounds = []
    for k in range(ROUNDS):
        with httpx.Client(base_url=server_url) as client:
            etag = client.get("/v1/strategies/race.put").headers["ETag"]
        body = {"name": "race.put", "description": f"round {k}"}
        strategy_rounds.append(
            _at_once(
                server_url,
                lambda c, b=body, e=etag: c.put(
                    "/v1/strategies/race.put", json=b, headers={"If-Match": e}
                ),
            )
        )
    assert _statuses(strategy_rounds) == Counter({(200, 412): ROUNDS}), [
        [(r.status_code, r.text[:200]) for r in answers] for answers in strategy_rounds
    ]
    with httpx.Client(base_url=server_url) as client:
        # Every round made exactly one new version: none lost, none written twice.
        assert client.get("/v1/patterns/race.put").json()["version"] == 1 + ROUNDS
        history = client.get("/v1/strategies/race.put/versions").json()["data"]
        assert [v["version"] for v in history] == list(range(1, 2 + ROUNDS))


def _each_once(url: str, actions: list[str]) -> Callable[[httpx.Client], httpx.Response]:
    """A sender that POSTs ``url/<action>``, each action of ``actions`` by one thread."""
    picks = iter(actions)
    lock = threading.Lock()

    def send(client: httpx.Client) -> httpx.Response:
        with lock:
            action = next(picks)
        return client.post(f"{url}/{action}")

    return send


@pytest.mark.slow
def test_enable_and_disable_without_if_match_never_answer_412(server_url):
    """Issue 26: without If-Match, enable and disable apply to whatever version is current.
    Before: the loser of each overlapping pair answered 412 (about half the requests)."""
    with httpx.Client(base_url=server_url) as client:
        assert client.post("/v1/patterns", json=_pattern("race.toggle")).status_code == 201
    url = "/v1/patterns/race.toggle"
    rounds = []
    for k in range(ROUNDS):
        # Two of one kind (one of them finds nothing to do) and one of the other.
        actions = (
            ["disable", "disable", "enable"] if k % 2 == 0 else ["enable", "enable", "disable"]
        )
        rounds.append(_at_once(server_url, _each_once(url, actions), n=len(actions)))
    answers = [(r.status_code, r.text[:200]) for answers in rounds for r in answers]
    assert all(status == 200 for status, _ in answers), answers
    with httpx.Client(base_url=server_url) as client:
        history = client.get(f"{url}/versions").json()["data"]
        current = client.get(url).json()
    # Each version is one real change, versions have no gap, states alternate.
    assert [v["version"] for v in history] == list(range(1, len(history) + 1))
    states = [v["enabled"] for v in history]
    assert all(a != b for a, b in zip(states, states[1:], strict=False)), history
    assert current["version"] == len(history) and current["enabled"] == states[-1]


def test_enable_with_a_stale_if_match_is_still_412(service, problem):
    client = service.client
    assert client.post("/v1/patterns", json=_pattern("acme.guarded")).status_code == 201
    assert client.post("/v1/patterns/acme.guarded/disable").status_code == 200
    stale = client.post(
        "/v1/patterns/acme.guarded/enable", headers={"If-Match": '"acme.guarded@1"'}
    )
    problem(stale, 412, "precondition-failed")
    assert client.get("/v1/patterns/acme.guarded").json()["enabled"] is False


def test_a_put_or_delete_without_if_match_is_428_and_says_to_send_the_etag(service, problem):
    client = service.client
    assert client.post("/v1/patterns", json=_pattern("acme.nomatch")).status_code == 201
    for response in (
        client.put("/v1/patterns/acme.nomatch", json=_pattern("acme.nomatch", 5)),
        client.delete("/v1/patterns/acme.nomatch"),
        client.put("/v1/strategies/vision", json={"name": "vision"}),
    ):
        body = problem(response, 428, "precondition-required")
        assert "If-Match" in body["detail"] and "ETag" in body["detail"], body
    # Nothing changed: the pattern is still at version 1, the strategy too.
    assert client.get("/v1/patterns/acme.nomatch").json()["version"] == 1
    assert client.get("/v1/strategies/vision").json()["version"] == 1


def test_the_dashboard_edit_forms_send_the_version_they_showed(service):
    client = service.client
    for kind, name in (("patterns", "conv_bn"), ("strategies", "vision")):
        page = client.get(f"/ui/{kind}/{name}/edit")
        assert 'name="version" value="1"' in page.text  # the version the form showed
        spec = client.get(f"/v1/{kind}/{name}").json()
        document = yaml.safe_dump(spec["spec"] if kind == "patterns" else {"name": name})
        url = f"/ui/{kind}/{name}/edit"
        missing = client.post(url, data={"yaml": document})
        assert missing.status_code == 428 and "did not say which version" in missing.text
        stale = client.post(url, data={"yaml": document, "version": "7"})
        assert stale.status_code == 412 and "changed since you read it" in stale.text
        saved = client.post(url, data={"yaml": document, "version": "1"}, follow_redirects=False)
        assert saved.status_code == 303, saved.text
        assert client.get(f"/v1/{kind}/{name}").json()["version"] == 2


@pytest.mark.slow
def test_two_creates_of_a_deleted_pattern_are_one_201_and_one_409(server_url, problem):
    """Re-creating after a delete is a swap on the deleted row's version, not an INSERT."""
    rounds = []
    for k in range(ROUNDS):
        with httpx.Client(base_url=server_url) as client:
            if k:
                deleted = client.delete("/v1/patterns/race.again", headers={"If-Match": "*"})
                assert deleted.status_code == 204, deleted.text
        body = _pattern("race.again", priority=k)
        rounds.append(_at_once(server_url, lambda c, b=body: c.post("/v1/patterns", json=b)))
    assert _statuses(rounds) == Counter({(201, 409): ROUNDS}), [
        [(r.status_code, r.text[:200]) for r in answers] for answers in rounds
    ]
    with httpx.Client(base_url=server_url) as client:
        history = client.get("/v1/patterns/race.again/versions").json()["data"]
    changes = [v["change"] for v in history]
    assert changes == ["create"] + ["delete", "create"] * (ROUNDS - 1)
