"""The states of a decoder's own cache, as the KV export's graph inputs and outputs.

Why: a hybrid decoder's cache is not a list of keys and values. transformers 5.24 builds
``DynamicCache(config=...)`` with one layer class per layer type: ``DynamicLayer`` for
attention (keys and values ``[batch, heads, length, dim]``), ``LinearAttentionLayer`` for
a convolution or a linear-attention/Mamba layer (a ``conv_states`` buffer
``[batch, channels, kernel]`` and, except for a short convolution, a
``recurrent_states`` tensor of fixed size), and ``LinearAttentionAndFullAttentionLayer``
for a layer with both. Multi-head latent attention caches one latent "head" whose key
and value sizes differ from the config's head count and head dim. DeepSeek sparse
attention (``DynamicIndexedLayer``) also keeps its indexer's keys ``[batch, length, dim]``
(grown by ``cache.update_indexer``): without the past ones the indexer scores the new
tokens alone, so its top-k mask keeps every past key and the step is a dense variant of
the model's. So the export asks
the model: it runs the model once on the prompt with ``use_cache=True`` and reads every
state tensor the cache then holds (``layout``); the wrapper loads the past into the
same cache classes (``load``) and returns what the cache holds after the step (``read``).

Sliding-window attention layers get the full-attention class: every layer keeps the
whole past and the mask applies the window, as in optimum's export and as the export
did before it read the config (``DynamicCache()``), so those graphs are unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import transformers
from transformers import cache_utils

# the past's length per state kind that grows: dim 2 of an attention layer's keys and
# values, dim 1 of a sparse-attention indexer's keys (one head)
LENGTH_AXES = {"key": 2, "value": 2, "indexer_key": 1}
# what a linear layer's ``{conv,recurrent}_states[k]`` is called in the graph
_LINEAR_STATES = {"conv": "conv_states", "recurrent": "recurrent_states"}
# a sliding layer's full-attention twin (the mask applies the window)
_WHOLE_PAST = {
    cache_utils.DynamicSlidingWindowLayer: cache_utils.DynamicLayer,
    cache_utils.LinearAttentionAndSlidingWindowAttentionLayer: (
        cache_utils.LinearAttentionAndFullAttentionLayer
    ),
}


class State(NamedTuple):
    """One tensor of one cache layer."""

    layer: int
    kind: str  # "key", "value", "indexer_key", "conv" or "recurrent"
    index: int  # which of the layer's conv/recurrent states (0 for the growing kinds)
    shape: tuple[int, ...]  # as the prompt left it; batch first
    grows: bool  # keys, values, indexer keys: the length axis grows by the new tokens

    @property
    def length_axis(self) -> int | None:
        """The axis the new tokens grow (``LENGTH_AXES``); None for a fixed-size state."""
        return LENGTH_AXES[self.kind] if self.grows else None

    def name(self, prefix: str) -> str:
        """``{prefix}.{layer}.{kind}``, and ``.{index}`` for a second state of a kind."""
        suffix = f".{self.index}" if self.index else ""
        return f"{prefix}.{self.layer}.{self.kind}{suffix}"


def _layer_states(layer_index: int, layer) -> list[State]:
    states = []
    for kind, attr in (("key", "keys"), ("value", "values")):
        tensor = getattr(layer, attr, None)
        if isinstance(tensor, torch.Tensor):
            states.append(State(layer_index, kind, 0, tuple(tensor.shape), True))
    indexer = getattr(layer, "indexer_keys", None)  # None where a layer reuses another's top-k
    if isinstance(indexer, torch.Tensor):
        states.append(State(layer_index, "indexer_key", 0, tuple(indexer.shape), True))
    for kind, attr in _LINEAR_STATES.items():
        for index, tensor in (getattr(layer, attr, None) or {}).items():
            if tensor is not None:  # a short convolution has no recurrent state
                states.append(State(layer_index, kind, index, tuple(tensor.shape), False))
    return states


def layout(model, prompt: torch.Tensor) -> list[State]:
    """Every state tensor of the model's cache after a prefill of ``prompt``, in layer
    order (keys, values, indexer keys, conv states, recurrent states)."""
    with torch.no_grad():
        out = model(input_ids=prompt, attention_mask=torch.ones_like(prompt), use_cache=True)
    states = []
    for index, layer in enumerate(out.past_key_values.layers):
        states.extend(_layer_states(index, layer))
    return states


def example(states: list[State], batch: int, past: int, generator) -> list[torch.Tensor]:
    """Random past states: ``batch`` rows, ``past`` positions for the growing kinds."""
    tensors = []
    for state in states:
        shape = [batch, *state.shape[1:]]
        if state.grows:
            shape[state.length_axis] = past
        tensors.append(torch.randn(shape, generator=generator))
    return tensors


def dynamic_shapes(states: list[State], batch, past) -> list[dict]:
    """torch.export's dims: the batch everywhere, the past length of the growing kinds."""
    return [{0: batch, s.length_axis: past} if s.grows else {0: batch} for s in states]


def new_cache(config) -> transformers.DynamicCache:
    """The cache ``generate`` would build for ``config``, sliding layers keeping the
    whole past."""
    cache = transformers.DynamicCache(config=config)
    for index, layer in enumerate(cache.layers):
        twin = _WHOLE_PAST.get(type(layer))
        if twin is cache_utils.DynamicLayer:
            cache.layers[index] = twin()
        elif twin is not None:
            cache.layers[index] = twin(number_of_states=layer.number_of_states)
    return cache


def load(config, states: list[State], tensors: list[torch.Tensor]) -> transformers.DynamicCache:
    """A cache holding ``tensors`` as a prefill would have left it."""
    cache = new_cache(config)
    given = {(s.layer, s.kind, s.index): t for s, t in zip(states, tensors, strict=True)}
    for state, tensor in zip(states, tensors, strict=True):
        if state.kind == "key":
            cache.update(tensor, given[(state.layer, "value", 0)], state.layer)
        elif state.kind == "indexer_key":
            cache.update_indexer(tensor, state.layer)
        elif state.kind == "conv":  # the prefill path: marks the layer as having a past
            cache.update_conv_state(
                tensor, state.layer, state.index, conv_kernel_size=tensor.shape[-1]
            )
        elif state.kind == "recurrent":
            cache.update_recurrent_state(tensor, state.layer, state.index)
    return cache


def read(cache, states: list[State]) -> list[torch.Tensor]:
    """The cache's tensors after the step, in ``states``' order."""
    tensors = []
    for state in states:
        layer = cache.layers[state.layer]
        if state.kind in _LINEAR_STATES:
            tensors.append(getattr(layer, _LINEAR_STATES[state.kind])[state.index])
        elif state.kind == "indexer_key":
            tensors.append(layer.indexer_keys)
        else:
            tensors.append(layer.keys if state.kind == "key" else layer.values)
    return tensors
