"""The transformer families of the corpus: tiny configs, seeded weights, their inputs.

Why: issue 13 asks for the families users deploy today that the test data does not
cover (Llama, Qwen2, Phi-3, GPT-J, Whisper's encoder, T5's encoder, Swin, DeBERTa-v2,
ModernBERT; issue 24 adds torch's own ``nn.TransformerEncoder``, ``_torch_encoder.py``),
each in every attention implementation transformers offers for it that
users get (eager, and sdpa where it is the default), built from a config with random
weights: nothing comes from a model hub. Sizes follow
``bench/make_transformer_models.py`` (2 layers, hidden 64, 4 heads, intermediate 128,
vocabulary 128, 64 positions), so a model optimizes and checks in seconds; its
wrappers and input generator are reused. The decoders are exported as prefill graphs
without a KV cache (``use_cache=False``); ``_torch_optimum.py`` makes the one with a
cache, the way users export it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import make_transformer_models as mtm
from _torch_encoder import TorchEncoderConfig, TorchEncoderModel
from _torch_norms import randomize

torch = mtm.torch
transformers = mtm.transformers
nn = mtm.nn

LAYERS, HIDDEN, HEADS, FFN = mtm.LAYERS, mtm.HIDDEN, mtm.HEADS, mtm.INTERMEDIATE
VOCAB, POSITIONS = mtm.VOCAB_SIZE, mtm.MAX_POSITIONS
MEL_BINS, AUDIO_POSITIONS = 16, 32  # Whisper: 16 mel bins, 64 input frames -> 32 positions
_TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # ids below every vocab
_TEXT = dict(vocab_size=VOCAB, max_position_embeddings=POSITIONS, initializer_range=0.1)
_DECODER = dict(
    **_TEXT,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=FFN,
    use_cache=False,
    **_TOKENS,
)


class Family(NamedTuple):
    """How to build one family: config and model classes, sizes, input kind."""

    config: type
    model: type
    sizes: dict
    kind: str  # "text" (input_ids, attention_mask), "image" (pixel_values), "audio"
    attentions: tuple[str, ...]
    decoder: bool = False
    blocks: int = LAYERS
    separate_qkv: bool = True  # q, k and v are three Linears (not one fused qkv Linear)
    interleaved_rotary: bool = False  # GPT-J's rotate_every_two: one per query and key
    # (attention, exporter) -> why that export is not made (an exporter failure)
    unexportable: dict[tuple[str, str], str] = {}


# torch 2.13's dynamo exporter cannot decompose these graphs (aten.view of the
# non-contiguous SDPA output, "Cannot view a tensor with shape ... and strides ...");
# the TorchScript export of the same model works.
_SDPA_VIEW = "dynamo: aten.view of the non-contiguous SDPA output fails to decompose"


def _whisper_encoder() -> type:
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    return WhisperEncoder


FAMILIES = {
    # Llama-2's layout: as many key/value heads as query heads
    "llama": Family(
        transformers.LlamaConfig,
        transformers.LlamaModel,
        dict(_DECODER, num_key_value_heads=HEADS),
        "text",
        ("eager", "sdpa"),
        decoder=True,
    ),
    # Qwen2's: grouped-query attention (2 key/value heads) and biased q/k/v projections
    "qwen2": Family(
        transformers.Qwen2Config,
        transformers.Qwen2Model,
        dict(_DECODER, num_key_value_heads=2),
        "text",
        ("eager", "sdpa"),
        decoder=True,
    ),
    # Phi-3's: one qkv_proj and one gate_up_proj Linear (nothing left to merge)
    "phi3": Family(
        transformers.Phi3Config,
        transformers.Phi3Model,
        dict(_DECODER, num_key_value_heads=HEADS),
        "text",
        ("eager", "sdpa"),
        decoder=True,
        separate_qkv=False,
    ),
    # GPT-J's: rotary embeddings on pairs of features (rotate_every_two), on the first
    # rotary_dim of each head only, sin and cos gathered from one table
    "gptj": Family(
        transformers.GPTJConfig,
        transformers.GPTJModel,
        dict(
            vocab_size=VOCAB,
            n_positions=POSITIONS,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=FFN,
            rotary_dim=HIDDEN // HEADS // 2,
            initializer_range=0.1,
            use_cache=False,
            **_TOKENS,
        ),
        "text",
        ("eager",),
        decoder=True,
        interleaved_rotary=True,
    ),
    "whisper_encoder": Family(
        transformers.WhisperConfig,
        _whisper_encoder(),
        dict(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            encoder_layers=LAYERS,
            encoder_attention_heads=HEADS,
            encoder_ffn_dim=FFN,
            decoder_layers=LAYERS,
            decoder_attention_heads=HEADS,
            decoder_ffn_dim=FFN,
            num_mel_bins=MEL_BINS,
            max_source_positions=AUDIO_POSITIONS,
            init_std=0.1,
            **_TOKENS,
            decoder_start_token_id=1,
        ),
        "audio",
        ("eager", "sdpa"),
    ),
    "t5_encoder": Family(
        transformers.T5Config,
        transformers.T5EncoderModel,
        dict(
            vocab_size=VOCAB,
            d_model=HIDDEN,
            d_kv=HIDDEN // HEADS,
            num_layers=LAYERS,
            num_heads=HEADS,
            d_ff=FFN,
            initializer_factor=1.0,
            use_cache=False,
        ),
        "text",
        ("eager", "sdpa"),
        unexportable={("sdpa", "dynamo"): _SDPA_VIEW},
    ),
    # two stages of 2 blocks (window, then shifted window), 32x32 images in 2x2 patches
    "swin": Family(
        transformers.SwinConfig,
        transformers.SwinModel,
        dict(
            image_size=mtm.IMAGE_SIZE,
            patch_size=2,
            embed_dim=32,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
            initializer_range=0.1,
        ),
        "image",
        ("eager", "sdpa"),
        blocks=4,
        unexportable={("sdpa", "dynamo"): _SDPA_VIEW},
    ),
    # DeBERTa-v2 has eager attention only (disentangled relative-position attention)
    "deberta_v2": Family(
        transformers.DebertaV2Config,
        transformers.DebertaV2Model,
        dict(
            _TEXT,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            position_buckets=16,
        ),
        "text",
        ("eager",),
    ),
    # one global and one sliding-window (16 tokens) layer, rotary positions, GeGLU
    "modernbert": Family(
        transformers.ModernBertConfig,
        transformers.ModernBertModel,
        dict(
            _TEXT,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            global_attn_every_n_layers=2,
            local_attention=16,
            **_TOKENS,
            cls_token_id=1,
            sep_token_id=2,
        ),
        "text",
        ("eager", "sdpa"),
        separate_qkv=False,
    ),
    # issue 24: torch's own nn.TransformerEncoder (packed in_proj, post-norm, GELU)
    "torch_encoder": Family(
        TorchEncoderConfig,
        TorchEncoderModel,
        dict(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            intermediate_size=FFN,
            max_position_embeddings=POSITIONS,
            pad_token_id=0,
        ),
        "text",
        ("sdpa",),
        separate_qkv=False,
    ),
}


class AudioLastHiddenState(nn.Module):
    """Calls Whisper's encoder by keyword and returns only last_hidden_state."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.model(input_features=input_features, return_dict=False)[0]


