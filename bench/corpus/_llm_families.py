"""The LLM decoder families of issues 17 and 24: configs, seeded weights, the greedy reference.

Why: the decoders users deploy (Llama, Qwen2, Mistral, Phi-3, Gemma) differ in exactly
the places a fusion must get right: Q/K/V bias (Qwen2), a sliding attention window
(Mistral), one fused qkv and one gate_up projection with a partial rotary embedding
(Phi-3, ``partial_rotary_factor`` 0.5 as Phi-4-mini uses it), and scaled embeddings, a
GeGLU MLP and a ``(1 + w)`` RMSNorm (Gemma). Issue 24 adds families whose attention, rotary
embeddings, norms or MLP are spelled differently again: per-head q/k RMSNorms (Qwen3),
attention logit soft-capping and a sliding window on alternate layers (Gemma-2),
multi-query attention in parallel with the MLP under one LayerNorm (Falcon), a rotary
embedding on a quarter of each head and a parallel residual (GPT-NeoX), a top-2 mixture
of experts (Qwen3-MoE) and layers without rotary embeddings (SmolLM3's NoPE layers).
Each is built here from a transformers config (2 layers, hidden 256, 8 query and 2
key/value heads of 32, vocabulary 256, unless the family says otherwise; nothing comes
from a model hub) with seeded weights and every 1-D parameter
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


KINDS = ("torchscript", "dynamo", "dynamo_kv", "optimum_kv")  # export_llm's variants
NEW_KINDS = ("torchscript", "dynamo", "optimum_kv")  # issue 24's: no dynamo cache graph


class Arch(NamedTuple):
    """What a family's decoder has per layer: the counts ``_llm_expect`` expects fused."""

    norm: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm)
    norms: int = 2  # norms on the hidden state per layer (the final one comes on top)
    residual_adds: int = 2  # residual Adds per layer, each feeding the next norm
    qk_norm: bool = False  # an RMSNorm on every query and key head (Qwen3)
    rope_layers: int | None = None  # layers with a rotary embedding; None: all
    moe: bool = False  # the MLP is a mixture of experts in every layer


class Family(NamedTuple):
    config: str  # transformers class names
    model: str
    extra: dict  # config keys beyond BASE
    separate_qkv: bool = True  # q, k and v are three Linears
    notes: str = ""
    base: dict = BASE  # the sizes, as this family's config spells them
    attn: str = "sdpa"  # the attention implementation exported
    experts: str | None = None  # transformers 5's experts implementation (MoE)
    kinds: tuple[str, ...] = KINDS
    skipped: dict[str, str] = {}  # kind -> why that variant is not made
    arch: Arch = Arch()


# Falcon and GPT-NeoX spell the sizes their own way (no key/value head count: Falcon's
# classic multi-query attention has one key/value head, GPT-NeoX as many as queries)
_OWN_SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    max_position_embeddings=POSITIONS,
    initializer_range=0.05,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
GEMMA2_SOFTCAP = (2.0, 3.0)  # attention, final: about the scores' size, so tanh bends
EXPERTS, TOP_K, EXPERT_FFN = 4, 2, 128
NOPE_LAYERS = [1, 0]  # SmolLM3's no_rope_layers: 1 = rotary, 0 = NoPE (the 2nd layer)

