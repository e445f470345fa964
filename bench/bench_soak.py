"""A bounded soak of an embedded autofusion service on 127.0.0.1 (issue 26): tenants
sending hostile models and one tenant sending normal ones, all at once.

The script starts ``autofusion serve`` (SQLite, filesystem queue, the worker in the API
process, API keys required) with a fresh data dir, makes a key per tenant, and for
``--seconds`` runs:

- ``--hostile`` tenants, each in a loop (honouring ``Retry-After``), sending in turn:
  ``ConstantOfShape`` fills that fold to ``--fill-mb`` MB each (the 6 kB model that stored
  839 MB), a 222-byte ``TfIdfVectorizer`` that hangs constant folding, a
  ``--nodes``-node chain (a big parse), a pattern trial of the hang, and an upload that
  trickles at 1.2 KB/s;
- one normal tenant submitting a small Conv+BatchNorm+Relu model every
  ``--normal-every`` s and following each to its end;
- a prober: ``/healthz`` every 0.25 s (its latency), the API process's RSS and the data
  dir's size every second.

Then the submissions stop, the normal jobs are waited for, and every job the service
accepted is looked up: one that is gone, or not in a state it may be in, is lost.
Reports disk (peak, end), API RSS (peak), ``/healthz`` p50/p99/max, the normal jobs'
queue wait and run time, what the hostile tenants were answered (by status and
problem), and lost jobs. ``--json`` writes everything.

    .venv/bin/python bench/bench_soak.py --hostile 3 --seconds 180
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service_load import (
    Proc,
    _server_times,
    clean_environment,
    free_port,
    start,
    tiny_model,
    wait_ready,
)

FINAL = {"succeeded", "failed", "cancelled"}
SCOPES = ["jobs:write", "patterns:write"]


# --- the models ---------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "soak", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def fills_model(count: int, megabytes: int) -> bytes:
    """``y = Sum(x, fill_0..)``: each fill a float32 ConstantOfShape of ``megabytes`` MB
    (100 of 8 MB: the 6 kB model that stored 839 MB). Built here, not with
    ``fusion_core.testing``, so the bench also runs against releases without it."""
    shape = [256, megabytes * 1024 * 1024 // 4 // 256]
    dims = helper.make_tensor("dims", TensorProto.INT64, [2], shape)
    nodes = [helper.make_node("Constant", [], ["shape"], value=dims)]
    for i in range(count):
        value = helper.make_tensor(f"value{i}", TensorProto.FLOAT, [1], [float(i + 1)])
        nodes.append(helper.make_node("ConstantOfShape", ["shape"], [f"c{i}"], value=value))
    nodes.append(helper.make_node("Sum", ["x", *(f"c{i}" for i in range(count))], ["y"]))
    value_info = helper.make_tensor_value_info
    inputs = [value_info("x", TensorProto.FLOAT, [1, shape[1]])]
    return _model(nodes, inputs, [value_info("y", TensorProto.FLOAT, shape)])


def hanging_model() -> bytes:
    """The issue's 222-byte TfIdfVectorizer that loops in constant folding; the same as
    tests/app/test_trial_isolation.py's, built here so the bench runs against releases
    whose test code differs."""
    node = helper.make_node(
        "TfIdfVectorizer",
        ["x"],
        ["y"],
        mode="TF",
        min_gram_length=1,
        max_gram_length=1,
        max_skip_count=0,
        ngram_counts=[0, 2**62],
        ngram_indexes=[0],
        pool_int64s=[1],
    )
    x = helper.make_tensor("x", TensorProto.INT64, [1], [1])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model([node], [], [out], [x])


def chain_model(nodes: int) -> bytes:
    """``nodes`` Relus in a chain: cheap to send, costly to parse and to check."""
    names = ["x", *(f"v{i}" for i in range(nodes - 1)), "y"]
    chain = [helper.make_node("Relu", [a], [b]) for a, b in zip(names, names[1:], strict=False)]
    value = helper.make_tensor_value_info
    return _model(chain, [value("x", TensorProto.FLOAT, [4])], [value("y", TensorProto.FLOAT, [4])])


# --- the service --------------------------------------------------------------------


@contextlib.contextmanager
def service(workdir: Path, tenants: list[str], env_extra: dict[str, str]) -> Iterator[tuple]:
    """An embedded server requiring keys, with a key per tenant: (base URL, keys, proc)."""
    from autofusion.app.core.config import Settings
    from autofusion.app.core.db import session_scope
    from autofusion.app.migrate import upgrade
    from autofusion.app.services.auth import create_key

    data = workdir / "data"
    settings = Settings(data_dir=data)
    data.mkdir(parents=True)
    upgrade(settings.resolved_database_url)
    with session_scope(settings.resolved_database_url) as session:
        keys = {t: create_key(session, t, SCOPES, "soak") for t in tenants}
    port = free_port()
    env = {**clean_environment(), "AUTOFUSION_LOG_FORMAT": "text", **env_extra}
    argv = ["serve", "--port", str(port), "--data-dir", str(data), "--require-api-keys"]
    proc = start("serve", argv, env, workdir / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, [proc], timeout=120)
        yield base, keys, proc
    finally:
        proc.stop()


# --- the load -----------------------------------------------------------------------


class Soak:
    def __init__(self, base: str, keys: dict[str, str], args: argparse.Namespace) -> None:
        self.base, self.keys, self.args = base, keys, args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answers: Counter[str] = Counter()
        self.accepted: dict[str, str] = {}  # job id -> tenant
        self.normal: list[dict] = []

    def client(self, tenant: str, timeout: float = 120) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}"}
        return httpx.Client(base_url=self.base, headers=headers, timeout=timeout)

    def _note(self, tenant: str, what: str, response: httpx.Response | None) -> float:
        """Count the answer; the seconds to wait before the next request."""
        if response is None:
            key, wait = f"{what}: no answer", 1.0
        else:
            slug = ""
            if response.headers.get("content-type", "").startswith("application/problem"):
                slug = " " + response.json().get("type", "").rsplit("/", 1)[-1]
            key = f"{what}: {response.status_code}{slug}"
            wait = float(response.headers.get("Retry-After", 0) or 0)
            if response.status_code == 202:
                with self.lock:
                    self.accepted[response.json()["id"]] = tenant
        with self.lock:
            self.answers[key] += 1
        return wait

    def _post(self, client: httpx.Client, path: str, content: bytes) -> httpx.Response | None:
        files = {"model": ("model.onnx", content, "application/octet-stream")}
        try:
            return client.post(path, files=files)
        except httpx.HTTPError:
            return None

    def hostile(self, tenant: str, models: dict[str, bytes]) -> None:
        with self.client(tenant) as client:
            while not self.stop.is_set():
                for what, content in models.items():
                    if self.stop.is_set():
                        return
                    if what == "trickle":
                        self._note(tenant, what, self._trickle(client, content))
                        continue
                    path = "/v1/patterns/conv_bn/test" if what == "trial" else "/v1/optimize"
                    wait = self._note(tenant, what, self._post(client, path, content))
                    self.stop.wait(min(wait, 5.0))

    def _trickle(self, client: httpx.Client, content: bytes) -> httpx.Response | None:
        """An upload whose body arrives at 1.2 KB/s."""
        boundary = "soakboundary"
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"'
                f"\r\n\r\n"
            ).encode()
            + content
            + f"\r\n--{boundary}--\r\n".encode()
        )

        def chunks() -> Iterator[bytes]:
            for i in range(0, len(body), 120):
                if self.stop.is_set():
                    return
                yield body[i : i + 120]
                time.sleep(0.1)

        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        try:
            return client.post("/v1/optimize", content=chunks(), headers=headers)
        except httpx.HTTPError:
            return None

    def normal_tenant(self, tenant: str) -> None:
        seed = 0
        with self.client(tenant) as client:
            while not self.stop.is_set():
                seed += 1
                sent = time.monotonic()
                response = self._post(client, "/v1/optimize", tiny_model(seed))
                self._note(tenant, "normal", response)
                if response is not None and response.status_code == 202:
                    with self.lock:
                        self.normal.append({"id": response.json()["id"], "sent": sent})
                self.stop.wait(self.args.normal_every)


class Probe:
    """``/healthz`` latency, the API's RSS and the data dir's size, sampled."""

    def __init__(self, base: str, proc: Proc, data: Path) -> None:
        self.base, self.proc, self.data = base, proc, data
        self.health: list[float] = []
        self.rss_mb: list[float] = []
        self.disk_mb: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        last_sample = 0.0
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                t0 = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    client.get(f"{self.base}/healthz")
                    self.health.append(time.monotonic() - t0)
                if t0 - last_sample >= 1.0:
                    last_sample = t0
                    self.rss_mb.append(_rss_mb(self.proc.popen.pid))
                    self.disk_mb.append(_size_mb(self.data))
                self.stop.wait(0.25)


def _rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _size_mb(folder: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total / 1024**2


# --- the run ------------------------------------------------------------------------


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _final_states(soak: Soak, timeout: float) -> dict[str, dict]:
    """Every accepted job as the service has it now; normal jobs waited for first."""
    deadline = time.monotonic() + timeout
    jobs: dict[str, dict] = {}
    for job_id, tenant in sorted(soak.accepted.items()):
        with soak.client(tenant, timeout=30) as client:
            while True:
                response = client.get(f"/v1/jobs/{job_id}")
                jobs[job_id] = (
                    response.json()
                    if response.status_code == 200
                    else {"status": f"HTTP {response.status_code}"}
                )
                waiting = tenant == "normal" and jobs[job_id].get("status") not in FINAL
                if not waiting or time.monotonic() > deadline:
                    break
                time.sleep(1)
    return jobs


def summarize(soak: Soak, probe: Probe, jobs: dict[str, dict], seconds: float) -> dict:
    normal_ids = {n["id"] for n in soak.normal}
    times = [_server_times(jobs[i]) for i in normal_ids if i in jobs]
    waits = [w for w, _ in times if w is not None]
    runs = [r for _, r in times if r is not None]
    lost = [i for i, job in jobs.items() if job.get("status") not in FINAL | {"queued", "running"}]
    return {
        "seconds": round(seconds, 1),
        "answers": dict(sorted(soak.answers.items())),
        "jobs_accepted": len(jobs),
        "jobs_by_status": dict(Counter(j.get("status") for j in jobs.values())),
        "lost": lost,
        "normal": {
            "submitted": len(normal_ids),
            "succeeded": sum(jobs.get(i, {}).get("status") == "succeeded" for i in normal_ids),
            "not_ended": sum(jobs.get(i, {}).get("status") not in FINAL for i in normal_ids),
            "queue_wait_s": {"median": _median(waits), "max": max(waits, default=None)},
            "run_s": {"median": _median(runs), "max": max(runs, default=None)},
        },
        "healthz_ms": {
            "n": len(probe.health),
            "p50": _ms(_pct(probe.health, 50)),
            "p99": _ms(_pct(probe.health, 99)),
            "max": _ms(max(probe.health, default=None)),
        },
        "api_rss_mb": {"start": _first(probe.rss_mb), "peak": max(probe.rss_mb, default=None)},
        "disk_mb": {"peak": max(probe.disk_mb, default=None), "end": _last(probe.disk_mb)},
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _first(values: list[float]) -> float | None:
    return round(values[0], 1) if values else None


def _last(values: list[float]) -> float | None:
    return round(values[-1], 1) if values else None


def run(args: argparse.Namespace) -> dict:
    hostile = [f"hostile{i}" for i in range(args.hostile)]
    models = {
        "fills": fills_model(args.fills, args.fill_mb),
        "hang": hanging_model(),
        "chain": chain_model(args.nodes),
        "trial": hanging_model(),
        "trickle": chain_model(3000),  # about 60 kB: 50 s at 1.2 KB/s
    }
    env = {
        "AUTOFUSION_JOB_TIME_LIMIT_S": str(args.job_time_limit_s),
        "AUTOFUSION_API_SANDBOX_TIME_LIMIT_S": "20",
    }
    with tempfile.TemporaryDirectory(prefix="soak-", dir=args.workdir) as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o711)  # the sandboxes' user passes through to the data dir
        with service(workdir, [*hostile, "normal"], env) as (base, keys, proc):
            soak, probe = Soak(base, keys, args), Probe(base, proc, workdir / "data")
            threads = [threading.Thread(target=probe.run, daemon=True)]
            threads += [
                threading.Thread(target=soak.hostile, args=(t, models), daemon=True)
                for t in hostile
            ]
            threads.append(threading.Thread(target=soak.normal_tenant, args=("normal",)))
            start_time = time.monotonic()
            for thread in threads:
                thread.start()
            time.sleep(args.seconds)
            soak.stop.set()
            for thread in threads[1:]:
                thread.join(timeout=180)
            jobs = _final_states(soak, timeout=args.drain_s)
            probe.stop.set()
            threads[0].join(timeout=10)
            return summarize(soak, probe, jobs, time.monotonic() - start_time)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hostile", type=int, default=3, help="hostile tenants")
    parser.add_argument("--seconds", type=float, default=180, help="how long they send")
    parser.add_argument("--normal-every", type=float, default=10, help="s between normal jobs")
    parser.add_argument("--fills", type=int, default=100, help="ConstantOfShape fills")
    parser.add_argument("--fill-mb", type=int, default=8, help="MB each fill folds to")
    parser.add_argument("--nodes", type=int, default=200_000, help="nodes of the chain model")
    parser.add_argument("--job-time-limit-s", type=int, default=60)
    parser.add_argument("--drain-s", type=float, default=600, help="wait for normal jobs")
    parser.add_argument("--workdir", default=None, help="where the temporary data dir goes")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 1 if result["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