_WRAPPERS = {
    "text": mtm.TextLastHiddenState,
    "image": mtm.ImageLastHiddenState,
    "audio": AudioLastHiddenState,
}


def config_text(family: str) -> str:
    """The config sizes as canonical JSON (part of the corpus's idempotency key)."""
    spec = FAMILIES[family]
    return f"{spec.config.__name__}({json.dumps(spec.sizes, sort_keys=True)})"


def build(family: str, attn: str) -> nn.Module:
    """Seeded model with randomized norms and biases, wrapped, in inference mode."""
    spec = FAMILIES[family]
    config = spec.config(**spec.sizes, attn_implementation=attn)
    torch.manual_seed(mtm.SEED)
    model = spec.model(config)
    if model.config._attn_implementation != attn:
        raise RuntimeError(
            f"{family}: asked for attn_implementation={attn!r}, "
            f"transformers chose {model.config._attn_implementation!r}"
        )
    randomize(model, seed=mtm.SEED)
    return _WRAPPERS[spec.kind](model).train(False)


def make_inputs(model: nn.Module, batch: int, sequence: int) -> dict[str, torch.Tensor]:
    """Inputs at (batch, sequence): make_transformer_models' for text and images."""
    if not isinstance(model, AudioLastHiddenState):
        return mtm.make_inputs(model, batch, sequence)
    gen = torch.Generator().manual_seed(mtm.SEED + batch)
    shape = (batch, MEL_BINS, 2 * AUDIO_POSITIONS)  # the encoder takes one fixed length
    return {"input_features": torch.randn(shape, generator=gen)}
