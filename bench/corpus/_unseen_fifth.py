"""The fifth batch of ``unseen_families``'s survey: decoder families transformers 5.24
ships that neither the corpus nor the first four surveys name (issue 24, survey 5),
most-used first: DeepSeek's latent attention and its sparse (indexer) variants, Llama 4's
chunked and NoPE layers, RecurrentGemma's RG-LRU beside local attention, the newer
hybrids (Gated DeltaNet, Kimi delta attention, short convolutions), per-token attention
sinks, soft-capped experts, byte patches with cross-attention (BLT) and an attention-free
xLSTM. Sizes as ``_llm_families.BASE`` unless a family spells them its own way; a
mixture of experts has 4 experts, top 2; a layer list is set so that every kind of layer
the family has appears (a dense layer beside a MoE layer, a sliding layer beside a full
one, a recurrent layer beside attention): LaraMini and LFM3 have three kinds, so 3
layers; Zamba's two layers are both hybrid (its shared block is tied between hybrid
layers, and transformers refuses a single one). A family without an SDPA path
(DeepSeek-V4, HY-V4, Inkling2, GPT-NeoX-Japanese, xLSTM, OpenAI GPT) exports eager
attention; so does CTRL, as survey 1's GPT-Neo and XGLM.

ExaONE, InternLM3 and IQuest-Coder are left out: transformers builds them as
``LlamaForCausalLM`` (their configs only rename keys), which the corpus names. Sarvam-MLA
and Sarvam-MoE are kept although built by DeepSeek-V3's and GLM-4-MoE's classes: their
configs change the graph (no q LoRA and one expert group; full rotary, q/k RMSNorm and a
dense first layer). BLT is built with ``patch_in_forward=False`` (one patch per byte): its
entropy patcher's patch lengths are data.
"""

from __future__ import annotations

import _llm_families as fam

