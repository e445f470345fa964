"""The sixth survey's exports: wrappers per input kind, example inputs, both exporters.

Why: the decoder survey's exports (``_llm_torch``) take ids and a mask and return logits;
an encoder takes pixels, audio samples, features, or (a seq2seq decoder) ids beside the
encoder's states, and returns its last hidden state. The exporters are called as
``_llm_torch`` calls them: TorchScript at opset 17, dynamo at 18 with its optimizer on
(what users get) and the stack traces dropped. The batch is a dim in both; a text
input's length too (``Dim("sequence", max=POSITIONS)``), and a decoder's encoder length
is a dim of its own; an image's size and the audio's length stay as exported (a vision
model's patch grid and a feature encoder's convolutions fix them in most users' graphs).
"""

from __future__ import annotations

from pathlib import Path

import _unseen_encoders as enc
import torch
import transformers
from _llm_torch import DYNAMO_OPSET, TORCHSCRIPT_OPSET, _strip_stack_traces
from _torch_norms import randomize
from torch import nn


class _Last(nn.Module):
    """Calls the model by keyword (transformers 5 cannot be traced positionally:
    ``make_transformer_models.TextLastHiddenState``) and returns the first output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


class Text(_Last):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


class Image(_Last):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=False)[0]


class Audio(_Last):
    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        return self.model(input_values=input_values, return_dict=False)[0]


class Features(_Last):
    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(inputs=inputs, attention_mask=attention_mask, return_dict=False)[0]


class Decoder(_Last):
    """A seq2seq decoder alone: its ids and mask, the encoder's states and mask."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=False,
            return_dict=False,
        )
        return out[0]


WRAPPERS = {"text": Text, "image": Image, "audio": Audio, "features": Features, "decoder": Decoder}


def build(family: str, attn: str | None = None):
    """The family's model (its ``part``), seeded, 1-D parameters re-randomized, wrapped to
    take the kind's inputs by keyword and return the last hidden state, in inference mode;
    ``attn``: the attention implementation (None: the one transformers picks)."""
    spec = enc.FAMILIES[family]
    chosen = {"attn_implementation": attn} if attn else {}
    config = getattr(transformers, spec.config)(**spec.sizes, **chosen)
    torch.manual_seed(enc.SEED)
    model = getattr(transformers, spec.model)(config, **spec.model_kwargs)
    randomize(model, seed=enc.SEED)
    if spec.part:
        model = getattr(model, spec.part)
    return WRAPPERS[spec.kind](model).train(False)


def _ids_and_mask(gen: torch.Generator, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids above the special tokens; the second row's last ``PADDED`` positions masked."""
    ids = torch.randint(3, enc.VOCAB, (enc.BATCH, length), generator=gen)
    mask = torch.ones(enc.BATCH, length, dtype=torch.int64)
    mask[1, length - enc.PADDED :] = 0
    return ids, mask


def inputs(family: str, model: nn.Module) -> tuple[dict, dict]:
    """The example inputs by name, and each input's dynamic axes by name."""
    kind = enc.FAMILIES[family].kind
    gen = torch.Generator().manual_seed(enc.SEED)
    text = {0: "batch", 1: "sequence"}
    if kind == "image":
        side = getattr(model.model.config, "image_size", enc.IMAGE)  # LeViT's is larger
        height, width = side if isinstance(side, (tuple, list)) else (side, side)  # PVT-v2's
        pixels = torch.randn(enc.BATCH, 3, height, width, generator=gen)
        return {"pixel_values": pixels}, {"pixel_values": {0: "batch"}}
    if kind == "audio":
        samples = torch.randn(enc.BATCH, enc.SAMPLES, generator=gen)
        return {"input_values": samples}, {"input_values": {0: "batch"}}
    if kind == "features":
        width = model.model.config.d_model
        feats = torch.randn(enc.BATCH, enc.SEQUENCE, width, generator=gen)
        _, mask = _ids_and_mask(gen, enc.SEQUENCE)
        return {"inputs": feats, "attention_mask": mask}, {"inputs": text, "attention_mask": text}
    ids, mask = _ids_and_mask(gen, enc.SEQUENCE)
    if kind == "text":
        return {"input_ids": ids, "attention_mask": mask}, {
            "input_ids": text,
            "attention_mask": text,
        }
    source = {0: "batch", 1: "encoder_sequence"}
    states = torch.randn(enc.BATCH, enc.SEQUENCE + 3, enc.HIDDEN, generator=gen)
    _, source_mask = _ids_and_mask(gen, enc.SEQUENCE + 3)
    feeds = dict(
        input_ids=ids,
        attention_mask=mask,
        encoder_hidden_states=states,
        encoder_attention_mask=source_mask,
    )
    axes = dict(input_ids=text, attention_mask=text)
    return feeds, axes | dict(encoder_hidden_states=source, encoder_attention_mask=source)


def export(family: str, kind: str, path: Path, attn: str | None = None) -> None:
    """``family`` exported by ``kind`` ("torchscript" or "dynamo") to ``path``, in the
    attention implementation ``attn`` (None: transformers' default for it)."""
    model = build(family, attn)
    feeds, axes = inputs(family, model)
    names = dict(input_names=list(feeds), output_names=["last_hidden_state"])
    if kind == "torchscript":
        # the output's axes left to the exporter: Funnel pools the length, Pixtral joins
        # the images of a batch into one sequence
        torch.onnx.export(
            model,
            tuple(feeds.values()),
            str(path),
            dynamo=False,
            opset_version=TORCHSCRIPT_OPSET,
            dynamic_axes=axes,
            **names,
        )
        return
    dims = {}  # one torch Dim per name: inputs sharing a name share the dim
    shapes = {
        name: {axis: dims.setdefault(dim, _dim(dim)) for axis, dim in spec.items()}
        for name, spec in axes.items()
    }
    program = torch.onnx.export(
        model,
        tuple(feeds.values()),
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        dynamic_shapes=shapes,
        **names,
    )
    _strip_stack_traces(program)
    program.save(str(path), external_data=False)


def _dim(name: str):
    return torch.export.Dim(name) if name == "batch" else torch.export.Dim(name, max=enc.POSITIONS)
