"""The torch exports of ``export_llm.py``: prefill graphs from both exporters, and a
decode graph with the KV cache from the dynamo exporter.

Why: users export decoders themselves as often as through optimum. A prefill graph is
``model(input_ids, attention_mask).logits`` without a cache; the decode graph is how one
exports a cache with ``torch.onnx.export(dynamo=True)`` in transformers 5.24: a wrapper
whose inputs are the past keys and values as tensors, which it loads into a
``DynamicCache`` (without a config: every layer keeps the whole past, Mistral's window
is applied by the mask, as in optimum's export), and whose outputs are the logits and
the cache's keys and values after the step. The TorchScript exporter is not used for the
cache: optimum's export is that (it calls ``torch.onnx.export(dynamo=False)``).
"""

from __future__ import annotations

from pathlib import Path

import _llm_families as fam
import numpy as np
import torch
import transformers
from torch import nn

TORCHSCRIPT_OPSET, DYNAMO_OPSET = 17, 18
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


class PrefillLogits(nn.Module):
    """input_ids, attention_mask -> logits, no cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


class DecodeWithCache(nn.Module):
    """input_ids, attention_mask, position_ids, [past key, past value per layer] ->
    logits, present key, present value per layer."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, past: list[torch.Tensor]):
        cache = transformers.DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        presents = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *presents)


def _kv_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def _strip_stack_traces(program) -> None:
    for node in program.model.graph.all_nodes():  # as make_transformer_models.export_dynamo
        node.metadata_props.pop(STACK_TRACE_KEY, None)


def _export_prefill(model: nn.Module, path: Path, kind: str) -> None:
    ids = fam.prompt()
    args = (ids, torch.ones_like(ids))
    names = dict(input_names=["input_ids", "attention_mask"], output_names=["logits"])
    wrapper = PrefillLogits(model).train(False)
    if kind == "torchscript":
        axes = {n: {0: "batch", 1: "sequence"} for n in [*names["input_names"], "logits"]}
        torch.onnx.export(
            wrapper,
            args,
            str(path),
            dynamo=False,
            opset_version=TORCHSCRIPT_OPSET,
            dynamic_axes=axes,
            **names,
        )
        return
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", max=fam.POSITIONS)}
    program = torch.onnx.export(
        wrapper,
        args,
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        dynamic_shapes={"input_ids": dims, "attention_mask": dims},
        **names,
    )
    _strip_stack_traces(program)
    program.save(str(path), external_data=False)


def _export_kv(model: nn.Module, path: Path) -> None:
    config = model.config
    layers = config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    batch, past, new = 1, 3, 2  # sizes above 1: torch.export specializes 0 and 1
    gen = torch.Generator().manual_seed(fam.SEED)
    shape = (batch, config.num_key_value_heads, past, head_dim)
    pasts = [torch.randn(shape, generator=gen) for _ in range(2 * layers)]
    ids = torch.randint(3, config.vocab_size, (batch, new), generator=gen)
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    positions = torch.arange(past, past + new)[None]
    b = torch.export.Dim("batch")
    s = torch.export.Dim("sequence_length", max=fam.POSITIONS)
    p = torch.export.Dim("past_sequence_length", max=fam.POSITIONS)
    total = torch.export.Dim("total_sequence_length", max=2 * fam.POSITIONS)
    shapes = ({0: b, 1: s}, {0: b, 1: total}, {0: b, 1: s}, [{0: b, 2: p}] * (2 * layers))
    program = torch.onnx.export(
        DecodeWithCache(model).train(False),
        (ids, mask, positions, pasts),
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        input_names=[
            "input_ids",
            "attention_mask",
            "position_ids",
            *_kv_names(layers, "past_key_values"),
        ],
        output_names=["logits", *_kv_names(layers, "present")],
        dynamic_shapes=shapes,
    )
    _strip_stack_traces(program)
    program.save(str(path), external_data=False)


def export(family: str, kind: str, path: Path) -> None:
    model = fam.build(family)
    if kind == "dynamo_kv":
        _export_kv(model, path)
    else:
        _export_prefill(model, path, kind)


def reference(family: str) -> dict[str, np.ndarray]:
    return fam.reference(fam.build(family))
