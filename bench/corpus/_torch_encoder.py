"""``torch.nn.TransformerEncoder`` as a corpus family: no transformers, torch's own layers.

Why: issue 24 asks for attention in every exporter's spelling, and the encoder people
write without transformers is ``nn.TransformerEncoder``: its ``nn.MultiheadAttention``
keeps q, k and v in one packed ``in_proj_weight`` and calls
``F.multi_head_attention_forward``, which both exporters spell differently from any
transformers model. The model here is token and position embeddings, then
``nn.TransformerEncoder`` (``batch_first``, post-norm layers, GELU, no dropout, no nested
tensors) with the padding mask from ``attention_mask``; the config and model classes
look like transformers' (``config._attn_implementation``, ``model.config.pad_token_id``,
``model(input_ids=, attention_mask=, return_dict=False)``) so ``_torch_families.build``
and ``make_transformer_models``' wrapper, inputs and exporters take it as they are.
"""

from __future__ import annotations

import torch
from torch import nn


class TorchEncoderConfig:
    """Sizes of the encoder, in transformers' names."""

    def __init__(
        self,
        *,
        vocab_size: int,
        hidden_size: int,
        num_hidden_layers: int,
        num_attention_heads: int,
        intermediate_size: int,
        max_position_embeddings: int,
        pad_token_id: int = 0,
        attn_implementation: str = "sdpa",
    ) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.pad_token_id = pad_token_id
        # nn.MultiheadAttention calls scaled_dot_product_attention when no weights are
        # asked for (TransformerEncoderLayer never asks): "sdpa" is the only one it has
        self._attn_implementation = attn_implementation


class TorchEncoderModel(nn.Module):
    """Embeddings + ``nn.TransformerEncoder``; returns ``(last_hidden_state,)``."""

    def __init__(self, config: TorchEncoderConfig) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.tokens = nn.Embedding(config.vocab_size, hidden, padding_idx=config.pad_token_id)
        self.positions = nn.Embedding(config.max_position_embeddings, hidden)
        layer = nn.TransformerEncoderLayer(
            hidden,
            config.num_attention_heads,
            config.intermediate_size,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, config.num_hidden_layers, enable_nested_tensor=False
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        return_dict: bool = False,
    ) -> tuple[torch.Tensor]:
        del return_dict  # always a tuple, as transformers' return_dict=False
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        hidden = self.tokens(input_ids) + self.positions(positions)[None]
        return (self.encoder(hidden, src_key_padding_mask=attention_mask == 0),)
