"""torch's top-k breaking exact ties as ONNX's TopK does: the lower index first.

Why: DeepSeek sparse attention's indexer scores each key as a weighted sum over heads of
``relu(q . k)``, which is exactly 0 for every key whose dot products are all negative, so
two keys can tie at the k-th place exactly (deepseek_v32 and axk2 in the padded decode of
``decode_steps_unseen.py``). torch's ``topk`` then picks either (no documented order),
onnxruntime's TopK the lower index (the ONNX spec), and the attention masks different
keys: a logits difference of 0.6 to 2.5 at that step alone, the export's error none. The
torch reference of the decode runs under ``onnx_ties()`` so that what it compares is the
export, not a tie-break; outside a tie the values and indices are ``topk``'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _topk_lower_index_first(values, k, dim=-1, largest=True, sorted=True):
    # ``sorted``: topk's keyword, taken and ignored: the result is sorted (as ONNX's
    # TopK's is); a stable sort keeps equal values in index order, descending or not
    ordered, indices = torch.sort(values, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((ordered.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


@contextmanager
def onnx_ties() -> Iterator[None]:
    """``torch.topk`` and ``Tensor.topk`` break ties by the lower index within the block."""
    function, method = torch.topk, torch.Tensor.topk
    torch.topk = torch.Tensor.topk = _topk_lower_index_first
    try:
        yield
    finally:
        torch.topk, torch.Tensor.topk = function, method
