"""Export issue 17's LLM decoders: prefill and KV-cache graphs, with a greedy reference.

Why: autofusion must fuse the decoders users deploy (``_llm_families.py``: Llama, Qwen2,
Mistral, Phi-3, Gemma; 2 layers, hidden 256, 8/2 heads, random weights) from every way
they are exported, and keep their logits at every step of a decode. Per family:

* ``llm_<family>_torchscript``: prefill (``input_ids``, ``attention_mask`` -> ``logits``),
  ``torch.onnx.export(dynamo=False)``, opset 17, dynamic batch and sequence;
* ``llm_<family>_dynamo``: the same with ``dynamo=True``, opset 18 (onnxscript's
  optimizer on, the exporter's default);
* ``llm_<family>_dynamo_kv``: a decode graph with the KV cache, ``dynamo=True``: a
  wrapper takes the pasts as tensors (``past_key_values.<i>.key|value``, [batch, kv
  heads, past, head dim]), fills a ``DynamicCache`` and returns the logits and the
  presents (``present.<i>.key|value``), the names optimum uses;
* ``llm_<family>_optimum_kv``: optimum-onnx's ``text-generation-with-past`` export of a
  ``save_pretrained`` folder, in the side venv (``_llm_optimum.py``).

Every model is checked with ``onnx.checker`` and by a 4-step greedy decode in
onnxruntime with its optimizations off (``llm_decode.py``) against torch's logits
(atol 1e-4, rtol 1e-4), and written to ``<cache>/models/<name>/`` with its
``decode.npz`` (the decode's inputs and torch's logits) and a ``meta.json`` whose
expectations come from ``_llm_expect.py``. A model already built from the same source
is not exported again, but its expectations are rewritten (cheap), so tightening
``_llm_expect.py`` takes effect on the next build.

``--bench`` instead builds the benchmark model of issue 17 (not built by CI): a
4-layer, hidden-512, 8/2-head Llama exported by optimum with a KV cache
(``llm_bench_llama_optimum_kv``, ``bench_only``), beside its ``save_pretrained`` folder
``hf/`` for onnxruntime-genai's model builder.

    python bench/corpus/export_llm.py [--cache DIR] [--only NAME ...] [--force] [--bench]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _llm_expect
import _llm_families as fam
import _torch_kvcache
import _torch_sidevenv as sidevenv
import llm_decode
import meta
import numpy as np
import onnx
from _torch_check import EXPORT_ERRORS, ExportCheckError, ExportLog, check_file

log = logging.getLogger("export_llm")
HERE = Path(__file__).resolve().parent
RECIPE = 1  # bump when the export recipe changes: every model is then rebuilt
TORCHSCRIPT_OPSET, DYNAMO_OPSET = 17, 18
KINDS = fam.KINDS
EXPORTER = {
    "torchscript": "torch-torchscript",
    "dynamo": "torch-dynamo",
    "dynamo_kv": "torch-dynamo",
    "optimum_kv": "torch-torchscript",  # what optimum-onnx calls under the hood
}
BENCH_NAME = "llm_bench_llama_optimum_kv"
# intermediate 1376 (Llama's 8/3, rounded to 32) and vocabulary 8192: a decode step
# streams about 61 MB of weights, as the model did
BENCH_SIZES = dict(
    num_hidden_layers=4,
    hidden_size=512,
    intermediate_size=1376,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=8192,
    max_position_embeddings=2048,
)
# the dynamo KV graph names its dims after torch.export's Dims: the check needs
# attention_mask's total = past + sequence, so it gets consistent profiles
KV_SHAPES = [
    {"batch": 1, "sequence_length": 4, "past_sequence_length": 3, "total_sequence_length": 7},
    {"batch": 2, "sequence_length": 1, "past_sequence_length": 6, "total_sequence_length": 7},
]


def families() -> list[str]:
    return list(_llm_expect.FAMILIES)


def all_names() -> list[str]:
    """Every family's variants (``Family.kinds``) but those it says are not made."""
    return [
        f"llm_{family}_{kind}"
        for family, spec in fam.FAMILIES.items()
        for kind in spec.kinds
        if kind not in spec.skipped
    ]


def not_made() -> dict[str, str]:
    """The variants a family does not make: name -> why (``Family.skipped``)."""
    return {
        f"llm_{family}_{kind}": why
        for family, spec in fam.FAMILIES.items()
        for kind, why in spec.skipped.items()
    }


