"""A bounded load run against a real autofusion service on 127.0.0.1.

For each mode the script starts the service itself, in subprocesses of their own process
groups, with a fresh temporary data dir:

- ``embedded``: ``autofusion serve`` (SQLite, filesystem queue, worker thread in the API).
- ``distributed``: a fresh PostgreSQL database and an empty Redis database number,
  ``autofusion migrate``, then ``autofusion serve --no-embedded-worker`` with
  ``AUTOFUSION_MIGRATE_ON_START=false`` and ``--workers`` ``autofusion worker`` processes
  (prefork, concurrency 1), all sharing the data dir for local artifacts.

It waits for ``/readyz``, then runs the load phase:

- ``--clients`` polling clients, each its own ``httpx.AsyncClient`` (one connection),
  in a closed loop (no think time unless ``--think-ms``): ``GET /v1/jobs/{id}`` of a
  random known job with that client's last ``ETag`` in ``If-None-Match`` (as
  ``autofusion submit`` polls), and every ``--list-every``-th request ``GET /v1/jobs``.
- ``--submissions`` uploads of a tiny Conv+BatchNormalization+Relu model (a few KB, each
  with different weights, so each is a new job), one every ``--submit-interval`` s,
  through ``POST /v1/optimize``; each is followed to its end by its own client polling
  every ``--follow-interval`` s with ``If-None-Match``.

The load phase ends when every submission has ended (or failed to submit), or after
``--duration`` s, whichever comes first; the whole mode is bounded by an overall timeout.
Servers and workers are always stopped (SIGTERM to the group, SIGKILL after a grace
period), the port is checked free, and the PostgreSQL database is dropped and the Redis
database flushed. Prints Markdown tables; ``--json`` writes everything as JSON.

    .venv/bin/python bench/bench_service_load.py --mode both --clients 64 --submissions 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
AUTOFUSION = [
    sys.executable,
    "-c",
    "import sys; from autofusion.app.cli import main; sys.exit(main())",
]
PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
FINAL = {"succeeded", "failed", "cancelled"}
ENDPOINTS = {
    "status": "GET /v1/jobs/{id} (pollers)",
    "list": "GET /v1/jobs (pollers)",
    "submit": "POST /v1/optimize",
    "follow": "GET /v1/jobs/{id} (followers)",
}


# --- the model ----------------------------------------------------------------------


def tiny_model(seed: int) -> bytes:
    """Conv(3->8, 3x3) + BatchNormalization + Relu on 1x3x16x16, weights from ``seed``."""
    rng = np.random.default_rng(seed)
    c_in, c_out = 3, 8

    def init(name: str, array: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(array.astype(np.float32), name)

    inits = [
        init("W", rng.standard_normal((c_out, c_in, 3, 3)) * 0.2),
        init("B", rng.standard_normal(c_out) * 0.1),
        init("scale", rng.uniform(0.5, 1.5, c_out)),
        init("bias", rng.standard_normal(c_out) * 0.1),
        init("mean", rng.standard_normal(c_out) * 0.1),
        init("var", rng.uniform(0.5, 1.5, c_out)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"
        ),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_conv_bn_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, 16, 16])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench_service_load"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


# --- processes ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOFUSION_")}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cpu_seconds(self) -> float | None:
        """CPU s (user + system) of the live processes of this process group, each with
        its reaped children (Linux /proc). Children that ended unreaped are missed."""
        if not self.alive():
            return None
        ticks = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.popen.pid:  # the process group
                ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime .. cstime
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self, grace: float = 20.0) -> str:
        """SIGTERM to the process group, SIGKILL after ``grace`` s. Says how it ended."""
        if self.popen.poll() is not None:
            how = f"had exited ({self.popen.returncode})"
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
                how = f"stopped by SIGTERM ({self.popen.returncode})"
            except subprocess.TimeoutExpired:
                how = "KILLED (ignored SIGTERM)"
        # Whatever is left in the group (sandbox children, prefork pool) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        return how


def start(name: str, argv: list[str], env: dict[str, str], log: Path) -> Proc:
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            AUTOFUSION + argv,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Proc(name, popen, log)


def wait_ready(base: str, procs: list[Proc], timeout: float) -> float:
    """Seconds until ``/readyz`` answers 200; raises if a process exits or time runs out."""
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < timeout:
        for proc in procs:
            if not proc.alive():
                raise RuntimeError(
                    f"{proc.name} exited ({proc.popen.returncode}) before the service was "
                    f"ready; log:\n{proc.log_tail()}"
                )
        try:
            r = httpx.get(f"{base}/readyz", timeout=2)
            if r.status_code == 200:
                return time.monotonic() - t0
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.2)
    raise RuntimeError(f"/readyz not ready after {timeout} s (last: {last})")


@contextlib.contextmanager
def fresh_postgres() -> Iterator[str]:
    from sqlalchemy import create_engine, text

    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    name = f"autofusion_bench_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def empty_redis_db() -> Iterator[str]:
    import redis

    for number in random.sample(range(1, 16), 15):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number, socket_timeout=5)
        if client.dbsize() == 0 and client.set("autofusion-bench-claim", "1", nx=True):
            try:
                yield f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    raise RuntimeError("no empty Redis database number to use")


@dataclass
class Service:
    mode: str
    base: str
    port: int
    procs: list[Proc]
    ready_s: float
    notes: list[str] = field(default_factory=list)


@contextlib.contextmanager
def service(mode: str, workdir: Path, args: argparse.Namespace) -> Iterator[Service]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = workdir / "data"
    procs: list[Proc] = []
    serve = ["serve", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    stops: list[str] = []
    with contextlib.ExitStack() as stack:
        try:
            env = clean_environment()
            if mode == "embedded":
                procs.append(
                    start("api", serve + ["--data-dir", str(data)], env, workdir / "api.log")
                )
            else:
                database = stack.enter_context(fresh_postgres())
                broker = stack.enter_context(empty_redis_db())
                env |= {
                    "AUTOFUSION_DATABASE_URL": database,
                    "AUTOFUSION_BROKER_URL": broker,
                    "AUTOFUSION_DATA_DIR": str(data),
                    "AUTOFUSION_MIGRATE_ON_START": "false",
                }
                done = subprocess.run(
                    AUTOFUSION + ["migrate"],
                    cwd=REPO,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"autofusion migrate failed:\n{done.stderr[-3000:]}")
                procs.append(
                    start("api", serve + ["--no-embedded-worker"], env, workdir / "api.log")
                )
                for i in range(args.workers):
                    procs.append(
                        start(
                            f"worker{i + 1}",
                            ["worker", "--pool", "prefork", "--concurrency", "1"]
                            + ["--loglevel", "WARNING"],
                            env,
                            workdir / f"worker{i + 1}.log",
                        )
                    )
            ready = wait_ready(base, procs, args.startup_timeout)
            yield Service(mode, base, port, procs, ready)
        finally:
            # Workers first (they hold jobs), then the API.
            for proc in sorted(procs, key=lambda p: p.name == "api"):
                stops.append(f"{proc.name}: {proc.stop()}")
            deadline = time.monotonic() + 10
            while port_in_use(port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if port_in_use(port):
                stops.append(f"PORT {port} STILL IN USE after the service was stopped")
            print(f"[{mode}] shutdown: " + "; ".join(stops), file=sys.stderr)


# --- the load -----------------------------------------------------------------------


@dataclass
class Recorder:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    codes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    errors: Counter = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)
    poll_requests: int = 0

    async def request(
        self, client: httpx.AsyncClient, endpoint: str, method: str, url: str, **kw
    ) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            r = await client.request(method, url, **kw)
        except httpx.TimeoutException as exc:
            self._error(f"{endpoint}: timeout ({type(exc).__name__})", repr(exc))
            return None
        except httpx.HTTPError as exc:
            self._error(f"{endpoint}: {type(exc).__name__}", repr(exc))
            return None
        self.latencies[endpoint].append(time.perf_counter() - t0)
        self.codes[endpoint][r.status_code] += 1
        if not (200 <= r.status_code < 300 or r.status_code == 304):
            self._error(f"{endpoint}: HTTP {r.status_code}", r.text[:400])
        return r

    def _error(self, kind: str, sample: str) -> None:
        self.errors[kind] += 1
        self.samples.setdefault(kind, sample)


@dataclass
class JobOutcome:
    index: int
    job_id: str | None
    outcome: str  # succeeded, failed, cancelled, submit failed, unfinished
    e2e_s: float | None = None
    submitted_at: float | None = None
    ended_at: float | None = None
    queue_wait_s: float | None = None
    run_s: float | None = None
    attempts: int | None = None
    error: str | None = None


@dataclass
class LoadState:
    stop: asyncio.Event
    deadline: float
    job_ids: list[str] = field(default_factory=list)
    outcomes: list[JobOutcome] = field(default_factory=list)


def _server_times(job: dict) -> tuple[float | None, float | None]:
    def ts(key: str) -> datetime | None:
        value = job.get(key)
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

    created, started, finished = ts("created_at"), ts("started_at"), ts("finished_at")
    wait = (started - created).total_seconds() if created and started else None
    run = (finished - started).total_seconds() if started and finished else None
    return wait, run


def _client(base: str, args: argparse.Namespace) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base,
        timeout=args.request_timeout,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
    )


async def poller(index: int, base: str, rec: Recorder, state: LoadState, args) -> None:
    rng = random.Random(index)
    etags: dict[str, str] = {}
    think = args.think_ms / 1000
    async with _client(base, args) as client:
        n = 0
        if think:  # clients are not in step: each starts somewhere in its first pause
            await asyncio.sleep(rng.uniform(0, think))
        while not state.stop.is_set():
            n += 1
            if state.job_ids and n % args.list_every != 0:
                job_id = rng.choice(state.job_ids)
                headers = {"If-None-Match": etags[job_id]} if job_id in etags else {}
                r = await rec.request(
                    client, "status", "GET", f"/v1/jobs/{job_id}", headers=headers
                )
                if r is not None and r.status_code == 200 and "ETag" in r.headers:
                    etags[job_id] = r.headers["ETag"]
            else:
                r = await rec.request(client, "list", "GET", "/v1/jobs", params={"limit": 50})
            rec.poll_requests += 1
            if r is None or r.status_code >= 500:
                await asyncio.sleep(0.05)  # no hot loop against a refusing server
            if think:
                await asyncio.sleep(rng.uniform(0.5, 1.5) * think)  # jittered, mean think


async def submission(
    index: int, base: str, rec: Recorder, state: LoadState, args, run_id: str
) -> None:
    await asyncio.sleep(index * args.submit_interval)
    outcome = JobOutcome(index, None, "unfinished")
    state.outcomes.append(outcome)
    model = tiny_model(seed=hash((run_id, index)) & 0xFFFFFFFF)
    async with _client(base, args) as client:
        t0 = time.perf_counter()
        outcome.submitted_at = t0
        r = await rec.request(
            client,
            "submit",
            "POST",
            "/v1/optimize",
            files={"model": (f"tiny_{index}.onnx", model, "application/octet-stream")},
            data={"config": json.dumps({"target": "generic"})},
            headers={"Idempotency-Key": f"bench-{run_id}-{index}"},
        )
        if r is None or r.status_code != 202:
            outcome.outcome = "submit failed"
            outcome.error = "no answer" if r is None else f"HTTP {r.status_code}: {r.text[:300]}"
            return
        job = r.json()
        outcome.job_id = job["id"]
        state.job_ids.append(job["id"])
        etag = r.headers.get("ETag", "")
        while job["status"] not in FINAL:
            if time.perf_counter() > state.deadline or state.stop.is_set():
                return
            await asyncio.sleep(args.follow_interval)
            r = await rec.request(
                client, "follow", "GET", f"/v1/jobs/{job['id']}", headers={"If-None-Match": etag}
            )
            if r is not None and r.status_code == 200:
                job, etag = r.json(), r.headers.get("ETag", "")
        outcome.ended_at = time.perf_counter()
        outcome.e2e_s = outcome.ended_at - t0
        outcome.outcome = job["status"]
        outcome.attempts = job.get("attempts")
        outcome.error = job.get("error")
        outcome.queue_wait_s, outcome.run_s = _server_times(job)


async def run_load(svc: Service, args: argparse.Namespace) -> dict:
    rec = Recorder()
    t0 = time.perf_counter()
    state = LoadState(stop=asyncio.Event(), deadline=t0 + args.duration)
    run_id = uuid.uuid4().hex[:8]
    cpu0 = {p.name: p.cpu_seconds() for p in svc.procs}
    client_cpu0 = time.process_time()
    pollers = [
        asyncio.create_task(poller(i, svc.base, rec, state, args)) for i in range(args.clients)
    ]
    submissions = [
        asyncio.create_task(submission(i, svc.base, rec, state, args, run_id))
        for i in range(args.submissions)
    ]
    try:
        left = max(0.0, state.deadline - time.perf_counter())
        if submissions:
            await asyncio.wait_for(asyncio.gather(*submissions), timeout=left)
        else:
            await asyncio.sleep(left)  # polling only: the whole --duration
    except TimeoutError:
        pass
    finally:
        state.stop.set()
        elapsed = time.perf_counter() - t0
        for task in submissions:
            task.cancel()
        # Pollers finish their request in flight (bounded by the request timeout).
        done, pending = await asyncio.wait(pollers, timeout=args.request_timeout + 5)
        for task in pending:
            task.cancel()
    client_cpu = time.process_time() - client_cpu0
    cpu = {}
    for p in svc.procs:
        now = p.cpu_seconds()
        cpu[p.name] = None if now is None or cpu0[p.name] is None else now - cpu0[p.name]
    for task in pollers:
        if task.done() and not task.cancelled() and task.exception():
            rec._error(f"poller crashed: {type(task.exception()).__name__}", repr(task.exception()))
    return summarize(svc, args, rec, state, elapsed, cpu, client_cpu)


# --- numbers ------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def scan_logs(procs: list[Proc]) -> dict:
    """Counts of warning/error lines in the service logs, and the most frequent ones."""
    lines: Counter = Counter()
    counts: Counter = Counter()
    for proc in procs:
        text = proc.log.read_text(errors="replace") if proc.log.exists() else ""
        for line in text.splitlines():
            if "database is locked" in line:
                counts["database is locked"] += 1
            if line.startswith("Traceback"):
                counts["Traceback"] += 1
            if re.match(r"[\w.]+(Error|Exception|Timeout)\w*: ", line):  # a traceback's last line
                lines[f"{proc.name}: {line.strip()[:240]}"] += 1
            if re.search(r"\b(ERROR|CRITICAL)\b", line):
                counts["ERROR lines"] += 1
                lines[f"{proc.name}: {re.sub(r'[0-9a-f]{32}', '<id>', line.strip())[:240]}"] += 1
            elif re.search(r"\bWARNING\b", line):
                counts["WARNING lines"] += 1
                lines[f"{proc.name}: {re.sub(r'[0-9a-f]{32}', '<id>', line.strip())[:240]}"] += 1
    return {"counts": dict(counts), "top": lines.most_common(8)}


def summarize(svc, args, rec: Recorder, state: LoadState, elapsed, cpu, client_cpu) -> dict:
    outcomes = sorted(state.outcomes, key=lambda o: o.index)
    ended = [o for o in outcomes if o.outcome in FINAL]
    succeeded = [o for o in outcomes if o.outcome == "succeeded"]
    by_outcome = Counter(o.outcome for o in outcomes)
    by_outcome["not started"] = args.submissions - len(outcomes)
    if not by_outcome["not started"]:
        del by_outcome["not started"]
    if ended:
        span = max(o.ended_at for o in ended) - min(o.submitted_at for o in outcomes)
        per_min = len(succeeded) / span * 60 if span > 0 else None
    else:
        span, per_min = None, None
    e2e = [o.e2e_s for o in succeeded]
    waits = [o.queue_wait_s for o in succeeded if o.queue_wait_s is not None]
    runs = [o.run_s for o in succeeded if o.run_s is not None]
    endpoints = {}
    for key, label in ENDPOINTS.items():
        lat = rec.latencies.get(key, [])
        endpoints[key] = {
            "label": label,
            "requests": len(lat),
            "codes": dict(sorted(rec.codes.get(key, Counter()).items())),
            "p50_ms": _ms(pct(lat, 50)),
            "p90_ms": _ms(pct(lat, 90)),
            "p99_ms": _ms(pct(lat, 99)),
            "max_ms": _ms(max(lat) if lat else None),
            "per_s": len(lat) / elapsed if elapsed else None,
        }
    return {
        "mode": svc.mode,
        "workers": args.workers if svc.mode == "distributed" else "1 (thread in the API)",
        "clients": args.clients,
        "submissions": args.submissions,
        "ready_s": round(svc.ready_s, 2),
        "load_s": round(elapsed, 2),
        "poll_requests": rec.poll_requests,
        "poll_per_s": rec.poll_requests / elapsed if elapsed else None,
        "jobs": dict(by_outcome),
        "jobs_span_s": span,
        "jobs_per_min": per_min,
        "e2e_p50_s": pct(e2e, 50),
        "e2e_p99_s": pct(e2e, 99),
        "queue_wait_p50_s": pct(waits, 50),
        "run_p50_s": pct(runs, 50),
        "run_p99_s": pct(runs, 99),
        "endpoints": endpoints,
        "errors": dict(rec.errors.most_common()),
        "error_samples": rec.samples,
        "cpu_s": {**cpu, "bench client": client_cpu},
        "logs": scan_logs(svc.procs),
        "outcomes": [o.__dict__ for o in outcomes],
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _f(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    out = [
        f"clients {args.clients}, submissions {args.submissions} (one every "
        f"{args.submit_interval} s), list every {args.list_every}th poll, think "
        f"{args.think_ms} ms, max load phase {args.duration} s, request timeout "
        f"{args.request_timeout} s",
        "",
        "| mode | workers | load s | poll requests | poll req/s | jobs | jobs/min | "
        "e2e p50 s | e2e p99 s | queue wait p50 s | run p50 s | errors |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        jobs = ", ".join(f"{k} {v}" for k, v in r["jobs"].items())
        out.append(
            f"| {r['mode']} | {r['workers']} | {_f(r['load_s'])} | {r['poll_requests']} | "
            f"{_f(r['poll_per_s'])} | {jobs} | {_f(r['jobs_per_min'])} | "
            f"{_f(r['e2e_p50_s'], 2)} | {_f(r['e2e_p99_s'], 2)} | "
            f"{_f(r['queue_wait_p50_s'], 2)} | {_f(r['run_p50_s'], 2)} | "
            f"{sum(r['errors'].values())} |"
        )
    out += [
        "",
        "| mode | endpoint | requests | req/s | status codes | p50 ms | p90 ms | p99 ms | max ms |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for e in r["endpoints"].values():
            codes = ", ".join(f"{k}: {v}" for k, v in e["codes"].items()) or "-"
            out.append(
                f"| {r['mode']} | {e['label']} | {e['requests']} | {_f(e['per_s'])} | {codes} | "
                f"{_f(e['p50_ms'])} | {_f(e['p90_ms'])} | {_f(e['p99_ms'])} | "
                f"{_f(e['max_ms'])} |"
            )
    out += ["", "| mode | error kind | count | first sample |", "| --- | --- | ---: | --- |"]
    for r in results:
        if not r["errors"]:
            out.append(f"| {r['mode']} | none | 0 | |")
        for kind, count in r["errors"].items():
            sample = r["error_samples"].get(kind, "").replace("|", "\\|").replace("\n", " ")
            out.append(f"| {r['mode']} | {kind} | {count} | `{sample[:160]}` |")
    out += [
        "",
        "| mode | CPU s during the load phase | server log |",
        "| --- | --- | --- |",
    ]
    for r in results:
        cpu = ", ".join(f"{k} {_f(v)}" for k, v in r["cpu_s"].items())
        logs = ", ".join(f"{k} {v}" for k, v in r["logs"]["counts"].items()) or "clean"
        out.append(f"| {r['mode']} | {cpu} | {logs} |")
    notes = []
    for r in results:
        bad = Counter(
            (o["outcome"], ((o["error"] or "").strip().splitlines() or [""])[-1])
            for o in r["outcomes"]
            if o["outcome"] != "succeeded"
        )
        for (outcome, error), count in bad.items():
            notes.append(f"- {r['mode']}: {count} submission(s) {outcome} {error or ''}".rstrip())
        for line, count in r["logs"]["top"]:
            notes.append(f"- {r['mode']} log x{count}: `{line}`")
    if notes:
        out += ["", *notes]
    return "\n".join(out)


# --- main ---------------------------------------------------------------------------


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"af-load-{mode}-") as tmp:
        workdir = Path(tmp)
        with service(mode, workdir, args) as svc:
            print(
                f"[{mode}] ready in {svc.ready_s:.1f} s on {svc.base}; load phase "
                f"(at most {args.duration} s)...",
                file=sys.stderr,
            )
            httpx.get(f"{svc.base}/v1/jobs", timeout=30).raise_for_status()  # warm-up
            result = asyncio.run(asyncio.wait_for(run_load(svc, args), timeout=args.duration + 60))
            if args.keep_logs:
                keep = Path(args.keep_logs) / mode
                keep.mkdir(parents=True, exist_ok=True)
                for proc in svc.procs:
                    (keep / proc.log.name).write_bytes(proc.log.read_bytes())
        # Logs are complete once the processes have stopped.
        result["logs"] = scan_logs(svc.procs)
        return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mode", choices=["embedded", "distributed", "both"], default="both")
    p.add_argument("--clients", type=int, default=64, help="polling clients (default 64)")
    p.add_argument("--submissions", type=int, default=20, help="jobs submitted (default 20)")
    p.add_argument("--submit-interval", type=float, default=1.0, help="s between submissions")
    p.add_argument("--duration", type=float, default=120.0, help="longest load phase, s")
    p.add_argument("--list-every", type=int, default=5, help="every Nth poll lists the jobs")
    p.add_argument(
        "--think-ms",
        type=float,
        default=0.0,
        help="mean pause between a client's polls (jittered +-50%%)",
    )
    p.add_argument("--follow-interval", type=float, default=0.5, help="s between follower polls")
    p.add_argument("--request-timeout", type=float, default=60.0, help="per request, s")
    p.add_argument("--workers", type=int, default=2, help="distributed: worker processes")
    p.add_argument("--startup-timeout", type=float, default=90.0, help="s to wait for /readyz")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--keep-logs", metavar="DIR", help="copy the service logs here")
    args = p.parse_args(argv)
    if args.clients < 0 or args.submissions < 0 or args.list_every < 1:
        p.error("--clients and --submissions must be >= 0, --list-every >= 1")

    # SIGTERM (a CI timeout, a kill) unwinds like Ctrl-C, so the finally blocks stop
    # the servers and workers.
    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    modes = ["embedded", "distributed"] if args.mode == "both" else [args.mode]
    results = []
    for mode in modes:
        try:
            results.append(run_mode(mode, args))
        except Exception as exc:  # one mode failing should not lose the other's numbers
            print(f"[{mode}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            results.append({"mode": mode, "failed": f"{type(exc).__name__}: {exc}"})
    ok = [r for r in results if "failed" not in r]
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}\n")
    if ok:
        print(markdown(ok, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
