"""``matmul_add_to_gemm``: ``MatMul(A, B) + C`` with rank-2 ``A`` and ``B`` becomes
``Gemm(A, B, C)`` (``alpha = beta = 1``, no transposes), one kernel instead of two
(https://onnx.ai/onnx/operators/onnx__Gemm.html). ``C`` must broadcast to ``[M, N]``
unidirectionally; the pattern's ``broadcastable`` constraint checks it.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter

__all__ = ["MatMulAddToGemm"]


class MatMulAddToGemmParams(Params):
    matmul_node: str = "mm"
    add_node: str = "add"


class MatMulAddToGemm(Rewriter):
    name = "matmul_add_to_gemm"
    Params = MatMulAddToGemmParams

    def rewrite(
        self, match: Match, params: MatMulAddToGemmParams, ctx: RewriteContext
    ) -> Rewrite | str:
        matmul, add = match.node(params.matmul_node), match.node(params.add_node)
        bias = [v for v in add.inputs if v is not matmul.outputs[0]]
        if len(bias) != 1:
            return f"Add {add.name!r} adds the MatMul output to itself"
        gemm = ir.Node("", "Gemm", [matmul.inputs[0], matmul.inputs[1], bias[0]], name=matmul.name)
        return Rewrite([gemm], [(add.outputs[0], gemm.outputs[0])])
