"""The sixth survey's families: encoders, vision and speech models, seq2seq decoders.

Why: the five decoder surveys (``unseen_families.py``) covered every causal-LM family of
transformers 5.24; users bring encoders too, whose attention is spelled by other hands:
relative position biases (BEiT, MPNet, WavLM's gated one, Funnel's), a key shorter than
the query (SegFormer's and PVT's spatial reduction, Perceiver's latents), learned
attention biases (LeViT), rotary positions in an encoder (RoFormer, ESM, Pixtral's 2-D
one), a causal mask in an encoder (CLIP's text tower), cosine attention (Swin-V2), and
cross-attention in a seq2seq decoder (the decoder alone, the encoder's states an input).
None is in the corpus (``_torch_families.py``, ``make_transformer_models.py``, the wheel
models): ViT and DistilBERT are, so they are not here.

Each is built from its config at the survey's sizes (2 layers, hidden 256, 8 heads of 32
where the family takes them; 64x64 images; 1 s of 16 kHz audio through a narrow feature
encoder), seeded, with every 1-D parameter and BatchNorm statistic re-randomized
(``_torch_norms.randomize``, as the decoder survey), in the attention implementation
transformers picks by default (sdpa where the family has it). torch and transformers are
imported only when a model is built (``_unseen_encoder_export.build``), so the table
reads without them.
"""

from __future__ import annotations

from typing import NamedTuple

SEED = 0
LAYERS, HIDDEN, HEADS, FFN = 2, 256, 8, 512
VOCAB, POSITIONS = 256, 128
BATCH, SEQUENCE, PADDED = 2, 16, 4  # the example: the second row's last 4 tokens padded
IMAGE, PATCH, SAMPLES = 64, 8, 16000
KINDS = ("text", "image", "audio", "features", "decoder")


class Encoder(NamedTuple):
    config: str  # transformers class names
    model: str
    sizes: dict
    kind: str  # one of KINDS: the inputs the wrapper takes
    about: str  # what sets the family apart
    part: str = ""  # the attribute of the built model that is exported ("decoder")
    model_kwargs: dict = {}


