"""The side-venv worker of ``bench/bench_real_big_decoder.py``: a real-sized decoder.

Runs in optimum-onnx's side venv (``bench/corpus/_torch_kvcache.py`` makes it: optimum-onnx
0.1.0 needs transformers < 4.58). ``--family qwen2`` (the default) builds Qwen2-0.5B's
configuration (hidden 896, 24 layers, 14 query heads sharing 2 KV heads, intermediate
4864, vocabulary 151936, tied embeddings; 494 million weights); ``--family qwen3``
Qwen3-0.6B's (hidden 1024, 28 layers, 16 query heads of 128 sharing 8 KV heads,
intermediate 3072, the same vocabulary, tied embeddings, an RMSNorm on every query and
key head; 596 million weights). Either with seeded random weights and every 1-D parameter
re-randomized (``bench/corpus/_llm_families.build``: nothing from a model hub), saves it
with ``save_pretrained`` into ``<out>/hf`` with a small word-level ``tokenizer.json``
(onnxruntime-genai's builder refuses a folder without a tokenizer; any one does for the
graph) and exports it with optimum's ``text-generation-with-past`` into
``<out>/optimum`` (``model.onnx`` and its external data, all of optimum's files kept).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", choices=sorted(CONFIGS), default="qwen2")
    args = parser.parse_args()
    from optimum.exporters.onnx import main_export

    model = fam.build(args.family, **CONFIGS[args.family])
    hf = args.out / "hf"
    model.save_pretrained(hf)
    write_tokenizer(hf)
    del model
    main_export(str(hf), output=str(args.out / "optimum"), task="text-generation-with-past")


if __name__ == "__main__":
    main()
