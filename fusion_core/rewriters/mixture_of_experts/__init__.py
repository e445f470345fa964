"""``mixture_of_experts``: a router and its experts become one ``com.microsoft.MoE``.

A sparse mixture-of-experts MLP (Qwen3-MoE, Mixtral, OLMoE, gpt-oss...) routes each
token to the top k of E experts and sums their SwiGLU outputs weighted by the router's
softmax::

    p = softmax(x @ W_r [+ b_r]);  chosen, w = top_k(p)  [w / sum(w)]
    y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = chosen[t, j]

(gpt-oss: biases on gate/up and down, and the clamped SwiGLU
``min(g, 7) * sigmoid(1.702 min(g, 7)) * (clip(u, -7, 7) + 1)``, ``_experts.py``).

The pattern (``builtin/mixture_of_experts.yaml``) anchors only the router: its Softmax
and TopK, in either order. The rest differs with every exporter and library, so this
rewriter finds the block by data flow (``_block.py``: the first value all of the
router's results flow into, the stacked [E, out, in] weights gathered by its choice)
and proves what it computes by running it against the candidate experts
(``_proof.py``). What it emits, on the onnxruntime target:

    MoE(x, logits, fc1, [fc1_bias], fc2, [fc2_bias]) with k, activation_type=swiglu,
        swiglu_fusion=1, normalize_routing_weights, activation_alpha, activation_beta
        and swiglu_limit

(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MoE):
the kernel applies the softmax and the top-k itself, so it reads the logits, and on
CPU it takes the gate and up rows interleaved in one fc1. The block's nodes go with
the router's (``Rewrite.absorbed``); a router's bias stays with it, outside the op,
which reads the logits. ONNX has no such op: the generic target keeps the block and
says so.

PhiMoE's sparsemixer (``router: sparse_mixer``) is explained, not fused
(``_sparse_mixer.py``): the CPU kernel accepts ``use_sparse_mixer=1`` but routes as
without it.
"""

from __future__ import annotations

from typing import Literal

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block, find_blocks
from autofusion.fusion_core.rewriters.mixture_of_experts._experts import Experts, moe_attributes
from autofusion.fusion_core.rewriters.mixture_of_experts._proof import prove
from autofusion.fusion_core.rewriters.mixture_of_experts._sparse_mixer import sparse_mixer_reason
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["MixtureOfExperts"]


class MixtureOfExpertsParams(Params):
    softmax_node: str = "softmax"
    topk_node: str | None = "topk"
    # sparse_mixer: PhiMoE's router (an ArgMax picks each expert, no TopK), which the
    # CPU kernel does not reproduce: the rewrite says why instead
    router: Literal["top_k", "sparse_mixer"] = "top_k"
    argmax_node: str | None = None


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
        if params.router == "sparse_mixer" or params.topk_node is None:
            argmax = match.node(params.argmax_node or "argmax")
            return sparse_mixer_reason(argmax, match.node(params.softmax_node))
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
        prefix = topk.name or "moe"
        constants = [
            None if array is None else ctx.initializer(f"{prefix}_{name}", array)
            for name, array in (
                ("fc1", experts.fc1),
                ("fc1_bias", experts.fc1_bias),
                ("fc2", experts.fc2),
                ("fc2_bias", experts.fc2_bias),
            )
        ]
        node = ir.Node(MS_DOMAIN, "MoE", [block.hidden, logits, *constants], _attributes(experts))
        out = node.outputs[0]
        out.dtype, out.shape = block.output.dtype, block.output.shape
        return Rewrite([node], [(block.output, out)], absorbed=block.absorbed)


def _attributes(experts: Experts) -> list[ir.Attr]:
    found = []
    for name, value in moe_attributes(experts).items():
        if isinstance(value, str):
            found.append(ir.AttrString(name, value))
        elif isinstance(value, float):
            found.append(ir.AttrFloat32(name, value))
        else:
            found.append(ir.AttrInt64(name, value))
    return found
