"""Export the corpus's transformer families with both torch exporters, seeded random weights.

Why: the families users deploy today (Llama, Qwen2, Phi-3, Whisper's encoder, T5's
encoder, Swin, DeBERTa-v2, ModernBERT) are spelled differently by each exporter and
each attention implementation, and autofusion must optimize all of them without a
crash, a false alarm or a slowdown, and fuse what matters in each. Every model is
built from a transformers config (``_torch_families.py``: 2 layers, hidden 64, seeded
random weights with randomized norms and biases; nothing comes from a model hub) and
exported as users export it:

* TorchScript (``dynamo=False``, opset 17) and dynamo (``dynamo=True``, opset 18, the
  onnxscript optimizer on), through ``bench/make_transformer_models.py``'s exporters:
  dynamic batch and sequence axes (batch only for images and Whisper's fixed-length
  audio), falling back to static shapes when the dynamic export fails;
* one decoder with a KV cache, the way users export one: optimum-onnx's
  ``text-generation-with-past`` export of a tiny Llama saved with ``save_pretrained``
  (``_torch_optimum.py``, in a side environment: optimum-onnx 0.1.0 needs
  transformers < 4.58).

Each file is checked with ``onnx.checker`` and against torch in onnxruntime with all
graph optimizations disabled (several batch/sequence sizes, padded attention masks)
and written to ``<cache>/models/<name>/model.onnx`` with a ``meta.json``
(``meta.py``) that says what autofusion must fuse in it (``_torch_expect.py``). A
model already built from the same source is skipped unless ``--force``.

    python bench/corpus/export_torch.py [--cache DIR] [--only llama_eager_dynamo ...]
        [--force]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _torch_expect
import _torch_families as fam
import _torch_kvcache
import meta
import onnx
from _torch_check import EXPORT_ERRORS, ExportLog, check_file, check_outputs

mtm = fam.mtm
torch = fam.torch
log = logging.getLogger("export_torch")

EXPORTERS = {"torchscript": "torch-torchscript", "dynamo": "torch-dynamo"}
OPSETS = {"torchscript": mtm.TORCHSCRIPT_OPSET, "dynamo": mtm.DYNAMO_OPSET}
PIN = f"torch=={torch.__version__.split('+')[0]} transformers=={fam.transformers.__version__}"
RECIPE = 2  # bump when the export recipe changes: every model is then rebuilt
BATCHES = (2, 1, 3)  # the audio encoder takes one length; only the batch varies


def all_names() -> list[str]:
    """Every (family, attention, exporter) export but those the exporter cannot make."""
    return [
        f"{family}_{attn}_{exporter}"
        for family, spec in fam.FAMILIES.items()
        for attn in spec.attentions
        for exporter in EXPORTERS
        if (attn, exporter) not in spec.unexportable
    ]


def unexportable() -> dict[str, str]:
    return {
        f"{family}_{attn}_{exporter}": why
        for family, spec in fam.FAMILIES.items()
        for (attn, exporter), why in spec.unexportable.items()
    }


def split_name(name: str) -> tuple[str, str, str]:
    family, attn, exporter = name.rsplit("_", 2)
    return family, attn, exporter


def source(name: str) -> dict:
    family, attn, exporter = split_name(name)
    return {
        "kind": "export",
        "pin": PIN,
        "config": fam.config_text(family),
        "attention": attn,
        "exporter": exporter,
        "opset": OPSETS[exporter],
        "recipe": RECIPE,
    }


def _export_audio(model, inputs: dict, path: Path, exporter: str) -> None:
    """Whisper's encoder: the batch is the only dynamic axis (the frame count is fixed)."""
    args = tuple(inputs.values())
    names = dict(input_names=["input_features"], output_names=["last_hidden_state"])
    if exporter == "torchscript":
        axes = {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}}
        torch.onnx.export(
            model,
            args,
            str(path),
            dynamo=False,
            opset_version=OPSETS[exporter],
            dynamic_axes=axes,
            **names,
        )
        return
    shapes = {"input_features": {0: torch.export.Dim("batch")}}
    program = torch.onnx.export(
        model, args, dynamo=True, opset_version=OPSETS[exporter], dynamic_shapes=shapes, **names
    )
    for node in program.model.graph.all_nodes():  # as make_transformer_models.export_dynamo
        node.metadata_props.pop(mtm.STACK_TRACE_KEY, None)
    program.save(str(path), external_data=False)


