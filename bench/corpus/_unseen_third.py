"""The third batch of ``unseen_families``'s survey: decoder families transformers 5.24
ships that neither the corpus nor the first two surveys name, hybrids included where
some layers are attention (issue 24, survey 3). Sizes as ``_llm_families.BASE`` unless a
family spells them its own way; a mixture of experts has 4 experts, top 2; a hybrid's
layer list is set so that one of its 2 layers is attention. ExaONE and InternLM3 are
left out: transformers builds both as ``LlamaForCausalLM``, which the corpus names.
"""

from __future__ import annotations

import _llm_families as fam

H = fam.HEAD_DIM
_F = fam.Family
_IDS = dict(vocab_size=256, initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_SPARSE = {"mlp_layer_types": ["sparse", "sparse"]}
_SLIDING = {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
_MLA = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32}
_MLA_HEADS = {**_MLA, "v_head_dim": 32, "num_key_value_heads": 8}
_GRANITE = {"attention_multiplier": 0.1, "residual_multiplier": 0.5, "embedding_multiplier": 2.0}
_MAMBA2 = {
    "mamba_n_heads": 16,
    "mamba_d_head": 32,
    "mamba_d_state": 16,
    "mamba_chunk_size": 4,
    "use_mamba_kernels": False,
}
_LINEAR = {  # Gated DeltaNet's sizes (Qwen3-Next, Qwen3.5, OLMo-hybrid)
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "head_dim": H,
}
_DBRX = dict(
    _IDS,
    d_model=256,
    n_layers=2,
    n_heads=8,
    max_seq_len=128,
    attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
    ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
)
_YARN = {
    "rope_type": "yarn",
    "rope_theta": 1000000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
}
_EXPERTS = {"num_local_experts": 4, "num_experts_per_tok": 2}
THIRD = {  # family -> (Family, what sets it apart)
    "hyperclovax": (
        _F("HyperCLOVAXConfig", "HyperCLOVAXForCausalLM", {**_GRANITE, "head_dim": H}),
        "attention scale, residual and embedding multipliers",
    ),
    "ministral3": (
        _F("Ministral3Config", "Ministral3ForCausalLM", {"head_dim": H, "rope_parameters": _YARN}),
        "YaRN rotary, the query scaled by position (Llama-4's)",
    ),
    "granite_swa": (
        _F("GraniteSWAConfig", "GraniteSWAForCausalLM", {**_GRANITE, **_SLIDING}, attn="eager"),
        "attention sinks as a scale of the context, sliding layers, Granite's multipliers",
    ),
    "granitemoe_swa": (
        _F(
            "GraniteMoeSWAConfig",
            "GraniteMoeSWAForCausalLM",
            {**_GRANITE, **_SLIDING, **_EXPERTS, "intermediate_size": 128},
            attn="eager",
            experts="batched_mm",
        ),
        "as granite_swa, with top-2 of 4 experts",
    ),
    "modernbert-decoder": (
        _F(
            "ModernBertDecoderConfig",
            "ModernBertDecoderForCausalLM",
            {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
        ),
        "LayerNorm without bias, one Wqkv, GeGLU, sliding layers",
    ),
    "minimax_m2": (
        _F(
            "MiniMaxM2Config",
            "MiniMaxM2ForCausalLM",
            {**_EXPERTS, "intermediate_size": 128, "head_dim": H},
            experts="batched_mm",
        ),
        "q/k RMSNorm over all heads, sigmoid router with a selection bias",
    ),
    "dbrx": (
        _F("DbrxConfig", "DbrxForCausalLM", {}, base=_DBRX, experts="batched_mm"),
        "fused Wqkv clipped, LayerNorm without bias, top-2 of 4 experts",
    ),
    "cohere2_moe": (
        _F(
            "Cohere2MoeConfig",
            "Cohere2MoeForCausalLM",
            {**_SLIDING, **_SPARSE, "num_experts": 4, "num_experts_per_tok": 2, "head_dim": H},
            experts="batched_mm",
        ),
        "parallel block, sliding layers with rotary, top-2 of 4 experts",
    ),
    "solar_open": (
        _F(
            "SolarOpenConfig",
            "SolarOpenForCausalLM",
            {
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "head_dim": H,
                "n_group": 1,
                "topk_group": 1,
            },
            experts="batched_mm",
        ),
        "sigmoid router with a selection bias, a shared expert",
    ),
    "mellum": (
        _F(
            "MellumConfig",
            "MellumForCausalLM",
            {**_SLIDING, **_SPARSE, **_EXPERTS, "moe_intermediate_size": 128, "head_dim": H},
            experts="batched_mm",
        ),
        "q/k norms per head, sliding layers with their own rotary base, top-2 of 4 experts",
    ),
    "laguna": (
        _F(
            "LagunaConfig",
            "LagunaForCausalLM",
            {
                **_SLIDING,
                **_SPARSE,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "shared_expert_intermediate_size": 128,
                "num_attention_heads_per_layer": [8, 8],
                "head_dim": H,
            },
            experts="batched_mm",
        ),
        "softplus gate per head on the attention, partial rotary on full layers, sigmoid router",
    ),
    "youtu": (
        _F("YoutuConfig", "YoutuForCausalLM", dict(_MLA_HEADS)),
        "multi-head latent attention, interleaved rotary",
    ),
    "glm4_moe_lite": (
        _F(
            "Glm4MoeLiteConfig",
            "Glm4MoeLiteForCausalLM",
            {
                **_MLA_HEADS,
                **_SPARSE,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "n_group": 1,
                "topk_group": 1,
            },
            experts="batched_mm",
        ),
        "multi-head latent attention, sigmoid router with a bias",
    ),
    "lfm2": (
        _F(
            "Lfm2Config",
            "Lfm2ForCausalLM",
            {"layer_types": ["conv", "full_attention"], "block_auto_adjust_ff_dim": False},
        ),
        "a gated short convolution layer beside an attention layer, q/k norms",
    ),
    "lfm2_moe": (
        _F(
            "Lfm2MoeConfig",
            "Lfm2MoeForCausalLM",
            {
                "layer_types": ["conv", "full_attention"],
                "num_dense_layers": 0,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
            },
            experts="batched_mm",
        ),
        "short convolution and attention layers, sigmoid router with a bias",
    ),
    "qwen3_next": (
        _F(
            "Qwen3NextConfig",
            "Qwen3NextForCausalLM",
            {
                **_LINEAR,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "shared_expert_intermediate_size": 128,
            },
            experts="batched_mm",
        ),
        "Gated DeltaNet layer, sigmoid-gated attention, (1 + w) norms, experts",
    ),
    "qwen3_5_text": (
        _F("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(_LINEAR)),
        "Gated DeltaNet layer, sigmoid-gated attention, partial rotary",
    ),
    "olmo_hybrid": (
        _F("OlmoHybridConfig", "OlmoHybridForCausalLM", dict(_LINEAR)),
        "Gated DeltaNet layer beside attention with q/k RMSNorm over all heads",
    ),
    "bamba": (
        _F("BambaConfig", "BambaForCausalLM", {**_MAMBA2, "attn_layer_indices": [1]}),
        "a Mamba-2 layer beside an attention layer, partial rotary",
    ),
    "falcon_h1": (
        _F(
            "FalconH1Config",
            "FalconH1ForCausalLM",
            {**_MAMBA2, "mamba_d_ssm": 512, "head_dim": H},
        ),
        "Mamba-2 and attention in parallel in every layer",
    ),
    "granitemoehybrid": (
        _F(
            "GraniteMoeHybridConfig",
            "GraniteMoeHybridForCausalLM",
            {
                **_MAMBA2,
                **_GRANITE,
                **_EXPERTS,
                "layer_types": ["mamba", "attention"],
                "intermediate_size": 128,
                "shared_intermediate_size": 256,
            },
            experts="batched_mm",
        ),
        "Mamba-2 and attention layers, top-2 of 4 experts beside a shared MLP",
    ),
    "jamba": (
        _F(
            "JambaConfig",
            "JambaForCausalLM",
            {
                "attn_layer_period": 2,
                "attn_layer_offset": 1,
                "expert_layer_period": 2,
                "expert_layer_offset": 1,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "mamba_dt_rank": 16,
                "use_mamba_kernels": False,
            },
            experts="batched_mm",
        ),
        "a Mamba layer, then attention with experts; no rotary",
    ),
}
