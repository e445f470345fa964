"""N uploads of a big-node-count model at once against an embedded server (issue 26,
item 3): the API process's RSS and ``/healthz`` latency while their checks run.

Eight concurrent 26 MB, 1M-node uploads took the API from 253 MB to a 5.5 GB peak when it
checked them in its own threads. Each upload here comes from its own tenant (its own
key), as the issue's did; the checks run in sandboxes, ``api_sandbox_concurrency`` at
once, the rest wait ``api_sandbox_queue_s`` for a slot.

    .venv/bin/python bench/bench_upload_burst.py --uploads 8 --nodes 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_soak import Probe, _pct, chain_model, service


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uploads", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--queue-s", type=float, default=120, help="api_sandbox_queue_s")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    model = chain_model(args.nodes)
    tenants = [f"t{i}" for i in range(args.uploads)]
    env = {"AUTOFUSION_API_SANDBOX_QUEUE_S": str(args.queue_s), "AUTOFUSION_EMBEDDED_WORKER": "0"}
    with tempfile.TemporaryDirectory(prefix="burst-", dir=args.workdir) as tmp:
        os.chmod(tmp, 0o711)
        with service(Path(tmp), tenants, env) as (base, keys, proc):
            probe = Probe(base, proc, Path(tmp) / "data")
            watcher = threading.Thread(target=probe.run, daemon=True)
            watcher.start()
            time.sleep(3)

            def upload(tenant: str) -> tuple[int, float]:
                headers = {"Authorization": f"Bearer {keys[tenant]}"}
                files = {"model": ("chain.onnx", model, "application/octet-stream")}
                start = time.monotonic()
                with httpx.Client(base_url=base, headers=headers, timeout=600) as client:
                    response = client.post("/v1/optimize", files=files)
                return response.status_code, time.monotonic() - start

            with ThreadPoolExecutor(args.uploads) as pool:
                answers = list(pool.map(upload, tenants))
            time.sleep(2)
            probe.stop.set()
            watcher.join(timeout=10)
    result = {
        "model_mb": round(len(model) / 1024**2, 1),
        "nodes": args.nodes,
        "answers": dict(Counter(status for status, _ in answers)),
        "seconds": sorted(round(s, 1) for _, s in answers),
        "api_rss_mb": {"start": round(probe.rss_mb[0], 1), "peak": round(max(probe.rss_mb), 1)},
        "healthz_ms": {
            "p50": round(_pct(probe.health, 50) * 1000, 1),
            "p99": round(_pct(probe.health, 99) * 1000, 1),
            "max": round(max(probe.health) * 1000, 1),
        },
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