def _check_audio(model, path: Path) -> dict:
    cases = []
    for batch in BATCHES:
        feeds = fam.make_inputs(model, batch, 0)
        with torch.no_grad():
            expected = model(**feeds).numpy()
        cases.append(({k: v.numpy() for k, v in feeds.items()}, [expected]))
    err = check_outputs(path, cases, atol=mtm.ATOL, rtol=0.0)
    return {"dynamic": True, "max_abs_err": err}


def export_checked(name: str, path: Path) -> tuple[dict, fam.nn.Module]:
    """Build, export and check one model: (what the export did, the torch model)."""
    family, attn, exporter = split_name(name)
    model = fam.build(family, attn)
    if fam.FAMILIES[family].kind == "audio":
        _export_audio(model, fam.make_inputs(model, BATCHES[0], 0), path, exporter)
        checked = _check_audio(model, path)
    else:
        export = mtm.EXPORTERS[exporter]  # the (model, inputs, path, dynamic) exporters
        checked = mtm.export_and_check(model, export, path)
    check_file(path)
    return checked, model


def model_meta(name: str, path: Path, checked: dict, model) -> meta.ModelMeta:
    family, attn, exporter = split_name(name)
    spec = fam.FAMILIES[family]
    graph = onnx.load(str(path), load_external_data=False)
    expected, notes = _torch_expect.expected(spec, model, graph)
    shape_note = "dynamic batch" + (" and sequence" if spec.kind == "text" else "")
    if not checked["dynamic"]:
        shape_note = f"static shapes (the dynamic export failed: {checked['static_because']})"
    return meta.ModelMeta(
        name=name,
        family=family.replace("_", "-"),
        source=source(name),
        exporter=EXPORTERS[exporter],
        **meta.describe(path),
        expected=expected,
        notes=(
            f"{attn} attention, {shape_note}; max abs diff vs torch "
            f"{checked['max_abs_err']:.2g} (atol {mtm.ATOL}, rtol 0; onnxruntime with "
            f"optimizations off, 3 batch/sequence sizes, padded masks). {notes}"
        ),
    )


def export_one(models: Path, name: str) -> meta.ModelMeta:
    """Export ``name`` into a scratch folder, check it, then move it into the corpus."""
    with tempfile.TemporaryDirectory(dir=models, prefix=f".{name}.") as tmp:
        path = Path(tmp) / meta.MODEL_FILE
        checked, model = export_checked(name, path)
        entry = model_meta(name, path, checked, model)
        target = models / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        shutil.move(str(path), target / meta.MODEL_FILE)
    meta.write(models, entry)
    return entry


def export_all(cache: Path, names: list[str], *, force: bool = False) -> list[str]:
    """Export every name not already current; the names written. Failures are logged."""
    models = meta.models_dir(cache)
    models.mkdir(parents=True, exist_ok=True)
    exports = ExportLog("export_torch")
    for name in names:
        if not force and meta.is_current(models, name, source(name)):
            log.info("%s: current", name)
            continue
        start = time.perf_counter()
        try:
            entry = export_one(models, name)
        except EXPORT_ERRORS as err:
            exports.failure(name, err)
            continue
        exports.wrote(name, entry, start)
    return exports.done()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", help="corpus cache (default ~/.cache/autofusion-corpus)")
    known = [*all_names(), _torch_kvcache.NAME]
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=known, help=f"of {known}")
    parser.add_argument("--force", action="store_true", help="export again even if current")
    args = parser.parse_args(argv)
    # onnxscript's optimizer and the exporters log every rewrite at INFO; show only ours
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    for name, why in unexportable().items():
        log.info("%s: not made (%s)", name, why)
    cache = meta.cache_dir(args.cache)
    only = args.only or known
    export_all(cache, [n for n in only if n != _torch_kvcache.NAME], force=args.force)
    if _torch_kvcache.NAME in only:
        _torch_kvcache.export(cache, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
