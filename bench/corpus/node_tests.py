"""The ONNX backend test models: a thousand small graphs, one per operator and corner case.

They are the cheapest way to meet every operator, attribute spelling, subgraph (If,
Loop, Scan) and dtype a user's model may contain, so the corpus tier feeds each of them
through ``autofusion optimize`` and fails on any traceback (issue 13, part 3).

Two sources, both from the package registry:

* the installed ``onnx`` package's own test models (``data/light``, ``simple``,
  ``pytorch-converted``, ``pytorch-operator``), read where they are installed;
* the per-operator node tests (``data/node/*/model.onnx``). onnx's 1.23 wheels no
  longer ship them and its sdist cannot be downloaded without building it, so they
  come from the pinned ``onnx==1.17.0`` wheel (1288 tests; opsets up to 22), extracted
  once into ``<cache>/onnx-node-tests/<test>/model.onnx``.

    python bench/corpus/node_tests.py [--cache DIR]     # extract; prints the count
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import zipfile
from pathlib import Path

import fetch_wheels
import meta
import onnx

log = logging.getLogger("node_tests")

NODE_TESTS_PIN = "onnx==1.17.0"
NODE_DIR = "onnx-node-tests"
_MEMBER = re.compile(r"^onnx/backend/test/data/node/([^/]+)/model\.onnx$")
_INSTALLED_SETS = ("light", "simple", "pytorch-converted", "pytorch-operator")
_STAMP = ".complete"


def installed_models() -> list[Path]:
    """The test models inside the installed onnx package (no weights-less stubs)."""
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    found: list[Path] = []
    for name in _INSTALLED_SETS:
        found.extend(sorted((data / name).glob("**/*.onnx")))
    return found


def node_dir(cache: Path) -> Path:
    return cache / NODE_DIR


def extract(cache: Path) -> int:
    """Extract the node tests from the pinned onnx wheel once; returns how many there are."""
    target = node_dir(cache)
    stamp = target / _STAMP
    if stamp.is_file() and stamp.read_text().strip() == NODE_TESTS_PIN:
        return len(node_models(cache))
    archive = _download_wheel(cache / "wheels")
    count = 0
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            match = _MEMBER.match(member)
            if not match:
                continue
            out = target / match.group(1) / meta.MODEL_FILE
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(zf.read(member))
            count += 1
    (target / _STAMP).write_text(NODE_TESTS_PIN + "\n")
    log.info("extracted %d node tests from %s", count, archive.name)
    return count


def _download_wheel(wheels: Path) -> Path:
    """The binary wheel of the pin (``pip download --only-binary``: never built here)."""
    return fetch_wheels.download(wheels, NODE_TESTS_PIN, binary_only=True)


def node_models(cache: Path) -> list[Path]:
    """The extracted node tests (empty until ``extract`` ran)."""
    return sorted(node_dir(cache).glob(f"*/{meta.MODEL_FILE}"))


def all_models(cache: Path) -> dict[str, Path]:
    """Readable id -> model path, installed-package tests first, then the node tests."""
    data = Path(onnx.__file__).parent / "backend" / "test" / "data"
    named = {
        str(p.relative_to(data).with_suffix("")).replace("/model", ""): p
        for p in installed_models()
    }
    named.update({f"node/{p.parent.name}": p for p in node_models(cache)})
    return named


def _op_set(graph: onnx.GraphProto, found: set) -> set:
    for node in graph.node:
        found.add((node.domain, node.op_type))
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _op_set(sub, found)
    return found


def _has_subgraph(graph: onnx.GraphProto) -> bool:
    return any(a.HasField("g") or a.graphs for n in graph.node for a in n.attribute)


def sample(models: dict[str, Path]) -> dict[str, Path]:
    """One model per distinct set of op types (the first by name), plus every model
    with a subgraph (If/Loop/Scan bodies are where pre-passes break): about 290 of
    1437, each operator still met at least once."""
    chosen: dict[str, Path] = {}
    seen: set[frozenset] = set()
    for name, path in sorted(models.items()):
        graph = onnx.load(str(path), load_external_data=False).graph
        ops = frozenset(_op_set(graph, set()))
        if ops not in seen or _has_subgraph(graph):
            seen.add(ops)
            chosen[name] = path
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache",
        help="corpus cache (default $AUTOFUSION_CORPUS_DIR or ~/.cache/autofusion-corpus)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cache = meta.cache_dir(args.cache)
    try:
        count = extract(cache)
    except fetch_wheels.FetchError as exc:
        log.error("%s", exc)
        return 1
    log.info("%d node tests, %d installed test models", count, len(installed_models()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
