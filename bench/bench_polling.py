"""Job polling latency: ``--clients`` pollers of ``GET /v1/jobs/{id}`` for ``--duration`` s.

Issue 15, item 9: 20 pollers for 30 s had p95 308 ms embedded and 362 ms distributed
(about six database round trips per poll). This measures the same read on a keyed
server (``--require-api-keys``, one key, as a CI fleet polls):

- ``embedded``: ``autofusion serve`` (SQLite, filesystem queue, the worker thread).
- ``distributed``: a fresh PostgreSQL database and an empty Redis database number,
  ``autofusion migrate``, then ``autofusion serve --no-embedded-worker`` (no worker: the
  jobs stay queued, which is what a poll reads most of the time anyway).

``--jobs`` tiny models are submitted first; then each poller, its own
``httpx.AsyncClient`` (one connection), polls a random one of them in a closed loop,
sending its last ``ETag`` in ``If-None-Match`` as ``autofusion submit`` does. An error
is any answer other than 200/304, or a transport error. Prints a Markdown table (p50,
p95, p99, max in ms, requests, errors); ``--json`` writes the numbers.

    .venv/bin/python bench/bench_polling.py --mode both --clients 20 --duration 30
    .venv/bin/python bench/bench_polling.py --interval-ms 100   # paced: 200 polls/s offered
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_service_load import (  # the sibling script, found by path
    AUTOFUSION,
    REPO,
    clean_environment,
    empty_redis_db,
    free_port,
    fresh_postgres,
    start,
    tiny_model,
    wait_ready,
)


def _cli(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        AUTOFUSION + argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"autofusion {argv[0]} failed:\n{done.stderr[-3000:]}")
    return done.stdout


@contextlib.contextmanager
def keyed_service(mode: str, workdir: Path) -> Iterator[tuple[str, str]]:
    """``(base URL, API key)`` of a fresh server of ``mode``; stopped afterwards."""
    port = free_port()
    env = clean_environment() | {"AUTOFUSION_DATA_DIR": str(workdir / "data")}
    serve = ["serve", "--port", str(port), "--log-level", "warning", "--require-api-keys"]
    with contextlib.ExitStack() as stack:
        if mode == "distributed":
            env |= {
                "AUTOFUSION_DATABASE_URL": stack.enter_context(fresh_postgres()),
                "AUTOFUSION_BROKER_URL": stack.enter_context(empty_redis_db()),
                "AUTOFUSION_MIGRATE_ON_START": "false",
            }
            serve.append("--no-embedded-worker")
        _cli(["migrate"], env)
        key = _cli(["keys", "create", "--tenant", "bench", "--name", "bench"], env).split()[-1]
        proc = start("api", serve, env, workdir / "api.log")
        try:
            wait_ready(f"http://127.0.0.1:{port}", [proc], 90)
            yield f"http://127.0.0.1:{port}", key
        finally:
            proc.stop()


def submit_jobs(base: str, key: str, count: int) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    ids = []
    for seed in range(count):
        files = {"model": (f"m{seed}.onnx", tiny_model(seed), "application/octet-stream")}
        response = httpx.post(f"{base}/v1/optimize", files=files, headers=headers, timeout=60)
        response.raise_for_status()
        ids.append(response.json()["id"])
    return ids


async def poll(base: str, key: str, ids: list[str], duration: float) -> tuple[list, Counter]:
    latencies: list[float] = []
    outcomes: Counter = Counter()
    deadline = time.monotonic() + duration

    async def poller(seed: int) -> None:
        rng = random.Random(seed)
        etags: dict[str, str] = {}
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            while time.monotonic() < deadline:
                job_id = rng.choice(ids)
                headers = {"Authorization": f"Bearer {key}"}
                if job_id in etags:
                    headers["If-None-Match"] = etags[job_id]
                start_t = time.perf_counter()
                try:
                    response = await client.get(f"/v1/jobs/{job_id}", headers=headers)
                except httpx.HTTPError as exc:
                    outcomes[type(exc).__name__] += 1
                    continue
                latencies.append(time.perf_counter() - start_t)
                outcomes[response.status_code] += 1
                if "etag" in response.headers:
                    etags[job_id] = response.headers["etag"]
                if ARGS.interval_ms > 0:  # paced: the next poll starts an interval later
                    pause = ARGS.interval_ms / 1000 - (time.perf_counter() - start_t)
                    await asyncio.sleep(max(0.0, pause) * rng.uniform(0.5, 1.5))

    await asyncio.gather(*(poller(k) for k in range(ARGS.clients)))
    return latencies, outcomes


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run_mode(mode: str) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix=f"bench-polling-{mode}-") as tmp,
        keyed_service(mode, Path(tmp)) as (base, key),
    ):
        ids = submit_jobs(base, key, ARGS.jobs)
        load0 = os.getloadavg()[0]
        latencies, outcomes = asyncio.run(poll(base, key, ids, ARGS.duration))
    errors = sum(n for code, n in outcomes.items() if code not in (200, 304))
    ms = [1000 * v for v in latencies]
    return {
        "mode": mode,
        "requests": len(latencies) + sum(n for c, n in outcomes.items() if isinstance(c, str)),
        "errors": errors,
        "outcomes": {str(k): v for k, v in outcomes.items()},
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "rps": len(latencies) / ARGS.duration,
        "load_average_at_start": load0,
    }


def markdown(results: list[dict]) -> str:
    lines = [
        f"{ARGS.clients} pollers for {ARGS.duration:g} s, {ARGS.jobs} jobs, keyed server, "
        + (f"one poll per {ARGS.interval_ms:g} ms each" if ARGS.interval_ms else "closed loop"),
        "",
        "| mode | requests | req/s | errors | p50 ms | p95 ms | p99 ms | max ms | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['mode']} | {r['requests']} | {r['rps']:.0f} | {r['errors']} | "
            f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
            f"{r['load_average_at_start']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["embedded", "distributed", "both"], default="both")
    p.add_argument("--clients", type=int, default=20, help="pollers (default 20)")
    p.add_argument("--duration", type=float, default=30.0, help="s of polling (default 30)")
    p.add_argument("--jobs", type=int, default=5, help="jobs submitted and polled (default 5)")
    p.add_argument(
        "--interval-ms",
        type=float,
        default=0.0,
        help="each poller's mean interval between polls (jittered +-50%%); 0 (default): a "
        "closed loop, where latency is the server's queue at its throughput",
    )
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ARGS = p.parse_args(argv)
    modes = ["embedded", "distributed"] if ARGS.mode == "both" else [ARGS.mode]
    results = [run_mode(mode) for mode in modes]
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}\n")
    print(markdown(results))
    if ARGS.json:
        Path(ARGS.json).write_text(json.dumps({"args": vars(ARGS), "results": results}, indent=2))
    return 0 if all(r["errors"] == 0 for r in results) else 1


ARGS = argparse.Namespace()

if __name__ == "__main__":
    sys.exit(main())
