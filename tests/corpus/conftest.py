"""The corpus tier's plumbing: the ``corpus`` marker, the CLI, the node-test batch runs.

Everything under tests/corpus is marked ``corpus`` here, so ``make test`` (``-m "not
corpus"``) never runs it and never needs the cache; ``make test-corpus`` builds the
cache (``bench/corpus/build.py``) and runs ``pytest -m corpus tests/corpus``.

The tier reads the cache named by ``$AUTOFUSION_CORPUS_DIR`` (default
``~/.cache/autofusion-corpus``) and writes what it measured (exit code, seconds,
fusions, max abs diff per model and target; the node tests' exit codes) to
``<cache>/tier-results.json`` for the report and ``bench/bench_corpus.py``.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from corpus_tier import (
    CACHE,
    CALL_TIMEOUT,
    HERE,
    REPO,
    RESULTS,
    WORKERS,
    optimize,
    optimized_path,
)


def _selected_node_jobs(session, tmp: Path) -> list[dict]:
    jobs = []
    for item in session.items:
        spec = getattr(item, "callspec", None)
        if spec is None or "node_case" not in spec.params:
            continue
        name, path, target = spec.params["node_case"]
        jobs.append(
            {
                "id": name,
                "model": str(path),
                "target": target,
                "out": str(tmp / f"{len(jobs)}.onnx"),
            }
        )
    return jobs


def _run_batches(jobs: list[dict], tmp: Path) -> list[dict]:
    """``cli_batch.py`` in WORKERS processes, jobs dealt round-robin; their results."""
    procs = []
    for worker in range(max(1, WORKERS)):
        chunk = jobs[worker :: max(1, WORKERS)]
        if not chunk:
            continue
        job_file, result_file = tmp / f"jobs{worker}.jsonl", tmp / f"results{worker}.jsonl"
        job_file.write_text("".join(json.dumps(j) + "\n" for j in chunk))
        cmd = [
            sys.executable,
            str(HERE / "cli_batch.py"),
            str(job_file),
            str(result_file),
            "--call-timeout",
            str(CALL_TIMEOUT),
        ]
        procs.append((subprocess.Popen(cmd, cwd=REPO), result_file, len(chunk)))
    results = []
    for proc, result_file, count in procs:
        try:
            proc.wait(timeout=CALL_TIMEOUT * count + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if result_file.is_file():
            results.extend(json.loads(line) for line in result_file.read_text().splitlines())
    return results


@pytest.fixture(scope="session")
def node_results(request) -> dict[tuple[str, str], dict]:
    """Run every selected node-test case once, in batches; (id, target) -> result."""
    with tempfile.TemporaryDirectory(prefix="autofusion-node-") as tmp:
        jobs = _selected_node_jobs(request.session, Path(tmp))
        results = _run_batches(jobs, Path(tmp))
    by_case = {(r["id"], r["target"]): r for r in results}
    RESULTS["node_tests"] = {
        f"{k[0]}-{k[1]}": {"rc": v["rc"], "seconds": v["seconds"]} for k, v in by_case.items()
    }
    return by_case


@pytest.fixture(scope="session")
def model_runs(request, tmp_path_factory) -> dict[tuple[str, str], tuple]:
    """Every selected corpus case optimized once, WORKERS CLI processes at a time (the
    CLI is mostly one busy core); (model name, target) -> (process, report, seconds,
    optimized model path)."""
    cases = {}  # test_model and test_decode share a run
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if spec is None or "info" not in spec.params or isinstance(spec.params["info"], Exception):
            continue
        info, target = spec.params["info"], spec.params["target"]
        cases[(info.name, target)] = (spec.params["path"], info, target)
    root = tmp_path_factory.mktemp("corpus")

    def run(case):
        path, info, target = case
        tmp = root / f"{info.name}-{target}"
        tmp.mkdir()
        return (info.name, target), (*optimize(path, info, target, tmp), optimized_path(tmp))

    with ThreadPoolExecutor(max_workers=max(1, WORKERS)) as pool:
        return dict(pool.map(run, cases.values()))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.corpus)


def pytest_terminal_summary(terminalreporter):
    if not RESULTS["models"] and not RESULTS["node_tests"]:
        return
    models = RESULTS["models"].values()
    if models:  # issue 25's goals: no step taken back as a bug, no fallback
        rejected = sum(r.get("rejected", 0) for r in models)
        fallbacks = sum(1 for r in models if r.get("fallback"))
        terminalreporter.write_line(
            f"corpus tier: {len(models)} model runs, {rejected} step(s) taken back as bugs, "
            f"{fallbacks} fallback(s)"
        )
    codes = collections.Counter(str(r["rc"]) for r in RESULTS["node_tests"].values())
    if codes:
        terminalreporter.write_line(
            f"corpus tier: node tests' exit codes {dict(sorted(codes.items()))}"
        )
    out = CACHE / "tier-results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=1, sort_keys=True) + "\n")
    terminalreporter.write_line(f"corpus tier: results in {out}")
