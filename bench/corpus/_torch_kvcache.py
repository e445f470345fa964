"""The corpus's decoder with a KV cache: optimum-onnx's export, checked and described.

Why: ``export_torch.py``'s decoders are prefill graphs; what users deploy for
generation is optimum's ``text-generation-with-past`` export, whose
``attention_mask`` is ``[batch, past_sequence_length + sequence_length]``. issue 13
saw the check feed such a model inconsistent inputs and report a false mismatch. The
export itself runs in a side venv (``_torch_optimum.py``: optimum-onnx 0.1.0 needs
transformers < 4.58, the project pins 5.24); this module creates that venv once,
runs the worker, checks its file in onnxruntime against torch's logits (a one-token
decode step after 5 cached tokens with a left-padded row, and a 4-token chunk after
3) and writes ``models/llama_optimum_kv_cache``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import _torch_expect
import _torch_sidevenv as sidevenv
import meta
import numpy as np
import onnx
from _torch_check import check_file, check_outputs

log = logging.getLogger("export_torch")
HERE = Path(__file__).resolve().parent
NAME = "llama_optimum_kv_cache"
PINS = [
    "torch==2.13.0",
    "optimum-onnx==0.1.0",
    "optimum==2.1.0",
    "transformers==4.57.6",
    "onnx==1.23.2",
    "onnxruntime==1.32.0",
]
ATOL, RTOL = 1e-4, 1e-4
LAYERS = 2
RECIPE = 1


def source() -> dict:
    return {
        "kind": "export",
        "pin": " ".join(PINS[:4]),
        "config": "LlamaForCausalLM(hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 128)",
        "exporter": "optimum-cli export onnx --task text-generation-with-past",
        "recipe": RECIPE,
    }


def _cases(folder: Path) -> list[tuple[dict, list]]:
    arrays = np.load(folder / "cases.npz")
    count = len([k for k in arrays if k.startswith("out")])
    return [
        (
            {k.split(".", 1)[1]: arrays[k] for k in arrays if k.startswith(f"in{i}.")},
            [arrays[f"out{i}"]],  # logits; the present keys/values are concatenations
        )
        for i in range(count)
    ]


def _meta(path: Path, err: float) -> meta.ModelMeta:
    graph = onnx.load(str(path), load_external_data=False)
    softmax = _torch_expect.graph_counts(graph.graph)["softmax"]
    qkv = {_torch_expect.any_of("qkv"): LAYERS}
    rms = {_torch_expect.any_of("rms_norm"): 2 * LAYERS + 1}
    return meta.ModelMeta(
        name=NAME,
        family="llama",
        source=source(),
        exporter="torch-torchscript",  # what optimum-onnx calls under the hood
        **meta.describe(path),
        expected={"generic": dict(qkv), "onnxruntime": qkv | rms},
        notes=(
            "LLM decoder with a KV cache (optimum-onnx, sdpa attention): attention_mask is "
            "[batch_size, past_sequence_length + sequence_length], so the check must give "
            "the past keys/values and the mask consistent lengths (issue 13). "
            f"{softmax} Softmax; decoder attention is a later issue: only RMSNorm (5) and "
            "Q/K/V merge (2) required; generic at opset 18 has no RMSNormalization. "
            f"Max abs diff of the logits vs torch {err:.2g} (atol {ATOL}, rtol {RTOL})."
        ),
    )


def export(cache: Path, *, force: bool = False) -> bool:
    """Build ``llama_optimum_kv_cache`` unless current; True when it was written."""
    models = meta.models_dir(cache)
    if not force and meta.is_current(models, NAME, source()):
        log.info("%s: current", NAME)
        return False
    python = sidevenv.ensure(cache / "venv-optimum", PINS)
    models.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models, prefix=f".{NAME}.") as tmp:
        out = Path(tmp) / "export"
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # never a model hub
        sidevenv.run_worker(python, HERE / "_torch_optimum.py", ["--out", str(out)], env=env)
        path = out / meta.MODEL_FILE
        check_file(path)
        err = check_outputs(path, _cases(out), atol=ATOL, rtol=RTOL)
        entry = _meta(path, err)
        shutil.rmtree(models / NAME, ignore_errors=True)
        (models / NAME).mkdir()
        shutil.move(str(path), models / NAME / meta.MODEL_FILE)
    meta.write(models, entry)
    log.info("%s: %d nodes, %.0f KiB", NAME, entry.node_count, entry.size_bytes / 1024)
    return True
