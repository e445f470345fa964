"""``Min(x, k * round(x / k))``: a size against its multiple of ``k`` rounded up or down,
torch.export's key length of a chunked attention (MiniMax-M3: ``Min(S, 2 * ceil(S / 2))``,
ceil written ``-((-S) // 2)``).

ONNX's ``Div`` of integers truncates toward zero (onnxruntime's kernel and the onnx
reference: https://onnx.ai/onnx/operators/onnx__Div.html computes ``a / b`` and casts
back), where Python's ``//`` floors. So the graph's ``-k * ((-x) Div k)`` is ``k *
floor(x / k)`` for ``x >= 0``, not ``k * ceil(x / k)``: what torch.export meant and what
its shape label says differ wherever ``k`` does not divide ``x``. The rule reads what the
graph computes:

* ``k * ((x + k - 1) Div k)`` is ``k * ceil(x / k) >= x``: ``Min`` with ``x`` is ``x``;
* ``k * (x Div k)`` and ``-k * ((-x) Div k)`` are ``k * floor(x / k) <= x``: ``Min`` with
  ``x`` is ``x`` where ``k`` divides it and smaller elsewhere, a capped ``x``
  (``Size.capped``), which only a broadcast against ``x`` itself proves: a run where it
  is smaller fails to broadcast.

A factor is a constant scalar (``Mul`` by it, ``Neg`` for -1); views of one element
(``Reshape``, ``Squeeze``, ``Unsqueeze``) and integer ``Cast`` are read through. ``k``
is a positive integer constant, so the ``Div`` is an integer one (a float one does not
round).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes._readers import VIEWS, to_int
from autofusion.fusion_core.sizes._size import Size

if TYPE_CHECKING:
    from autofusion.fusion_core.sizes._proof import Entries, SizeProof

__all__ = ["min_read"]

_ONNX = ("", "ai.onnx")
_PEEL = 8  # views and factors read through before a term is called unknown


def min_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """``Min`` of two one-entry sizes: the entry where both are one size, or where one is
    ``x`` and the other ``x`` rounded to a multiple of ``k`` (above); else unknown."""
    if len(node.inputs) != 2:
        return None
    found = [proof.entries(v, depth) for v in node.inputs]
    if any(e is not None and len(e) != 1 for e in found):
        return None
    a, b = (e[0] if e is not None else None for e in found)
    if a is not None and a == b:
        return [a]
    for x, other in ((a, node.inputs[1]), (b, node.inputs[0])):
        rounded = _rounded(proof, other, x, depth) if x is not None else None
        if rounded is not None:
            return [rounded]
    return [None] if None not in found else None


def _rounded(proof: SizeProof, value: ir.Value | None, x: Size, depth: int) -> Size | None:
    """``Min(x, value)`` where ``value`` is ``x`` rounded up (``x``) or down (``x``
    capped) to a multiple of a constant ``k``; None otherwise."""
    if x.capped or (not x.atoms and x.constant < 0):
        return None
    outer, quotient = _term(value)
    div = quotient.producer() if quotient is not None else None
    if div is None or div.op_type != "Div" or div.domain not in _ONNX:
        return None
    k = _number(div.inputs[1])  # an integer: so is the Div (its inputs have one type)
    inner, numerator = _term(div.inputs[0])
    if k is None or k < 1 or numerator is None:
        return None
    entries = proof.entries(numerator, depth)
    n = entries[0] if entries is not None and len(entries) == 1 else None
    if n is None:
        return None
    if inner * outer == -k * -1 and inner in (1, -1) and n == x:
        # k * trunc(x / k) and -k * trunc(-x / k): k * floor(x / k), x itself for k = 1
        return x if k == 1 else Size(x.atoms, x.constant, capped=True)
    if inner == 1 and outer == k and n == x + Size((), k - 1):  # k * ceil(x / k)
        return x
    return None


def _term(value: ir.Value | None) -> tuple[int, ir.Value | None]:
    """``value`` as ``c * t``: ``c`` the product of the constant factors (``Mul`` by a
    scalar, ``Neg``) read through, with views of one element and integer Casts."""
    factor = 1
    for _ in range(_PEEL):
        node = value.producer() if value is not None else None
        if node is None or node.domain not in _ONNX:
            break
        if node.op_type in VIEWS or (node.op_type == "Cast" and to_int(node)):
            value = node.inputs[0]
        elif node.op_type == "Neg":
            factor, value = -factor, node.inputs[0]
        elif node.op_type == "Mul" and len(node.inputs) == 2:
            numbers = [_number(v) for v in node.inputs]
            if numbers[0] is not None:
                factor, value = factor * numbers[0], node.inputs[1]
            elif numbers[1] is not None:
                factor, value = factor * numbers[1], node.inputs[0]
            else:
                break
        else:
            break
    return factor, value


def _number(value: ir.Value | None) -> int | None:
    """An integer constant of one element."""
    array = constant_array(value)
    if array is None or array.size != 1 or array.dtype.kind not in "iu":
        return None
    return int(array.reshape(-1)[0])
