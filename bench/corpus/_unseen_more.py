"""The second half of ``unseen_families``'s survey: decoder families transformers 5.24
ships that neither the corpus nor the first survey (stops 35-38) names, taken as a user
would bring them (issue 24, stop 41). Sizes as ``_llm_families.BASE`` unless a family
spells them its own way; a mixture of experts has 4 experts, top-2. Families whose
export fails in both exporters here (DeepSeek-V2's complex rotary, ``aten::polar``;
Llama-4) are left out: there is nothing to optimize.
"""

from __future__ import annotations

import _llm_families as fam

H = fam.HEAD_DIM
_F = fam.Family
_IDS = dict(vocab_size=256, initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
_GROUPED = {"first_k_dense_replace": 0, "n_group": 1, "topk_group": 1}  # DeepSeek-V3's router
_LAYER_TYPES = {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
_MPT = dict(_IDS, d_model=256, n_layers=2, n_heads=8, max_seq_len=128)
_GPT_OSS = {"num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": H, **_LAYER_TYPES}
_MLA = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32}
MORE = {  # family -> (Family, what sets it apart)
    "gpt_oss": (
        _F("GptOssConfig", "GptOssForCausalLM", _GPT_OSS, experts="batched_mm", attn="eager"),
        "attention sinks, chunked rotary, biased router, clamped SwiGLU experts",
    ),
    "cohere2": (
        _F("Cohere2Config", "Cohere2ForCausalLM", _LAYER_TYPES),
        "sliding layers with rotary, a global layer without",
    ),
    "exaone4": (
        _F("Exaone4Config", "Exaone4ForCausalLM", _LAYER_TYPES),
        "q/k RMSNorm, post-norms, sliding layers",
    ),
    "helium": (_F("HeliumConfig", "HeliumForCausalLM", {"head_dim": H}), "RMSNorm by Reciprocal"),
    "arcee": (_F("ArceeConfig", "ArceeForCausalLM", {}), "squared-ReLU MLP without a gate"),
    "apertus": (_F("ApertusConfig", "ApertusForCausalLM", {}), "xIELU MLP, q/k RMSNorm"),
    "ernie4_5": (
        _F("Ernie4_5Config", "Ernie4_5ForCausalLM", {"head_dim": H}),
        "interleaved rotary written with a stack",
    ),
    "hunyuan_v1_dense": (
        _F("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {"head_dim": H}),
        "q/k RMSNorm after the rotary",
    ),
    "seed_oss": (_F("SeedOssConfig", "SeedOssForCausalLM", {"head_dim": H}), "q/k/v biases"),
    "glm4": (
        _F("Glm4Config", "Glm4ForCausalLM", {"head_dim": H, "partial_rotary_factor": 0.5}),
        "sandwich norms, partial interleaved rotary",
    ),
    "olmo3": (_F("Olmo3Config", "Olmo3ForCausalLM", _LAYER_TYPES), "q/k norms, sliding layers"),
    "ministral": (
        _F("MinistralConfig", "MinistralForCausalLM", {**_LAYER_TYPES, "head_dim": H, **_ROPE}),
        "sliding and full layers",
    ),
    "vaultgemma": (
        _F(
            "VaultGemmaConfig",
            "VaultGemmaForCausalLM",
            {"head_dim": H, "query_pre_attn_scalar": H},
            attn="eager",
        ),
        "Gemma's soft-capping, no post-norms",
    ),
    "gemma4_text": (
        _F("Gemma4TextConfig", "Gemma4ForCausalLM", {"head_dim": H}),
        "RMSNorm by Pow(-0.5), q/k/v norms",
    ),
    "mpt": (_F("MptConfig", "MptForCausalLM", {}, base=_MPT, attn="eager"), "ALiBi table sliced"),
    "diffllama": (
        _F("DiffLlamaConfig", "DiffLlamaForCausalLM", {}),
        "differential attention: two softmaxes subtracted",
    ),
    "doge": (_F("DogeConfig", "DogeForCausalLM", {}), "a dynamic mask from the values"),
    "jetmoe": (_F("JetMoeConfig", "JetMoeForCausalLM", {}), "mixture of attention heads"),
    "jais2": (_F("Jais2Config", "Jais2ForCausalLM", {"head_dim": H}), "LayerNorm, ReLU^2"),
    "hunyuan_v1_moe": (
        _F(
            "HunYuanMoEV1Config",
            "HunYuanMoEV1ForCausalLM",
            {"num_experts": 4, "moe_topk": 2, "head_dim": H},
            experts="batched_mm",
        ),
        "top-2 of 4 experts, q/k norms",
    ),
    "ernie4_5_moe": (
        _F(
            "Ernie4_5_MoeConfig",
            "Ernie4_5_MoeForCausalLM",
            {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 128, "head_dim": H},
            experts="batched_mm",
        ),
        "experts picked by softmax plus a bias, weighted without it",
    ),
    "glm4_moe": (
        _F(
            "Glm4MoeConfig",
            "Glm4MoeForCausalLM",
            {
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "head_dim": H,
                **_GROUPED,
            },
            experts="batched_mm",
        ),
        "sigmoid router with a selection bias (DeepSeek-V3's)",
    ),
    "dots1": (
        _F(
            "Dots1Config",
            "Dots1ForCausalLM",
            {
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 128,
                "head_dim": H,
                "n_shared_experts": 1,
                **_GROUPED,
            },
            experts="batched_mm",
        ),
        "sigmoid router with a selection bias, a shared expert",
    ),
    "nanochat": (
        _F("NanoChatConfig", "NanoChatForCausalLM", {"head_dim": H}),
        "chunked rotary by -theta, weightless q/k norm after it",
    ),
    "bitnet": (_F("BitNetConfig", "BitNetForCausalLM", {}), "sub-norms in attention and MLP"),
    "cwm": (_F("CwmConfig", "CwmForCausalLM", {"head_dim": H, "sliding_window": 8}), "sliding"),
    "afmoe": (
        _F(
            "AfmoeConfig",
            "AfmoeForCausalLM",
            {**_MOE, "head_dim": H, "num_dense_layers": 0},
            experts="batched_mm",
        ),
        "sigmoid router, gated attention",
    ),
    "granitemoeshared": (
        _F(
            "GraniteMoeSharedConfig",
            "GraniteMoeSharedForCausalLM",
            {"num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 128},
            experts="batched_mm",
        ),
        "top-2 of 4 experts beside a shared MLP",
    ),
    "exaone_moe": (
        _F(
            "ExaoneMoeConfig", "ExaoneMoeForCausalLM", {**_MOE, "head_dim": H}, experts="batched_mm"
        ),
        "sigmoid router",
    ),
    "flex_olmo": (
        _F("FlexOlmoConfig", "FlexOlmoForCausalLM", dict(_MOE), experts="batched_mm"),
        "top-2 of 4 experts, q/k norms",
    ),
    "minicpm3": (
        _F(
            "MiniCPM3Config",
            "MiniCPM3ForCausalLM",
            {**_MLA, "v_head_dim": 32, "num_key_value_heads": 8},
        ),
        "multi-head latent attention (q and k of nope and rope parts)",
    ),
}
