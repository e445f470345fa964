"""An encoder's attention block in onnx text, in pieces the canonical-form tests join
around what they vary (the mask, the chain of biases): the spelling BERT-style
TorchScript exports write.

* ``PROJECTIONS``: ``x`` layer-normed (``gamma``, ``beta``) and projected by ``wq``,
  ``wk``, ``wv``;
* ``HEADS``: each projection split into heads by the one target ``split`` (``[B, S, N,
  H]``), ``qt`` and ``vt`` ``[B, N, S, H]``, ``kt`` K^T ``[B, N, H, S]``;
* ``SCORES``: ``scores = qt @ kt / scale``;
* ``CONTEXT``: ``probs @ vt``, its heads merged by ``merge`` and projected by ``wo``
  into ``y``.
"""

from __future__ import annotations

__all__ = ["CONTEXT", "HEADS", "PROJECTIONS", "SCORES", "lines"]

PROJECTIONS = [
    "normed = LayerNormalization <axis = -1> (x, gamma, beta)",
    "q = MatMul (normed, wq)",
    "k = MatMul (normed, wk)",
    "v = MatMul (normed, wv)",
]
HEADS = [
    "qh = Reshape (q, split)",
    "qt = Transpose <perm = [0, 2, 1, 3]> (qh)",
    "kh = Reshape (k, split)",
    "kt = Transpose <perm = [0, 2, 3, 1]> (kh)",
    "vh = Reshape (v, split)",
    "vt = Transpose <perm = [0, 2, 1, 3]> (vh)",
]
SCORES = ["qk = MatMul (qt, kt)", "scores = Div (qk, scale)"]
CONTEXT = [
    "context = MatMul (probs, vt)",
    "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
    "merged = Reshape (ct, merge)",
    "y = MatMul (merged, wo)",
]


def lines(*parts: list[str]) -> str:
    """The parts' lines as one graph body (one per line)."""
    return "\n".join(line for part in parts for line in part)
