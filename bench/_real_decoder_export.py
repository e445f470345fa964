"""The side-venv worker of ``bench/bench_real_big_decoder.py``: a real-sized decoder.

Runs in optimum-onnx's side venv (``bench/corpus/_torch_kvcache.py`` makes it: optimum-onnx
0.1.0 needs transformers < 4.58). ``--family qwen2`` (the default) builds Qwen2-0.5B's
configuration (hidden 896, 24 layers, 14 query heads sharing 2 KV heads, intermediate
4864, vocabulary 151936, tied embeddings; 494 million weights); ``--family qwen3``
Qwen3-0.6B's (hidden 1024, 28 layers, 16 query heads of 128 sharing 8 KV heads,
intermediate 3072, the same vocabulary, tied embeddings, an RMSNorm on every query and
key head; 596 million weights). The other families (``FAMILIES``: those both
onnxruntime-genai 0.18.0's model builder and optimum's ``text-generation-with-past``
take) are one size, ``SMALL``: hidden 1024, 8 layers, intermediate 2816, vocabulary
32000, each with its family's head layout and the switches that set it apart (soft-caps,
multipliers, partial rotary, NoPE layers, sliding windows), tied embeddings where the
family ties them. Every model has seeded random weights and every 1-D parameter
re-randomized (``_torch_norms.randomize``, as ``bench/corpus/_llm_families.build``:
nothing from a model hub), is saved with ``save_pretrained`` into ``<out>/hf`` with a
small word-level ``tokenizer.json`` (onnxruntime-genai's builder refuses a folder
without a tokenizer; any one does for the graph) and exported with optimum's
``text-generation-with-past`` into ``<out>/optimum`` (``model.onnx`` and its external
data, all of optimum's files kept).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))
import _llm_families as fam

QWEN2_05B = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    max_position_embeddings=4096,  # the builder sizes its rotary cache by it
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    initializer_range=0.02,
)
QWEN3_06B = QWEN2_05B | dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,  # not hidden / heads (64): Qwen3 sets it apart
    intermediate_size=3072,
)
CONFIGS = {"qwen2": QWEN2_05B, "qwen3": QWEN3_06B}

# Big enough that a decode step is not launch-bound (0.5-0.7 GB of fp32 weights), small
# enough for a shared 2-core machine; ids inside the vocabulary (Phi-3's default pad id
# is 32000, one past it)
SMALL = dict(
    hidden_size=1024,
    num_hidden_layers=8,
    intermediate_size=2816,
    vocab_size=32000,
    max_position_embeddings=4096,
    initializer_range=0.02,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
_HEADS_128 = dict(num_attention_heads=8, head_dim=128)
_GEMMA = dict(num_attention_heads=4, head_dim=256, query_pre_attn_scalar=256)
# family -> (config class, model class, attention implementation, config keys past SMALL)
FAMILIES = {
    # Gemma-2-2B's layout (heads of 256, 2 queries a KV head), soft-caps 50 / 30, sliding
    # window 4096 on alternate layers; eager: transformers' sdpa cannot soft-cap
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "eager", _GEMMA | dict(num_key_value_heads=2)),
    # Gemma-3-1B's (one KV head of 256, q/k RMSNorms, 5 sliding layers to 1 global); the
    # window cut to 64 so that a 128-token prompt and its decode steps cross it
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "sdpa",
        _GEMMA | dict(num_key_value_heads=1, sliding_window=64),
    ),
    # Granite-3.0-2B's (heads of 64, 4 queries a KV head) and its four multipliers
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        "sdpa",
        dict(
            num_attention_heads=16,
            num_key_value_heads=4,
            embedding_multiplier=12.0,
            attention_multiplier=0.015625,
            residual_multiplier=0.22,
            logits_scaling=8.0,
        ),
    ),
    # Phi-4-mini's (Phi3ForCausalLM: fused qkv and gate_up, heads of 128, rotary on 3/4)
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        "sdpa",
        _HEADS_128 | dict(num_key_value_heads=2, partial_rotary_factor=0.75),
    ),
    # OLMo-1B's (multi-head, heads of 128, LayerNorm without parameters)
    "olmo": ("OlmoConfig", "OlmoForCausalLM", "sdpa", _HEADS_128 | dict(num_key_value_heads=8)),
    # SmolLM3-3B's (heads of 128, 4 queries a KV head, every 4th layer without rotary)
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        "sdpa",
        _HEADS_128 | dict(num_key_value_heads=2, no_rope_layer_interval=4),
    ),
    # Nemotron-Mini-4B's (heads of 128, rotary on half, LayerNorm1P, squared-ReLU MLP)
    "nemotron": (
        "NemotronConfig",
        "NemotronForCausalLM",
        "sdpa",
        _HEADS_128 | dict(num_key_value_heads=2, partial_rotary_factor=0.5),
    ),
}


def build(family: str):
    """The family's model: ``_llm_families.build`` for Qwen, else ``FAMILIES``' config
    at ``SMALL``, seeded as that function seeds, every 1-D parameter re-randomized."""
    if family in CONFIGS:
        return fam.build(family, **CONFIGS[family])
    import torch
    import transformers
    from _torch_norms import randomize

    config_class, model_class, attn, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**(SMALL | extra))
    config._attn_implementation = attn
    torch.manual_seed(fam.SEED)
    model = getattr(transformers, model_class)(config)
    return randomize(model, seed=fam.SEED).train(False)


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(253)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(folder)


def save_reference(model, out: Path) -> None:
    """torch's logits of a 16-token prompt (``reference.npz``), to check the export by."""
    import numpy as np
    import torch

    ids = torch.randint(3, 200, (1, 16), generator=torch.Generator().manual_seed(fam.SEED))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    np.savez(out / "reference.npz", input_ids=ids.numpy(), logits=logits.numpy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", choices=sorted(CONFIGS | FAMILIES), default="qwen2")
    args = parser.parse_args()
    from optimum.exporters.onnx import main_export, onnx_export_from_model

    model = build(args.family)
    hf = args.out / "hf"
    model.save_pretrained(hf)
    write_tokenizer(hf)
    save_reference(model, args.out)
    output = str(args.out / "optimum")
    if model.config._attn_implementation == "sdpa":
        main_export(str(hf), output=output, task="text-generation-with-past")
    else:  # main_export reloads with sdpa, whose Gemma-2 attention drops the soft-cap
        onnx_export_from_model(model, output=output, task="text-generation-with-past")


if __name__ == "__main__":
    main()