NEW_FAMILIES = {  # issue 24's
    "qwen3": Family(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"head_dim": HEAD_DIM},
        notes="an RMSNorm on every query and key head, between the head split and the Transpose",
        kinds=NEW_KINDS,
        arch=Arch(qk_norm=True),
    ),
    "gemma2": Family(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": HEAD_DIM,
            "hidden_activation": "gelu_pytorch_tanh",
            "sliding_window": SLIDING_WINDOW,
            "query_pre_attn_scalar": HEAD_DIM,
            "attn_logit_softcapping": GEMMA2_SOFTCAP[0],
            "final_logit_softcapping": GEMMA2_SOFTCAP[1],
        },
        notes=(
            f"attention logits soft-capped ({GEMMA2_SOFTCAP[0]} tanh(s / "
            f"{GEMMA2_SOFTCAP[0]})), a {SLIDING_WINDOW}-token sliding window on the first "
            "layer, 4 (1 + w) RMSNorms per layer, soft-capped final logits"
        ),
        attn="eager",  # transformers: sdpa cannot soft-cap
        kinds=NEW_KINDS,
        arch=Arch(norms=4),
    ),
    "falcon": Family(
        "FalconConfig",
        "FalconForCausalLM",
        {
            "new_decoder_architecture": False,
            "multi_query": True,
            "parallel_attn": True,
            "alibi": False,
            "bias": False,
            "ffn_hidden_size": FFN,
        },
        separate_qkv=False,
        notes=(
            "multi-query attention (1 key/value head) in parallel with the GELU MLP, both "
            "on one LayerNorm; one query_key_value Linear"
        ),
        base=_OWN_SIZES,
        kinds=NEW_KINDS,
        arch=Arch(norm="layer", norms=1, residual_adds=1),
    ),
    "gpt_neox": Family(
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        {"intermediate_size": FFN, "rotary_pct": 0.25, "use_parallel_residual": True},
        separate_qkv=False,
        notes=(
            "rotary embedding on the first quarter (8) of each head's 32 dims, parallel "
            "residual (x + attn(ln1(x)) + mlp(ln2(x))), one query_key_value Linear"
        ),
        base=_OWN_SIZES,
        kinds=NEW_KINDS,
        arch=Arch(norm="layer", residual_adds=1),
    ),
    "qwen3_moe": Family(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "head_dim": HEAD_DIM,
            "num_experts": EXPERTS,
            "num_experts_per_tok": TOP_K,
            "moe_intermediate_size": EXPERT_FFN,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
        },
        notes=(
            f"a mixture of {EXPERTS} SiLU-gated experts (top {TOP_K}, renormalized) in "
            "every layer, per-head q/k RMSNorms"
        ),
        # transformers 5's default grouped_mm calls aten::histc (no ONNX export);
        # batched_mm gathers each token's expert weights and has no data-dependent loop
        experts="batched_mm",
        kinds=NEW_KINDS,
        arch=Arch(qk_norm=True, moe=True),
    ),
    "smollm3": Family(
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        {"no_rope_layers": NOPE_LAYERS},
        notes="no rotary embedding in the second layer (a NoPE layer), GQA 8/2",
        kinds=NEW_KINDS,
        arch=Arch(rope_layers=sum(NOPE_LAYERS)),
    ),
}

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
    **NEW_FAMILIES,
}


def config_text(family: str, overrides: dict | None = None) -> str:
    """The config as canonical text (part of the corpus's idempotency key)."""
    spec = FAMILIES[family]
    sizes = spec.base | spec.extra | (overrides or {})
    return f"{spec.config}({json.dumps(sizes, sort_keys=True)})"


def _config_kwargs(family: str, overrides: dict) -> dict:
    """BASE, the family's keys and ``overrides`` as this transformers spells them:
    transformers 5 moved ``partial_rotary_factor`` into ``rope_parameters``."""
    import transformers

    spec = FAMILIES[family]
    kwargs = spec.base | spec.extra | overrides
    if int(transformers.__version__.split(".")[0]) >= 5 and "partial_rotary_factor" in kwargs:
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        kwargs["rope_parameters"] = rope | {
            "partial_rotary_factor": kwargs.pop("partial_rotary_factor")
        }
    return kwargs


def build(family: str, attn: str | None = None, **overrides):
    """Seeded causal LM with re-randomized 1-D parameters, in inference mode; ``attn``:
    the attention implementation (default: the family's)."""
    import torch
    import transformers
    from _torch_norms import randomize

    spec = FAMILIES[family]
    config = getattr(transformers, spec.config)(**_config_kwargs(family, overrides))
    config._attn_implementation = attn or spec.attn
    if spec.experts and hasattr(config, "_experts_implementation"):  # not in 4.57
        config._experts_implementation = spec.experts
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
    kv_heads, head_dim = _cache_dims(cache)
    out |= {
        "tokens": np.array(tokens, dtype=np.int64),
        "num_kv_heads": np.array(kv_heads),
        "head_dim": np.array(head_dim),
    }
    return out


def _cache_dims(cache) -> tuple[int, int]:
    """(key/value heads, head dim) of a cache's keys, [batch, heads, length, dim]: read
    from the cache, since Falcon's multi-query attention has one head whatever its
    config says."""
    keys = cache.layers[0].keys if hasattr(cache, "layers") else cache[0][0]
    return int(keys.shape[1]), int(keys.shape[-1])
