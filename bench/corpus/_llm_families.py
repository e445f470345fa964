"""The LLM decoder families of issue 17: configs, seeded weights, the greedy reference.

Why: the decoders users deploy (Llama, Qwen2, Mistral, Phi-3, Gemma) differ in exactly
the places a fusion must get right: Q/K/V bias (Qwen2), a sliding attention window
(Mistral), one fused qkv and one gate_up projection with a partial rotary embedding
(Phi-3, ``partial_rotary_factor`` 0.5 as Phi-4-mini uses it), and scaled embeddings, a
GeGLU MLP and a ``(1 + w)`` RMSNorm (Gemma). Each is built here from a transformers
config (2 layers, hidden 256, 8 query and 2 key/value heads of 32, vocabulary 256;
nothing comes from a model hub) with seeded weights and every 1-D parameter
re-randomized (``_torch_norms.randomize``: RMSNorm gammas U(0.5, 1.5), so Gemma's
``1 + w`` is 1.5-2.5 and no branch is zero), so a fusion that drops or misplaces a
parameter changes the logits.

This module imports torch and transformers only when it builds a model, and runs in two
environments: the project's (transformers 5.24: the torch exporters, ``export_llm.py``)
and optimum-onnx's side venv (transformers 4.57: ``_llm_optimum.py``), whose configs
spell the partial rotary factor differently (``_config_kwargs``). The two need not draw
the same weights: each export stores the torch reference of its own model
(``reference``).

The reference is a 4-step greedy decode: a 7-token prompt (prefill), then 4 one-token
steps through the KV cache, each feeding the previous step's argmax. With 11 positions
Mistral's 8-token window cuts in from the second step on.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

SEED = 0
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2, 256, 8, 2, 32
FFN, VOCAB, POSITIONS = 512, 256, 128
PROMPT, STEPS = 7, 4
SLIDING_WINDOW = 8  # Mistral: smaller than prompt + steps, so the window matters
PARTIAL_ROTARY = 0.5  # Phi-3: rotary on the first 16 of 32 head dims
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=FFN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=POSITIONS,
    initializer_range=0.05,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


class Family(NamedTuple):
    config: str  # transformers class names
    model: str
    extra: dict  # config keys beyond BASE
    separate_qkv: bool = True  # q, k and v are three Linears
    notes: str = ""


FAMILIES = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM", {}, notes="GQA 8/2, SiLU-gated MLP"),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", {}, notes="biased q/k/v projections"),
    "mistral": Family(
        "MistralConfig",
        "MistralForCausalLM",
        {"sliding_window": SLIDING_WINDOW, "head_dim": HEAD_DIM},
        notes=f"sliding window of {SLIDING_WINDOW} tokens",
    ),
    "phi3": Family(
        "Phi3Config",
        "Phi3ForCausalLM",
        {"partial_rotary_factor": PARTIAL_ROTARY},
        separate_qkv=False,
        notes=f"fused qkv_proj and gate_up_proj, partial rotary factor {PARTIAL_ROTARY}",
    ),
    "gemma": Family(
        "GemmaConfig",
        "GemmaForCausalLM",
        {"head_dim": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh"},
        notes="embeddings scaled by sqrt(hidden), GeGLU MLP (tanh GELU), (1 + w) RMSNorm",
    ),
}


def config_text(family: str, overrides: dict | None = None) -> str:
    """The config as canonical text (part of the corpus's idempotency key)."""
    spec = FAMILIES[family]
    return f"{spec.config}({json.dumps(BASE | spec.extra | (overrides or {}), sort_keys=True)})"


def _config_kwargs(family: str, overrides: dict) -> dict:
    """BASE, the family's keys and ``overrides`` as this transformers spells them:
    transformers 5 moved ``partial_rotary_factor`` into ``rope_parameters``."""
    import transformers

    kwargs = BASE | FAMILIES[family].extra | overrides
    if int(transformers.__version__.split(".")[0]) >= 5 and "partial_rotary_factor" in kwargs:
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        kwargs["rope_parameters"] = rope | {
            "partial_rotary_factor": kwargs.pop("partial_rotary_factor")
        }
    return kwargs


def build(family: str, attn: str = "sdpa", **overrides):
    """Seeded causal LM with re-randomized 1-D parameters, in inference mode."""
    import torch
    import transformers
    from _torch_norms import randomize

    spec = FAMILIES[family]
    config = getattr(transformers, spec.config)(**_config_kwargs(family, overrides))
    config._attn_implementation = attn
    torch.manual_seed(SEED)
    model = getattr(transformers, spec.model)(config)
    return randomize(model, seed=SEED).train(False)


def prompt():
    import torch

    gen = torch.Generator().manual_seed(SEED)
    return torch.randint(3, VOCAB, (1, PROMPT), generator=gen)


def reference(model) -> dict[str, np.ndarray]:
    """Torch's 4-step greedy decode with the KV cache: the prompt, the logits of the
    prefill (``logits0``, every position) and of each step (``logits1``..), the tokens fed
    (``tokens``: each step's input, the argmax of the step before) and the sizes the
    feeds need (``num_kv_heads``, ``head_dim``)."""
    import torch

    ids = prompt()
    out = {"input_ids": ids.numpy()}
    tokens = []
    with torch.no_grad():
        result = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True)
        out["logits0"] = result.logits.numpy()
        cache, length = result.past_key_values, ids.shape[1]
        for step in range(1, STEPS + 1):
            token = result.logits[:, -1:].argmax(-1)
            tokens.append(int(token))
            mask = torch.ones(1, length + 1, dtype=torch.int64)
            positions = torch.tensor([[length]])
            result = model(
                input_ids=token,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            out[f"logits{step}"] = result.logits.numpy()
            cache, length = result.past_key_values, length + 1
    head_dim = getattr(model.config, "head_dim", None) or HIDDEN // HEADS
    out |= {
        "tokens": np.array(tokens, dtype=np.int64),
        "num_kv_heads": np.array(model.config.num_key_value_heads),
        "head_dim": np.array(head_dim),
    }
    return out