_IDS = dict(initializer_range=0.05, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_TEXT = dict(
    _IDS,
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    max_position_embeddings=POSITIONS,
)
_VIT = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    image_size=IMAGE,
    patch_size=PATCH,
    initializer_range=0.05,
)
# wav2vec2's feature encoder at 64 channels (its 512 would dominate the graph): the same
# 7 convolutions, strides and kernels, 16000 samples -> 49 frames
_AUDIO = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    conv_dim=(64,) * 7,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
    initializer_range=0.05,
)
_SEQ2SEQ = dict(
    _IDS,
    vocab_size=VOCAB,
    d_model=HIDDEN,
    encoder_layers=LAYERS,
    decoder_layers=LAYERS,
    encoder_attention_heads=HEADS,
    decoder_attention_heads=HEADS,
    encoder_ffn_dim=FFN,
    decoder_ffn_dim=FFN,
    max_position_embeddings=POSITIONS,
    decoder_start_token_id=1,
    use_cache=False,
)
# SegFormer's and PVT-v2's two stages of one layer each: keys from a 4x then a 2x reduction
_REDUCTION = dict(
    num_encoder_blocks=2,
    depths=[1, 1],
    sr_ratios=[4, 2],
    hidden_sizes=[64, 128],
    patch_sizes=[7, 3],
    strides=[4, 2],
    num_attention_heads=[2, 4],
    mlp_ratios=[4, 4],
    initializer_range=0.05,
)
_NO_POOLER = {"add_pooling_layer": False}
_E = Encoder
FAMILIES = {  # family -> Encoder
    "deit": _E(
        "DeiTConfig",
        "DeiTModel",
        _VIT,
        "image",
        "ViT with a distillation token",
        model_kwargs=_NO_POOLER,
    ),
    "beit": _E(
        "BeitConfig",
        "BeitModel",
        dict(_VIT, use_relative_position_bias=True, layer_scale_init_value=0.1),
        "image",
        "relative position bias per layer added to the scores, layer scale",
        model_kwargs=_NO_POOLER,
    ),
    "dinov2": _E(
        "Dinov2Config",
        "Dinov2Model",
        dict(_VIT, mlp_ratio=2),
        "image",
        "layer scale on both branches, interpolated positions",
    ),
    "siglip_vision": _E(
        "SiglipVisionConfig",
        "SiglipVisionModel",
        _VIT,
        "image",
        "no class token; its attention-pooling head is not in the last hidden state",
    ),
    "pixtral": _E(
        "PixtralVisionConfig",
        "PixtralVisionModel",
        dict(_VIT, head_dim=HIDDEN // HEADS),
        "image",
        "2-D rotary positions in a vision encoder, RMSNorm, block-diagonal mask",
    ),
    "swinv2": _E(
        "Swinv2Config",
        "Swinv2Model",
        dict(
            image_size=IMAGE,
            patch_size=4,
            embed_dim=64,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
            initializer_range=0.05,
        ),
        "image",
        "scaled cosine attention (a learned logit scale), continuous position bias",
    ),
    "segformer": _E(
        "SegformerConfig",
        "SegformerModel",
        _REDUCTION,
        "image",
        "spatial-reduction attention: keys and values from a strided Conv, shorter than queries",
    ),
    "pvt_v2": _E(
        "PvtV2Config",
        "PvtV2Model",
        dict(_REDUCTION, image_size=IMAGE),
        "image",
        "spatial-reduction attention (Conv + LayerNorm on the keys' source), depthwise-conv MLP",
    ),
    "levit": _E(
        "LevitConfig",
        "LevitModel",
        # 128x128: LeViT's 16x patchify and two subsamplings leave 1 token of a 64x64 image
        dict(
            image_size=2 * IMAGE,
            hidden_sizes=[64, 128, 256],
            num_attention_heads=[2, 4, 8],
            depths=[1, 1, 1],
            key_dim=[16, 16, 16],
            initializer_range=0.05,
        ),
        "image",
        "learned attention biases gathered by offset, BatchNorm'd Linears, subsampled queries",
    ),
    "mobilevit": _E(
        "MobileViTConfig",
        "MobileViTModel",
        dict(
            image_size=IMAGE,
            hidden_sizes=[64, 80, 96],
            neck_hidden_sizes=[16, 24, 48, 64, 80, 96, 384],
            num_attention_heads=4,
            initializer_range=0.05,
        ),
        "image",
        "attention over unfolded 2x2 patches (pixels of one offset attend), convs around it",
        model_kwargs={"expand_output": False},
    ),
    "siglip_text": _E(
        "SiglipTextConfig",
        "SiglipTextModel",
        _TEXT,
        "text",
        "SigLIP's text tower: bidirectional, last-token pooling",
    ),
    "clip_text": _E(
        "CLIPTextConfig",
        "CLIPTextModel",
        _TEXT,
        "text",
        "a causal mask in an encoder, beside the padding mask",
    ),
    "albert": _E(
        "AlbertConfig",
        "AlbertModel",
        dict(_TEXT, embedding_size=128),
        "text",
        "one layer's weights shared by both layers, factorized embeddings",
        model_kwargs=_NO_POOLER,
    ),
    "mpnet": _E(
        "MPNetConfig",
        "MPNetModel",
        dict(_TEXT, pad_token_id=1),
        "text",
        "T5-style bucketed relative position bias added to every layer's scores",
        model_kwargs=_NO_POOLER,
    ),
    "roformer": _E(
        "RoFormerConfig",
        "RoFormerModel",
        dict(_TEXT, embedding_size=HIDDEN),
        "text",
        "interleaved rotary (sinusoidal, rotate-every-two) in an encoder",
    ),
    "esm": _E(
        "EsmConfig",
        "EsmModel",
        dict(
            _TEXT,
            pad_token_id=1,
            mask_token_id=4,
            position_embedding_type="rotary",
            token_dropout=False,
        ),
        "text",
        "rotate-half rotary in an encoder, pre-norm, the query scaled before Q K^T",
        model_kwargs=_NO_POOLER,
    ),
    "funnel": _E(
        "FunnelConfig",
        "FunnelBaseModel",
        dict(
            _IDS,
            vocab_size=VOCAB,
            block_sizes=[1, 1],
            d_model=HIDDEN,
            n_head=HEADS,
            d_head=HIDDEN // HEADS,
            d_inner=FFN,
            max_position_embeddings=POSITIONS,
        ),
        "text",
        "queries mean-pooled between blocks, relative-shift positional attention",
    ),
    "big_bird": _E(
        "BigBirdConfig",
        "BigBirdModel",
        dict(_TEXT, attention_type="block_sparse", block_size=2, num_random_blocks=1),
        "text",
        "block-sparse attention (window, global and random blocks of 2)",
        model_kwargs=_NO_POOLER,
    ),
    "longformer": _E(
        "LongformerConfig",
        "LongformerModel",
        dict(_TEXT, attention_window=[4, 4], pad_token_id=1),
        "text",
        "sliding-window attention by chunked diagonals, padded to the window",
        model_kwargs=_NO_POOLER,
    ),
    "wav2vec2": _E(
        "Wav2Vec2Config",
        "Wav2Vec2Model",
        _AUDIO,
        "audio",
        "conv feature encoder, conv positions, post-norm layers, scaled query",
    ),
    "wavlm": _E(
        "WavLMConfig",
        "WavLMModel",
        dict(_AUDIO, num_buckets=32),
        "audio",
        "gated relative position bias (a sigmoid gate of the query per head)",
    ),
    "data2vec_audio": _E(
        "Data2VecAudioConfig",
        "Data2VecAudioModel",
        _AUDIO,
        "audio",
        "a stack of conv position layers, LayerNorm'd feature encoder",
    ),
    "perceiver": _E(
        "PerceiverConfig",
        "PerceiverModel",
        dict(
            num_latents=16,
            d_latents=HIDDEN,
            d_model=64,
            num_blocks=1,
            num_self_attends_per_block=LAYERS,
            num_self_attention_heads=HEADS,
            num_cross_attention_heads=1,
            initializer_range=0.05,
        ),
        "features",
        "latents cross-attend to the inputs (queries of their own length), then self-attend",
    ),
    "bart_decoder": _E(
        "BartConfig",
        "BartModel",
        _SEQ2SEQ,
        "decoder",
        "causal self-attention and cross-attention to the encoder's states",
        part="decoder",
    ),
    "t5_decoder": _E(
        "T5Config",
        "T5Model",
        dict(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            d_kv=HIDDEN // HEADS,
            num_layers=LAYERS,
            num_heads=HEADS,
            d_ff=FFN,
            decoder_start_token_id=0,
            use_cache=False,
        ),
        "decoder",
        "causal relative bias, unscaled scores, cross-attention without a bias",
        part="decoder",
    ),
}