def split_name(name: str) -> tuple[str, str]:
    rest = name.removeprefix("llm_")
    for kind in sorted(KINDS, key=len, reverse=True):
        if rest.endswith("_" + kind):
            return rest[: -len(kind) - 1], kind
    raise ValueError(f"not an LLM corpus name: {name}")


def _torch_pin() -> str:
    import importlib.metadata as md

    return f"torch=={md.version('torch')} transformers=={md.version('transformers')}"


def source(name: str) -> dict:
    family, kind = split_name(name)
    if kind == "optimum_kv":
        pin, exporter = " ".join(_torch_kvcache.PINS[:4]), "optimum-cli text-generation-with-past"
    else:
        pin, exporter = _torch_pin(), kind
    return {
        "kind": "export",
        "pin": pin,
        "config": _llm_expect.config_text(family),
        "exporter": exporter,
        "recipe": RECIPE,
    }


def model_meta(name: str, path: Path, diffs: dict[str, float]) -> meta.ModelMeta:
    family, kind = split_name(name)
    graph = onnx.load(str(path), load_external_data=False)
    expected, expected_ops, notes = _llm_expect.expected(family, kind, graph)
    return meta.ModelMeta(
        name=name,
        family=family,
        source=source(name),
        exporter=EXPORTER[kind],
        **meta.describe(path),
        expected=expected,
        expected_ops=expected_ops,
        shapes=KV_SHAPES if kind == "dynamo_kv" else [],
        atol=llm_decode.ATOL,
        rtol=llm_decode.RTOL,
        decode=llm_decode.DECODE_FILE,
        notes=(
            f"{notes} Greedy decode (7-token prompt, 4 steps) in onnxruntime with its "
            f"optimizations off vs torch: max abs diff {diffs['original_vs_torch']:.2g} "
            f"(atol {llm_decode.ATOL}, rtol {llm_decode.RTOL})."
        ),
    )


def install(models: Path, name: str, folder: Path) -> meta.ModelMeta:
    """Check ``folder``'s model.onnx + decode.npz and move them into the corpus."""
    path = folder / meta.MODEL_FILE
    check_file(path)
    diffs, problems = llm_decode.check_decode(folder)
    if problems:
        raise ExportCheckError(f"{name}: " + "; ".join(problems))
    entry = model_meta(name, path, diffs)
    target = models / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    for file in (meta.MODEL_FILE, llm_decode.DECODE_FILE):
        shutil.move(str(folder / file), target / file)
    meta.write(models, entry)
    return entry


def refresh(models: Path, name: str) -> None:
    """Rewrite a current model's expectations from ``_llm_expect`` (no export)."""
    old = meta.read(models / name)
    family, kind = split_name(name)
    graph = onnx.load(str(models / name / meta.MODEL_FILE), load_external_data=False)
    expected, expected_ops, _ = _llm_expect.expected(family, kind, graph)
    if (old.expected, old.expected_ops) != (expected, expected_ops):
        old.expected, old.expected_ops = expected, expected_ops
        meta.write(models, old)
        log.info("%s: expectations updated", name)


def _export_torch(name: str, folder: Path) -> None:
    import _llm_torch  # torch only here: --help and the optimum path do not need it

    family, kind = split_name(name)
    _llm_torch.export(family, kind, folder / meta.MODEL_FILE)
    np.savez(folder / llm_decode.DECODE_FILE, **_llm_torch.reference(family))


def _run_optimum(cache: Path, scratch: Path, args: list[str]) -> None:
    """``_llm_optimum.py`` in the side venv (created once, ``_torch_kvcache.PINS``)."""
    python = sidevenv.ensure(cache / "venv-optimum", _torch_kvcache.PINS)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # never a model hub
    cmd = ["--out", str(scratch), *args]
    sidevenv.run_worker(python, HERE / "_llm_optimum.py", cmd, env=env, timeout_s=1800)


def _export_optimum(cache: Path, names: list[str], scratch: Path) -> dict[str, Path]:
    """One side-venv run for every optimum family; name -> its folder."""
    fams = [split_name(n)[0] for n in names]
    _run_optimum(cache, scratch, ["--families", *fams])
    return {name: scratch / family for name, family in zip(names, fams, strict=True)}


