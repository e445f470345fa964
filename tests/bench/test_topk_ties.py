"""The padded decode's torch reference breaks a top-k's exact ties as ONNX's TopK does, the
lower index first (bench/corpus/_topk_ties.py), so that a DeepSeek sparse-attention
indexer's scores tied at exactly 0 select the keys onnxruntime selects. Needs torch (the
corpus extra).
"""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
from _topk_ties import onnx_ties  # noqa: E402 (torch first: importorskip)

# ties at the boundary of every k below: index order must decide
SCORES = torch.tensor([[0.5, 0.0, 0.0, 0.5, -1.0, 0.0]])


def test_ties_go_to_the_lower_index_as_in_onnx_topk():
    with onnx_ties():
        largest = SCORES.topk(3, dim=-1)
        smallest = torch.topk(SCORES, k=2, dim=-1, largest=False)
        unsorted = torch.topk(SCORES, k=4, dim=-1, sorted=False)
    assert largest.indices.tolist() == [[0, 3, 1]]
    assert largest.values.tolist() == [[0.5, 0.5, 0.0]]
    assert smallest.indices.tolist() == [[4, 1]]
    assert sorted(unsorted.indices.tolist()[0]) == [0, 1, 2, 3]


def test_the_values_are_topks_and_topk_is_restored_after():
    function, method = torch.topk, torch.Tensor.topk
    scores = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(0))
    with onnx_ties():
        got = scores.topk(4, dim=1)
    want = function(scores, 4, dim=1)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=0)
    assert torch.equal(got.indices, want.indices)  # no ties in random floats
    assert torch.topk is function and torch.Tensor.topk is method
