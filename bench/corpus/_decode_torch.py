"""The torch reference of the padded decode: the family's torch model fed the feeds and
tokens its graph is fed, so that the original graph's difference from it is the
export's own error."""

from __future__ import annotations

import warnings

import numpy as np
from _decode_loop import Decoder
from _decoder_steps import positions


class TorchDecoder(Decoder):
    """The family's torch model fed as its graph is (one token a call where the graph
    takes one): the export's own error, the cache classes as exported, a top-k's exact
    ties broken as onnxruntime breaks them (``_topk_ties``)."""

    def __init__(self, family: str, one_token: bool) -> None:
        import _llm_families as fam

        warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated")
        self.model = fam.build(family)
        self.one_token, self.one_row = one_token, False

    def start(self, batch: int) -> None:
        import _kv_states as kv

        self.cache = kv.new_cache(self.model.config)

    def step(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch
        from _topk_ties import onnx_ties

        with torch.no_grad(), onnx_ties():
            out = self.model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=torch.from_numpy(positions(mask, ids.shape[1])),
                past_key_values=self.cache,
                use_cache=True,
            )
        self.cache = out.past_key_values
        return out.logits.numpy()
