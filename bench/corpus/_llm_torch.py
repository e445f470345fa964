"""The torch exports of ``export_llm.py``: prefill graphs from both exporters, and a
decode graph with the KV cache from the dynamo exporter.

Why: users export decoders themselves as often as through optimum. A prefill graph is
``model(input_ids, attention_mask).logits`` without a cache; the decode graph is how one
exports a cache with ``torch.onnx.export(dynamo=True)`` in transformers 5.24: a wrapper
whose inputs are the cache's past states as tensors, which it loads into the cache the
model builds for itself (``_kv_states``: ``DynamicCache(config=...)``, keys and values
of the attention layers, convolution and recurrent states of a hybrid's other layers,
the latent key and value of multi-head latent attention, the indexer keys of DeepSeek
sparse attention; sliding layers keep the whole past, Mistral's window is applied by the
mask, as in optimum's export), and whose outputs are the logits and the cache's states
after the step. The step takes any number of new tokens where torch.export can trace
that and the graph computes the model's logits at another batch and count of tokens
(``_check_any_length``); a recurrent layer's chunked scan cannot (its loop over chunks
and its in-place state fix the length), so those models export the step ``generate``
takes, one new token, with the mask ``past_sequence_length + 1`` long.
The TorchScript exporter is not used for the cache: optimum's export is that (it calls
``torch.onnx.export(dynamo=False)``).

``batch``: the dynamo exports' example batch (1 for the corpus's exports, whose graphs
are pinned). torch.export specializes a batch of 1 where a model copies into a slice of a
buffer it made (DeepSeek-V3's ``expand_kv``, an mrope's sections: the meta ``copy_`` adds
the guard ``batch < 2``, torch.onnx retries with ``max=1`` and fails with "Invalid ranges
[2:1]"), and a KV graph exported from one row keeps its batch fixed at 1; an example of
two rows keeps the batch a dim (``unseen_families.py`` exports so).
"""

from __future__ import annotations

import logging
from pathlib import Path

import _kv_states as kv
import _llm_families as fam
import numpy as np
import torch
from torch import nn

TORCHSCRIPT_OPSET, DYNAMO_OPSET = 17, 18
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
KV_NEW_TOKENS = 2  # the KV export's new tokens, where their count can be a dim
# the any-length KV graph is checked at this many new tokens (more than two chunks of the
# surveyed scans' 4) against the model, within the padded decode's tolerance
KV_CHECK_TOKENS, KV_CHECK_ATOL = 9, 1e-4
log = logging.getLogger(__name__)


