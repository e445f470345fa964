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
without it. DeepSeek-V3's sigmoid router (``router: sigmoid``, ``_sigmoid.py``) fuses
where its choice is the top k of its logits (no selection bias, no group dropped): the
kernel is fed ``log(sigmoid(logits))`` with the experts in reverse order.
"""

from __future__ import annotations

from typing import Literal

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._block import (
    Block,
    find_blocks,
    router_input,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._experts import Experts
from autofusion.fusion_core.rewriters.mixture_of_experts._proof import SOFTMAX, Routing, prove
from autofusion.fusion_core.rewriters.mixture_of_experts._sigmoid import (
    between,
    choice_reason,
    sigmoid_routing,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._sparse_mixer import sparse_mixer_reason
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["MixtureOfExperts"]


class MixtureOfExpertsParams(Params):
    softmax_node: str = "softmax"
    topk_node: str | None = "topk"
    # sparse_mixer: PhiMoE's router (an ArgMax picks each expert, no TopK), which the
    # CPU kernel does not reproduce: the rewrite says why instead; sigmoid: DeepSeek-V3's
    # (``_sigmoid.py``), the Sigmoid in softmax_node's place, pick_node the GatherElements
    # of its scores by the TopK's choice
    router: Literal["top_k", "sparse_mixer", "sigmoid"] = "top_k"
    argmax_node: str | None = None
    pick_node: str | None = None


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
        if params.router == "sigmoid":
            return self._sigmoid(match, params, ctx)
        topk_first = softmax.inputs[0] is topk.outputs[0]
        logits = topk.inputs[0] if topk_first else softmax.inputs[0]
        if not (_last_axis(softmax, softmax.inputs[0]) and _last_axis(topk, topk.inputs[0])):
            return "the router's Softmax or TopK is not over the experts' (last) axis"
        k = _top_k(topk)
        if isinstance(k, str):
            return k
        return self._fuse(ctx, match, (topk, logits, k), list(match.nodes.values()), SOFTMAX)

    def _sigmoid(
        self, match: Match, params: MixtureOfExpertsParams, ctx: RewriteContext
    ) -> Rewrite | str:
        """A DeepSeek-V3 router: fused only where its choice is the top k of its logits
        (``_sigmoid.py``), with every step between the Sigmoid and the TopK."""
        sigmoid, topk = match.node(params.softmax_node), match.node(params.topk_node)
        pick_axis = match.node(params.pick_node or "pick").attributes.get("axis")
        over_experts = pick_axis is not None and pick_axis.value in (1, -1)  # default: 0
        if not (_last_axis(topk, topk.inputs[0]) and over_experts):
            return "the router's TopK or GatherElements is not over the experts' (last) axis"
        k = _top_k(topk)
        if isinstance(k, str):
            return k
        logits = sigmoid.inputs[0]
        if logits.shape is None or len(logits.shape) != 2:
            return f"the router's logits {logits.name!r} are not [tokens, experts]"
        found = router_input(logits)  # before running anything: is this a router at all
        if isinstance(found, str):
            return found
        nodes = between(sigmoid, topk)
        reason = choice_reason(sigmoid, topk, k, nodes, dict(ctx.model.opset_imports))
        if reason is not None:
            return reason
        if ctx.opset < 13:  # the not-renormalized case sums the scores, axes an input
            return opset_refusal("the sigmoid router's ReduceSum", 13, ctx)
        matched = list(match.nodes.values())
        return self._fuse(ctx, match, (topk, logits, k), [*matched, *nodes], None)

    def _fuse(
        self,
        ctx: RewriteContext,
        match: Match,
        router: tuple[ir.Node, ir.Value, int],
        nodes: list[ir.Node],
        routing: Routing | None,
    ) -> Rewrite | str:
        """The first block the router's ``nodes`` feed that the experts prove, as one MoE
        routed as ``routing`` says (None: a sigmoid router's, per block)."""
        topk, logits, k = router
        if logits.shape is None or len(logits.shape) != 2:
            return f"the router's logits {logits.name!r} are not [tokens, experts]"
        reason = "no mixture-of-experts block after the router"
        for block in find_blocks(ctx.graph, nodes, logits):
            if isinstance(block, str):
                reason = block
                continue
            if block.hidden.dtype != ir.DataType.FLOAT:
                return "onnxruntime's CPU MoE kernel is used for float32 blocks only"
            routes = routing or sigmoid_routing(block)
            experts = prove(block, k, dict(ctx.model.opset_imports), routes)
            if isinstance(experts, str):
                reason = experts
                continue
            extra = [n for n in nodes if all(n is not m for m in match.nodes.values())]
            return self._emit(ctx, topk, logits, block, experts, routes, extra)
        return reason

    def _emit(
        self,
        ctx: RewriteContext,
        topk: ir.Node,
        logits: ir.Value,
        block: Block,
        experts: Experts,
        routing: Routing,
        extra: list[ir.Node],
    ) -> Rewrite:
        """The emitted nodes in the block's place; ``extra``: the router's nodes beyond
        the match (a sigmoid router's bias and groups), which go with it."""
        ctx.use_domain(MS_DOMAIN)
        prefix = topk.name or "moe"

        def constant(hint, array):
            return ctx.initializer(f"{prefix}_{hint}", array)

        nodes, out = routing.emit(block.hidden, logits, experts, constant)
        out.dtype, out.shape = block.output.dtype, block.output.shape
        return Rewrite(nodes, [(block.output, out)], absorbed=[*block.absorbed, *extra])