H = fam.HEAD_DIM
_F = fam.Family
_IDS = dict(vocab_size=256, initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = {"experts": "batched_mm"}
_MLA = {
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": H,
    "num_key_value_heads": 8,
}
_ROUTED = {  # DeepSeek's routed experts: 4, top 2, one shared, in the second layer only
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "first_k_dense_replace": 1,
}
_DEEPSEEK_V3 = {**_MLA, **_ROUTED, "n_group": 2, "topk_group": 1}
_DEEPSEEK_V2 = {**_MLA, **_ROUTED, "q_lora_rank": None, "topk_method": "greedy"}
_LLAMA4 = {
    "head_dim": H,
    "intermediate_size": 128,  # an expert's
    "intermediate_size_mlp": 512,  # the dense layers'
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "no_rope_layers": [1, 0],  # 1: rotary (chunked attention), 0: NoPE (full, temperature)
    "moe_layers": [1],
    "attention_chunk_size": 4,
    "floor_scale": 4,  # NoPE layers' attention temperature changes within the prompt
}
_RECURRENT_GEMMA = dict(
    _IDS,
    hidden_size=256,
    intermediate_size=1024,  # the MLP's is half
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    lru_width=256,
    attention_window_size=8,
    block_types=["recurrent", "attention"],
)
_LINEAR = {  # Gated DeltaNet's sizes, as the third survey's
    "layer_types": ["linear_attention", "full_attention"],
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "head_dim": H,
}
_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 128}
_GEMMA4_UNIFIED = {
    "head_dim": H,
    "global_head_dim": 64,  # the full layers' heads are twice as wide
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,  # the full layers' values are their keys
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 8,
}
_INDEXER = {"index_topk": 4, "index_head_dim": 32, "index_n_heads": 4}  # 4 of 7 keys
_DSA = {**_DEEPSEEK_V3, **_INDEXER, "mlp_layer_types": ["dense", "sparse"]}
_DEEPSEEK_V4 = {
    "head_dim": H,
    "partial_rotary_factor": 0.5,
    "num_key_value_heads": 1,
    "q_lora_rank": 64,
    "o_groups": 2,
    "o_lora_rank": 64,
    "hc_mult": 2,
    "sliding_window": 4,
    "layer_types": ["compressed_sparse_attention", "heavily_compressed_attention"],
    "compress_rates": {"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
    "mlp_layer_types": ["hash_moe", "moe"],
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "index_topk": 2,
    "index_head_dim": 32,
    "index_n_heads": 4,
}
_SARVAM_MOE = {
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "first_k_dense_replace": 1,
    "head_dim": H,
}
_HY_V3 = {
    "head_dim": H,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "mlp_layer_types": ["dense", "sparse"],
}
_HY_V4 = {
    **_MLA,
    **_ROUTED,
    **_INDEXER,
    "n_group": 1,
    "topk_group": 1,
    "mlp_layer_types": ["dense", "sparse"],
    "indexer_types": ["full", "shared"],
    "hc_mult": 2,
}
_AXK1 = {**_DEEPSEEK_V3, "mlp_layer_types": ["dense", "sparse"]}
_AXK2 = {**_AXK1, **_INDEXER, "n_group": None, "topk_group": None, "gated_norm_rank": 8}
_APERTUS = {
    "output_vocab_size": 200,
    "rope_parameters": {  # its default llama3 scaling, with an original length the prompt passes
        "rope_type": "llama3",
        "rope_theta": 12000000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 32,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
}
_ARIA = {"intermediate_size": 128, "moe_num_experts": 4, "moe_topk": 2, "moe_num_shared_experts": 1}
_BAILING = {
    **_MLA,
    "q_lora_rank": None,
    "head_dim": H,  # the KDA layer's heads
    "layer_types": ["linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "sparse"],
    "num_experts": 4,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 128,
    "num_expert_group": 2,
    "topk_group": 1,
}
_COMPASS = {
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 8,
    "rope_parameters": {  # rotary on the sliding layers, NoPE full layers (Cohere2's)
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": None,
    },
}
_DOTS3 = {
    **_MLA,
    **_INDEXER,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 128,
    "shared_experts_intermediate_size": 128,
    "n_group": 1,
    "topk_group": 1,
    "mlp_layer_types": ["dense", "sparse"],
    "layer_types": ["indexed_attention", "sliding_attention"],
    "sliding_window": 4,
    "swa_num_attention_heads": 8,  # the sliding layers' latent attention, sized its own way
    "swa_num_key_value_heads": 8,
    "swa_q_lora_rank": 64,
    "swa_kv_lora_rank": 32,
    "swa_head_dim": 48,
    "swa_qk_nope_head_dim": 32,
    "swa_v_head_dim": 32,
}
_THREE = {"num_hidden_layers": 3}  # three kinds of layer: one each
_LARA = {
    **_LINEAR,
    **_EXPERTS,
    **_THREE,
    "shared_expert_intermediate_size": 128,
    "layer_types": ["linear_attention", "sliding_attention", "full_attention"],
    "sliding_window": 8,
}
_LFM3 = {
    **_THREE,
    "head_dim": H,
    "layer_types": ["conv", "sliding_attention", "full_attention"],
    "sliding_window": 8,
}
_MINIMAX_M3 = {
    "head_dim": H,
    "rotary_dim": 16,
    "intermediate_size": 128,
    "dense_intermediate_size": 512,
    "shared_intermediate_size": 128,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "mlp_layer_types": ["dense", "sparse"],
    "layer_types": ["minimax_m3_sparse", "full_attention"],
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_block_size": 2,
    "index_topk_blocks": 2,
    "index_local_blocks": 1,
}
_QWEN4 = {
    **_LINEAR,
    **_EXPERTS,
    "shared_expert_intermediate_size": 128,
    "layer_types": ["linear_attention", "indexed_attention"],
    "hc_count": 2,
    "hc_lowrank": 16,
    "ple_layer_ids": [1],  # one-indexed: the linear layer
    "ple_embed_dim": 64,
    "heads_per_ngram": 2,
    "ngram_vocab_size_base": 512,
    "make_ngram_vocab_size_divisible_by": 8,
    "split_ngram_parts": 1,
    "indexer_n_heads": 4,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 32,
    "indexer_budget": 4,
    "indexer_compress_ratio": 2,
}
_INKLING2 = {
    "head_dim": H,
    "swa_num_attention_heads": 8,
    "swa_num_key_value_heads": 2,
    "swa_head_dim": H,
    "sliding_window_size": 8,
    "d_rel": 8,
    "rel_extent": 16,
    "log_scaling_n_floor": 4,
    "layer_types": ["hybrid_sliding", "hybrid"],
    "moe_intermediate_size": 128,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "unpadded_vocab_size": 250,
    "n_layers_per_attn_res_block": 1,  # each layer a block of the attention residuals
}
_INKLING2_LOOP = {  # the second layer looped twice
    **_INKLING2,
    "loop_layer_index_start": 1,
    "loop_layer_index_end": 2,
    "loop_num_passes": 2,
    "loop_gate_rank": 8,
}
_CTRL = dict(_IDS, n_embd=256, n_layer=2, n_head=8, dff=512, n_positions=128)
_OPENAI_GPT = dict(_IDS, n_embd=256, n_layer=2, n_head=8, n_positions=128)
_NEOX_JAPANESE = dict(
    _IDS,
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,
    intermediate_multiple_size=2,
    max_position_embeddings=128,
)
_ZAMBA = dict(
    _IDS,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=8,
    max_position_embeddings=128,
    n_mamba_heads=2,
    mamba_d_state=16,
    use_mamba_kernels=False,
    layers_block_type=["hybrid", "hybrid"],  # Mamba layers behind one shared attention block
)
_BLT_LOCAL = {
    "hidden_size": 256,
    "hidden_size_global": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 512,
    "max_position_embeddings": 128,
    "cross_attn_k": 1,
}
_BLT = dict(
    vocab_size=260,
    initializer_range=0.05,
    max_position_embeddings=128,
    patch_in_forward=False,  # one patch per byte: the entropy patcher's lengths are data
    cross_attn_k=1,
    local_attention_window_len=8,
    encoder_hash_byte_group_size=[3],
    encoder_hash_byte_group_vocab=64,
    encoder_config=_BLT_LOCAL,
    decoder_config=_BLT_LOCAL,
    global_config={
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 128,
    },
)
_XLSTM = dict(
    _IDS,
    hidden_size=256,
    num_hidden_layers=2,
    num_heads=8,
    chunk_size=4,
)
FIFTH = {  # family -> (Family, what sets it apart)
    "deepseek_v3": (
        _F("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK_V3, **_MOE),
        "latent attention (q and kv LoRA), interleaved rotary, sigmoid router in 2 groups",
    ),
    "deepseek_v2": (
        _F("DeepseekV2Config", "DeepseekV2ForCausalLM", _DEEPSEEK_V2, **_MOE),
        "latent attention with a full q projection, complex rotary, softmax router",
    ),
    "llama4_text": (
        _F("Llama4TextConfig", "Llama4ForCausalLM", _LLAMA4, **_MOE),
        "chunked attention beside a NoPE layer with a temperature, L2 q/k norm, sigmoid top-k",
    ),
    "recurrent_gemma": (
        _F("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", {}, base=_RECURRENT_GEMMA),
        "RG-LRU layer beside local attention, half rotary, soft-capped logits",
    ),
    "qwen3_5_moe_text": (
        _F("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", {**_LINEAR, **_EXPERTS}, **_MOE),
        "Gated DeltaNet beside gated attention, top-2 of 4 experts and a gated shared expert",
    ),
    "gemma4_unified_text": (
        _F("Gemma4UnifiedTextConfig", "Gemma4UnifiedForCausalLM", _GEMMA4_UNIFIED),
        "sliding beside full layers of wider heads whose values are their keys, 1/4 rotary",
    ),
    "deepseek_v32": (
        _F("DeepseekV32Config", "DeepseekV32ForCausalLM", _DSA, **_MOE),
        "DeepSeek-V3's latent attention masked to its indexer's top-k keys (sparse attention)",
    ),
    "deepseek_v4": (
        _F("DeepseekV4Config", "DeepseekV4ForCausalLM", _DEEPSEEK_V4, attn="eager", **_MOE),
        "compressed sparse and heavily compressed attention, hyper-connections, hash MoE",
    ),
    "glm_moe_dsa": (
        _F(
            "GlmMoeDsaConfig",
            "GlmMoeDsaForCausalLM",
            {**_DSA, "n_group": 1, "indexer_types": ["full", "shared"]},
            **_MOE,
        ),
        "indexer-masked latent attention, the second layer reusing the first one's top-k",
    ),
    "sarvam_mla": (
        _F(
            "SarvamMLAConfig",
            "DeepseekV3ForCausalLM",
            {**_DEEPSEEK_V3, "q_lora_rank": None, "n_group": 1},
            **_MOE,
        ),
        "DeepSeek-V3's implementation with a full q projection and one expert group",
    ),
    "sarvam_moe": (
        _F("SarvamMoEConfig", "Glm4MoeForCausalLM", _SARVAM_MOE, **_MOE),
        "GLM-4-MoE's implementation with full rotary, q/k RMSNorm, a dense first layer",
    ),
    "hy_v3": (
        _F("HYV3Config", "HYV3ForCausalLM", _HY_V3, **_MOE),
        "q/k RMSNorm, sigmoid router with a selection bias, shared expert added in fp32",
    ),
    "hy_v4": (
        _F("HYV4Config", "HYV4ForCausalLM", _HY_V4, attn="eager", **_MOE),
        "indexer-masked latent attention with learned sinks, hyper-connections, SwiGLU clamp",
    ),
    "apertus1p5_text": (
        _F("Apertus1p5TextConfig", "Apertus1p5TextForCausalLM", _APERTUS),
        "xIELU MLP, q/k RMSNorm, llama3 rotary, an LM head pruned to 200 of 256 rows",
    ),
    "aria_text": (
        _F("AriaTextConfig", "AriaTextForCausalLM", _ARIA, **_MOE),
        "top-2 of 4 experts (grouped GEMM) beside a shared expert in every layer",
    ),
    "axk1": (
        _F("AXK1Config", "AXK1ForCausalLM", _AXK1, **_MOE),
        "DeepSeek-V3's latent attention and grouped sigmoid router, dense first layer",
    ),
    "axk2": (
        _F("AXK2Config", "AXK2ForCausalLM", _AXK2, **_MOE),
        "indexer-masked latent attention, RMSNorms behind a low-rank input-dependent gate",
    ),
    "bailing_hybrid": (
        _F("BailingHybridConfig", "BailingHybridForCausalLM", _BAILING, **_MOE),
        "Kimi delta attention layer beside latent attention, grouped sigmoid router",
    ),
    "cohere_compass_text": (
        _F("CohereCompassTextConfig", "CohereCompassForCausalLM", _COMPASS),
        "rotary sliding layers beside NoPE full layers, per-layer-type rotary tables",
    ),
    "dots3_note_text": (
        _F("Dots3NoteTextConfig", "Dots3NoteForCausalLM", _DOTS3, **_MOE),
        "indexer-masked latent attention beside sliding latent attention of other sizes",
    ),
    "lara_mini": (
        _F("LaraMiniConfig", "LaraMiniForCausalLM", _LARA, **_MOE),
        "Gated DeltaNet, sliding and full gated attention (3 layers), experts and a shared one",
    ),
    "lfm3": (
        _F("Lfm3Config", "Lfm3ForCausalLM", _LFM3),
        "short convolution, sliding and full attention (3 layers), head gates, sandwich norms",
    ),
    "minimax_m3_vl_text": (
        _F("MiniMaxM3VLTextConfig", "MiniMaxM3VLForCausalLM", _MINIMAX_M3, **_MOE),
        "block-sparse attention by a lightning indexer, partial rotary, clamped SwiGLU-OAI",
    ),
    "qwen4_exp_text": (
        _F("Qwen4ExpTextConfig", "Qwen4ExpForCausalLM", _QWEN4, **_MOE),
        "Gated DeltaNet beside indexer-sparse attention, hyper-connections, n-gram embeddings",
    ),
    "inkling2_text": (
        _F("Inkling2TextConfig", "Inkling2ForCausalLM", _INKLING2, attn="eager", **_MOE),
        "attention residuals over earlier blocks, L2-clipped q/k, soft-capped expert gates",
    ),
    "inkling2_loop_text": (
        _F(
            "Inkling2LoopTextConfig",
            "Inkling2LoopForCausalLM",
            _INKLING2_LOOP,
            attn="eager",
            **_MOE,
        ),
        "Inkling2 with a looped core layer and low-rank message gates between passes",
    ),
    "emu3": (
        _F("Emu3TextConfig", "Emu3ForCausalLM", {}),
        "Emu3's text decoder: Llama's block as its own class",
    ),
    "ctrl": (
        _F("CTRLConfig", "CTRLLMHeadModel", {}, base=_CTRL, attn="eager"),
        "sinusoidal positions, embeddings scaled by sqrt(d), pre-LayerNorm, ReLU MLP",
    ),
    "openai-gpt": (
        _F("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", {}, base=_OPENAI_GPT, attn="eager"),
        "post-LayerNorm, Conv1D projections, a causal bias buffer sliced per length",
    ),
    "gpt_neox_japanese": (
        _F(
            "GPTNeoXJapaneseConfig",
            "GPTNeoXJapaneseForCausalLM",
            {},
            base=_NEOX_JAPANESE,
            attn="eager",
        ),
        "attention output bias added after the residual, partial rotary, one qkv Linear",
    ),
    "zamba": (
        _F("ZambaConfig", "ZambaForCausalLM", {}, base=_ZAMBA),
        "one attention block shared by the hybrid layers on [hidden, embeddings], Mamba-1",
    ),
    "blt": (
        _F("BltConfig", "BltForCausalLM", {}, base=_BLT),
        "bytes: hash n-gram embeddings, local encoder and decoder with cross attention to patches",
    ),
    "xlstm": (
        _F("xLSTMConfig", "xLSTMForCausalLM", {}, base=_XLSTM, attn="eager"),
        "mLSTM blocks (matrix memory, exponential gates), no attention, soft-capped logits",
    ),
}
