"""The KV-cache decoder export worker: runs in a side venv with optimum-onnx 0.1.0.

Why: users export LLM decoders for onnxruntime with optimum's
``text-generation-with-past`` task, whose graph takes the past keys and values as
inputs and an ``attention_mask`` of ``[batch, past_sequence_length +
sequence_length]``: inputs tied by a symbolic expression, the case in which issue 13
saw the check generate inconsistent inputs and report a false mismatch. optimum-onnx
0.1.0 requires transformers < 4.58, so this runs in its own venv
(``export_torch.py`` creates it) and hands back files only: ``<out>/model.onnx`` and
``cases.npz`` (inputs ``in<i>.<name>`` and torch's logits ``out<i>`` per case).

The model is a tiny Llama (2 layers, hidden 64, 4 query and 2 key/value heads, 128
tokens, 64 positions) built from its config with seeded random weights and randomized
RMSNorm gammas (``_torch_norms.randomize``), saved with ``save_pretrained`` and
exported by ``optimum-cli export onnx --task text-generation-with-past`` with its
defaults, as users run it on a saved checkpoint.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from _torch_norms import randomize

SEED = 0
CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    initializer_range=0.1,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# (batch, past length, new tokens) per checked case: a decode step and a chunk
CASES = [(2, 5, 1), (1, 3, 4)]


def build() -> transformers.LlamaForCausalLM:
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    return randomize(model, seed=SEED)


def export(model, folder: Path) -> Path:
    """save_pretrained, then optimum-cli's export with its defaults into ``folder``."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        cli = Path(sys.executable).parent / "optimum-cli"
        cmd = [str(cli), "export", "onnx", "--model", tmp, "--task"]
        subprocess.run([*cmd, "text-generation-with-past", str(folder)], check=True)
    return folder / "model.onnx"


def case(model, batch: int, past: int, new: int, gen: torch.Generator) -> dict:
    """Feeds for the ONNX graph and torch's logits for the same step."""
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv_shape = (batch, config.num_key_value_heads, past, head_dim)
    pasts = [
        (torch.randn(kv_shape, generator=gen), torch.randn(kv_shape, generator=gen))
        for _ in range(config.num_hidden_layers)
    ]
    ids = torch.randint(3, config.vocab_size, (batch, new), generator=gen)
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    mask[1:, :2] = 0  # rows after the first are left-padded, as batched generation pads
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    cache = transformers.DynamicCache.from_legacy_cache(tuple(pasts))
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache
        ).logits
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    for layer, (key, value) in enumerate(pasts):
        feeds[f"past_key_values.{layer}.key"] = key
        feeds[f"past_key_values.{layer}.value"] = value
    return {"feeds": {k: v.numpy() for k, v in feeds.items()}, "logits": logits.numpy()}


def save_cases(model, folder: Path) -> None:
    gen = torch.Generator().manual_seed(SEED)
    arrays = {}
    for i, (batch, past, new) in enumerate(CASES):
        done = case(model, batch, past, new, gen)
        arrays |= {f"in{i}.{name}": value for name, value in done["feeds"].items()}
        arrays[f"out{i}"] = done["logits"]
    np.savez(folder / "cases.npz", **arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model = build().train(False)
    export(model, args.out)
    save_cases(model, args.out)


if __name__ == "__main__":
    main()