def export_all(cache: Path, names: list[str], *, force: bool = False) -> list[str]:
    """Export every name not already current; the names written. Failures are logged,
    then raised together at the end."""
    models = meta.models_dir(cache)
    models.mkdir(parents=True, exist_ok=True)
    todo = []
    for name in names:
        if not force and meta.is_current(models, name, source(name)):
            refresh(models, name)
        else:
            todo.append(name)
    exports = ExportLog("export_llm")
    with tempfile.TemporaryDirectory(dir=models, prefix=".llm.") as tmp:
        scratch = Path(tmp)
        optimum = [n for n in todo if n.endswith("_optimum_kv")]
        folders: dict[str, Path] = {}
        if optimum:
            start = time.perf_counter()
            try:
                folders = _export_optimum(cache, optimum, scratch / "optimum")
            except sidevenv.SideVenvError as err:
                exports.failed += optimum
                log.error("optimum exports failed: %s", err)
            log.info("optimum: %d export(s) in %.1f s", len(optimum), time.perf_counter() - start)
        for name in todo:
            start = time.perf_counter()
            try:
                if name not in optimum:
                    folders[name] = scratch / name
                    folders[name].mkdir()
                    _export_torch(name, folders[name])
                if name in folders:
                    entry = install(models, name, folders[name])
                else:
                    continue
            except EXPORT_ERRORS as err:
                exports.failure(name, err)
                continue
            exports.wrote(name, entry, start)
    return exports.done()


def export_bench(cache: Path, *, force: bool = False) -> None:
    """The benchmark Llama (4 layers, hidden 512) and its save_pretrained folder."""
    models = meta.models_dir(cache)
    src = {
        "kind": "export",
        "pin": " ".join(_torch_kvcache.PINS[:4]),
        "config": _llm_expect.config_text("llama", BENCH_SIZES),
        "exporter": "optimum-cli text-generation-with-past",
        "recipe": RECIPE,
    }
    if not force and meta.is_current(models, BENCH_NAME, src):
        log.info("%s: current", BENCH_NAME)
        return
    models.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models, prefix=".llm-bench.") as tmp:
        _run_optimum(cache, Path(tmp), ["--bench", json.dumps(BENCH_SIZES)])
        folder = Path(tmp) / "llama"
        path = folder / meta.MODEL_FILE
        check_file(path)
        diffs, problems = llm_decode.check_decode(folder)
        if problems:
            raise ExportCheckError("; ".join(problems))
        graph = onnx.load(str(path), load_external_data=False)
        expected, expected_ops, notes = _llm_expect.expected("llama", "optimum_kv", graph)
        entry = meta.ModelMeta(
            name=BENCH_NAME,
            family="llama",
            source=src,
            exporter=EXPORTER["optimum_kv"],
            **meta.describe(path),
            expected=expected,
            expected_ops=expected_ops,
            atol=llm_decode.ATOL,
            rtol=llm_decode.RTOL,
            decode=llm_decode.DECODE_FILE,
            bench_only=True,
            notes=(
                f"issue 17's benchmark decoder: {BENCH_SIZES}; hf/ is its save_pretrained "
                f"folder (onnxruntime-genai's model builder). {notes} Greedy decode vs torch:"
                f" max abs diff {diffs['original_vs_torch']:.2g}."
            ),
        )
        target = models / BENCH_NAME
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        for file in (meta.MODEL_FILE, llm_decode.DECODE_FILE, "hf"):
            shutil.move(str(folder / file), target / file)
    meta.write(models, entry)
    log.info("%s: %d nodes, %.1f MiB", BENCH_NAME, entry.node_count, entry.size_bytes / 2**20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", help="corpus cache (default ~/.cache/autofusion-corpus)")
    names = all_names()
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=names, help=f"of {names}")
    parser.add_argument("--force", action="store_true", help="export again even if current")
    parser.add_argument("--bench", action="store_true", help=f"only {BENCH_NAME} (not in CI)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    cache = meta.cache_dir(args.cache)
    start = time.perf_counter()
    for name, why in not_made().items():
        log.info("%s: not made (%s)", name, why)
    if args.bench:
        export_bench(cache, force=args.force)
    else:
        export_all(cache, args.only or names, force=args.force)
    log.info("done in %.1f s", time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
