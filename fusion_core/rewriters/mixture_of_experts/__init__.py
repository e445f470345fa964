"""``mixture_of_experts``: a router and its experts become one ``com.microsoft.MoE``.

A sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral, OLMoE...) routes each token to the
top k of E experts and sums their SwiGLU outputs weighted by the router's softmax::

    p = softmax(x @ W_r);  chosen, w = top_k(p)  [w / sum(w)]
    y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = chosen[t, j]

The pattern (``builtin/mixture_of_experts.yaml``) anchors only the router: its Softmax
and TopK, in either order. The rest differs with every exporter and library, so this
rewriter finds the block by data flow (``_block.py``: the first value all of the
router's results flow into, the stacked [E, out, in] weights gathered by its choice)
and proves what it computes by running it against the candidate experts
(``_proof.py``). What it emits, on the onnxruntime target:

    MoE(x, logits, fc1, , fc2, ) with k, activation_type=swiglu, swiglu_fusion=1
        and normalize_routing_weights

(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MoE):
the kernel applies the softmax and the top-k itself, so it reads the logits, and on
CPU it takes the gate and up rows interleaved in one fc1. The block's nodes go with
the router's (``Rewrite.absorbed``). ONNX has no such op: the generic target keeps the
block and says so.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block, find_blocks
from autofusion.fusion_core.rewriters.mixture_of_experts._proof import (
    Experts,
    moe_attributes,
    prove,
)
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["MixtureOfExperts"]


class MixtureOfExpertsParams(Params):
    softmax_node: str = "softmax"
    topk_node: str = "topk"


def _top_k(topk: ir.Node) -> int | str:
    attrs = {a.name: a.value for a in topk.attributes.values()}
    if attrs.get("largest", 1) != 1:
        return f"TopK {topk.name!r} picks the smallest scores"
    k = constant_array(topk.inputs[1]) if len(topk.inputs) > 1 else None
    if k is None or k.size != 1:
        return f"TopK {topk.name!r} has no constant k"
    return int(k.reshape(-1)[0])


def _last_axis(node: ir.Node, value: ir.Value) -> bool:
    attrs = {a.name: a.value for a in node.attributes.values()}
    axis = attrs.get("axis", -1)
    rank = len(value.shape) if value.shape is not None else None
    return axis == -1 or (rank is not None and axis == rank - 1)


class MixtureOfExperts(Rewriter):
    name = "mixture_of_experts"
    Params = MixtureOfExpertsParams

    def rewrite(
        self, match: Match, params: MixtureOfExpertsParams, ctx: RewriteContext
    ) -> Rewrite | str:
        if not ctx.target.can_emit(MS_DOMAIN):
            return (
                "generic: ONNX has no mixture-of-experts op (onnxruntime's com.microsoft.MoE "
                "is what the onnxruntime target emits)"
            )
        softmax, topk = match.node(params.softmax_node), match.node(params.topk_node)
        topk_first = softmax.inputs[0] is topk.outputs[0]
        logits = topk.inputs[0] if topk_first else softmax.inputs[0]
        if not (_last_axis(softmax, softmax.inputs[0]) and _last_axis(topk, topk.inputs[0])):
            return "the router's Softmax or TopK is not over the experts' (last) axis"
        k = _top_k(topk)
        if isinstance(k, str):
            return k
        if logits.shape is None or len(logits.shape) != 2:
            return f"the router's logits {logits.name!r} are not [tokens, experts]"
        reason = "no mixture-of-experts block after the router"
        for block in find_blocks(ctx.graph, list(match.nodes.values()), logits):
            if isinstance(block, str):
                reason = block
                continue
            if block.hidden.dtype != ir.DataType.FLOAT:
                return "onnxruntime's CPU MoE kernel is used for float32 blocks only"
            experts = prove(block, k, dict(ctx.model.opset_imports))
            if not isinstance(experts, str):
                return self._emit(ctx, topk, logits, block, experts)
            reason = experts
        return reason

    def _emit(
        self, ctx: RewriteContext, topk: ir.Node, logits: ir.Value, block: Block, experts: Experts
    ) -> Rewrite:
        ctx.use_domain(MS_DOMAIN)
        fc1 = ctx.initializer(f"{topk.name or 'moe'}_fc1", experts.fc1)
        fc2 = ctx.initializer(f"{topk.name or 'moe'}_fc2", experts.fc2)
        attributes = [
            ir.AttrString(n, v) if isinstance(v, str) else ir.AttrInt64(n, v)
            for n, v in moe_attributes(experts).items()
        ]
        node = ir.Node(MS_DOMAIN, "MoE", [block.hidden, logits, fc1, None, fc2, None], attributes)
        out = node.outputs[0]
        out.dtype, out.shape = block.output.dtype, block.output.shape
        return Rewrite([node], [(block.output, out)], absorbed=block.absorbed)