class PrefillLogits(nn.Module):
    """input_ids, attention_mask -> logits, no cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


class DecodeWithCache(nn.Module):
    """input_ids, attention_mask, position_ids, [past state per cache tensor] ->
    logits, present state per cache tensor (``_kv_states.layout``'s order)."""

    def __init__(self, model: nn.Module, states: list[kv.State]) -> None:
        super().__init__()
        self.model = model
        self.states = states

    def forward(self, input_ids, attention_mask, position_ids, past: list[torch.Tensor]):
        cache = kv.load(self.model.config, self.states, past)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        return (out.logits, *kv.read(out.past_key_values, self.states))


def _strip_stack_traces(program) -> None:
    for node in program.model.graph.all_nodes():  # as make_transformer_models.export_dynamo
        node.metadata_props.pop(STACK_TRACE_KEY, None)


def _export_prefill(model: nn.Module, path: Path, kind: str, batch: int = 1) -> None:
    ids = fam.prompt() if kind == "torchscript" else _rows(fam.prompt(), batch)
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


def _rows(prompt: torch.Tensor, batch: int) -> torch.Tensor:
    """``prompt`` and ``batch - 1`` other rows of the same length (seeded)."""
    gen = torch.Generator().manual_seed(fam.SEED + 1)
    others = torch.randint(3, fam.VOCAB, (batch - 1, prompt.shape[1]), generator=gen)
    return torch.cat([prompt, others])


def _export_kv(model: nn.Module, path: Path, batch: int = 1) -> None:
    """Any number of new tokens if torch.export can trace it, else one new token."""
    states = kv.layout(model, fam.prompt())
    wrapper = DecodeWithCache(model, states).train(False)
    try:
        program = _export_step(wrapper, states, KV_NEW_TOKENS, batch)
        _check_any_length(program, wrapper, states, batch)
    except Exception as exc:  # a recurrent layer's chunked scan specializes the length
        cause = exc.__cause__ or exc
        log.warning("KV export for any length failed, exporting one token: %s", cause)
        program = _export_step(wrapper, states, 1, batch)
    _strip_stack_traces(program)
    program.save(str(path), external_data=False)


def _check_any_length(program, wrapper: DecodeWithCache, states: list[kv.State], batch: int):
    """Raises unless the graph exported for any length computes the model's logits (within
    ``KV_CHECK_ATOL``) at a past and a count of new tokens other than the example's (the
    example's rows: a graph exported from one row may take one only). torch.onnx retries
    a failed non-strict torch.export in strict mode, which can fix a size derived from
    the length without a guard (Falcon-H1's and Zamba2's chunked scan: the chunk count of
    the example's 2 tokens), so the graph runs for up to one chunk of new tokens only."""
    rows, past, new = batch, 5, KV_CHECK_TOKENS
    gen = torch.Generator().manual_seed(fam.SEED + 2)
    pasts = kv.example(states, rows, past, gen)
    ids = torch.randint(3, wrapper.model.config.vocab_size, (rows, new), generator=gen)
    mask = torch.ones(rows, past + new, dtype=torch.int64)
    positions = torch.arange(past, past + new)[None].repeat(rows, 1)
    with torch.no_grad():  # clones: a cache may update its states in place
        want = wrapper(ids, mask, positions, [t.clone() for t in pasts])[0]
    try:
        got = program(ids, mask, positions, pasts)[0]
    finally:
        program.release()
    error = (got - want).abs().max().item()
    if not error <= KV_CHECK_ATOL:  # NaN too
        raise ValueError(
            f"the graph for any length is not the model's at {rows} rows, {past} cached and "
            f"{new} new tokens: logits differ by {error:.2g}"
        )


def _export_step(wrapper: DecodeWithCache, states: list[kv.State], new: int, batch: int = 1):
    """The decode graph after 3 cached tokens, from ``batch`` rows. ``new`` > 1: the count
    of new tokens is a dim (sizes above 1: torch.export specializes 0 and 1); ``new`` ==
    1: the step ``generate`` takes, and the mask spans ``past_sequence_length + 1``."""
    past = 3
    gen = torch.Generator().manual_seed(fam.SEED)
    pasts = kv.example(states, batch, past, gen)
    ids = torch.randint(3, wrapper.model.config.vocab_size, (batch, new), generator=gen)
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    # one row of positions per row: position_ids' dim 0 is the batch Dim too, and an
    # example of 1 against ids of ``batch`` rows breaks torch.export's shape hints
    positions = torch.arange(past, past + new)[None].repeat(batch, 1)
    b = torch.export.Dim("batch")
    p = torch.export.Dim("past_sequence_length", max=fam.POSITIONS)
    if new > 1:
        s = torch.export.Dim("sequence_length", max=fam.POSITIONS)
        total = torch.export.Dim("total_sequence_length", max=2 * fam.POSITIONS)
        tokens, length = {0: b, 1: s}, {0: b, 1: total}
    else:
        tokens, length = {0: b}, {0: b, 1: p + new}
    return torch.onnx.export(
        wrapper,
        (ids, mask, positions, pasts),
        dynamo=True,
        opset_version=DYNAMO_OPSET,
        input_names=[
            "input_ids",
            "attention_mask",
            "position_ids",
            *(state.name("past_key_values") for state in states),
        ],
        output_names=["logits", *(state.name("present") for state in states)],
        dynamic_shapes=(tokens, length, dict(tokens), kv.dynamic_shapes(states, b, p)),
    )


def export(family: str, kind: str, path: Path, *, batch: int = 1) -> None:
    """``family``'s ``kind`` graph at ``path``; ``batch``: the dynamo exports' example
    batch (the module docstring says why 2 keeps more models' batch a dim)."""
    model = fam.build(family)
    if kind == "dynamo_kv":
        _export_kv(model, path, batch)
    else:
        _export_prefill(model, path, kind, batch)


def reference(family: str) -> dict[str, np.ndarray]:
    return fam.reference(fam.build(family))
