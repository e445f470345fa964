"""The LLM decoders' optimum-onnx export worker: runs in the side venv (optimum-onnx 0.1.0).

Why: optimum's ``text-generation-with-past`` export is how most users get an ONNX
decoder with a KV cache; optimum-onnx 0.1.0 requires transformers < 4.58 while the
project pins 5.24, so this runs in ``_torch_kvcache``'s side venv and hands back files
only. Per family (``_llm_families.py``): the model built from its config with seeded
weights, saved with ``save_pretrained`` and exported by optimum's ``main_export`` (what
``optimum-cli export onnx --task text-generation-with-past`` calls) with its defaults,
into ``<out>/<family>/model.onnx``, beside ``decode.npz``, the torch reference of a
4-step greedy decode of this venv's model. ``--bench`` builds issue 17's benchmark
Llama instead (``export_llm.BENCH_SIZES``, passed as JSON) and keeps its
``save_pretrained`` folder as ``<out>/llama/hf`` for onnxruntime-genai's model builder.

A family that needs another attention than sdpa (Gemma-2's eager, the only one that
soft-caps the attention logits) is exported from the model in memory
(``onnx_export_from_model``, optimum's API for a loaded model): ``main_export`` reloads
the folder with transformers 4.57's default, sdpa, whose Gemma-2 attention silently
drops the soft-capping (its logits then differ from the model's by about 2.4 here).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import _llm_families as fam
import numpy as np


def export(family: str, folder: Path, *, sizes: dict | None = None, keep_hf: bool = False) -> None:
    from optimum.exporters.onnx import main_export, onnx_export_from_model

    model = fam.build(family, **(sizes or {}))
    folder.mkdir(parents=True, exist_ok=True)
    out = str(folder / "export")
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        if fam.FAMILIES[family].attn == "sdpa":
            main_export(tmp, output=out, task="text-generation-with-past")
        else:  # main_export would reload it with sdpa: export the model as built
            onnx_export_from_model(model, output=out, task="text-generation-with-past")
        if keep_hf:
            shutil.copytree(tmp, folder / "hf")
    shutil.move(str(folder / "export" / "model.onnx"), folder / "model.onnx")
    shutil.rmtree(folder / "export")  # optimum's config and generation_config copies
    np.savez(folder / "decode.npz", **fam.reference(model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--families", nargs="*", default=[])
    parser.add_argument("--bench", help="sizes of the benchmark Llama, as JSON")
    args = parser.parse_args()
    if args.bench:
        export("llama", args.out / "llama", sizes=json.loads(args.bench), keep_hf=True)
        return
    for family in args.families:
        export(family, args.out / family)


if __name__ == "__main__":
    main()
