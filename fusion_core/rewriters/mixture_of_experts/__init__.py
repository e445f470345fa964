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

Two routers have a fast path, the kernel computing the routing itself: softmax and
top-k (the kernel reads the logits), and DeepSeek-V3's sigmoid router where its choice
is the top k of its logits (``_sigmoid.py``: the kernel is fed ``log(sigmoid(logits))``
with the experts in reverse order). Any other router whose subgraph computes the
chosen experts and their non-negative weights (PhiMoE's sparsemixer, ``router:
sparse_mixer``; a softmax or sigmoid picked with a selection bias, or within the best
groups, ``router: gathered`` or ``sigmoid``) keeps that subgraph, and the kernel is fed
``log`` of its weights scattered over the experts, its output times their sum
(``_any_router.py``). A copy of a router kept that way is not a router to fuse again.

Logits ``[B, S, E]`` of a router that runs before the flattening the experts read
(ZAYA) are read merged to ``[B * S, E]`` (``_merged.py``; proven by running the block on
them unmerged; a copy of the graph's router reads them as they are). A router that
computes features of its own before its logits (ZAYA's down_proj and router MLP) leaves
the experts reading another tensor: the input of the router's linear with the block's
width (``_tokens.py``). Experts whose sum is shaped back to ``[B, S, D]`` before what
follows (Inkling's, added to the shared experts' so) are fed the hidden states
``[B, S, D]``, merged, and the output shaped back.

A router with more classes than experts (ZAYA's skip class, its weight zeroed and its
index sent to expert 0; Inkling's shared experts' gates) takes the general path, the
kernel fed its own choice and weights over the experts; where the router's values are
also read outside the block (Inkling's shared experts weighted by their gates,
``moe_topk_pick_slice``), the block is the routed experts' term of the sum and those
readers read the router's copy the rewrite keeps (``Block.kept``).

Experts dispatched by sorting tokens (the slots sorted by expert, split by each
expert's count, a linear per slab, scattered back weighted: ``_sorted_dispatch.py``) are
found and proven like the others, then kept unless the param ``sorted_dispatch`` is set:
onnxruntime's CPU kernel measured slower than the Gemms such a graph already runs per
slab. Experts around another computation (an attention between their two projections)
get a near miss that names it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import onnx_ir as ir

from autofusion.fusion_core import provenance
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import (
    NotACandidate,
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._any_router import any_routings
from autofusion.fusion_core.rewriters.mixture_of_experts._block import (
    Block,
    find_blocks,
    router_input,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._experts import Experts
from autofusion.fusion_core.rewriters.mixture_of_experts._merged import merged
from autofusion.fusion_core.rewriters.mixture_of_experts._proof import SOFTMAX, Routing, prove
from autofusion.fusion_core.rewriters.mixture_of_experts._sigmoid import (
    between,
    choice_reason,
    sigmoid_routing,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._sparse_mixer import argmax_logits
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["MixtureOfExperts"]


class MixtureOfExpertsParams(Params):
    softmax_node: str = "softmax"
    topk_node: str | None = "topk"
    # top_k: the kernel's own routing (a Softmax and a TopK of the logits); sigmoid:
    # DeepSeek-V3's (``_sigmoid.py``), the Sigmoid in softmax_node's place, pick_node the
    # GatherElements of its scores by the TopK's choice; gathered: a Softmax and a TopK
    # with a selection bias or a group mask between them; sparse_mixer: PhiMoE's (an
    # ArgMax picks each expert, no TopK). The last three fall back to (or are) the
    # router as the graph computes it (``_any_router.py``).
    router: Literal["top_k", "sparse_mixer", "sigmoid", "gathered"] = "top_k"
    argmax_node: str | None = None
    pick_node: str | None = None
    # Experts dispatched by sorting tokens (``_sorted_dispatch.py``) are proven and then
    # kept as they are unless this is set: onnxruntime's CPU MoE kernel measured slower
    # than the per-expert Gemms over the sorted slabs such a graph already runs (from 16
    # tokens on; docs/patterns.md), a loss the cost model, which prices the router's
    # nodes, cannot see.
    sorted_dispatch: bool = False


_SORTED_SLOWER = (
    "com.microsoft.MoE reproduces these experts dispatched by sorting tokens (proven by "
    "running the block), but onnxruntime's CPU MoE kernel measured slower than the "
    "per-expert Gemms over the sorted slabs that the graph already runs (from 16 tokens "
    "on; docs/patterns.md): the block stays (the rewriter's param sorted_dispatch: true "
    "fuses it)"
)
_OWN_PATTERNS = ("moe_",)  # the builtin patterns of this rewriter
_NO_BLOCK = "no mixture-of-experts block after the router"
_MOST_REASONS = 3  # refusals (fast path, general readings) joined in a near miss


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


def _copied_router(match: Match) -> NotACandidate | None:
    """Why the match is no router to fuse: a copy this rewriter made of a router it fused
    (``_any_router.py`` keeps the router's subgraph to feed the kernel), or None."""
    for node in match.nodes.values():
        made_by = provenance.pattern(node.metadata_props)
        if made_by is not None and made_by.startswith(_OWN_PATTERNS):
            return NotACandidate(
                f"already fused: {node.op_type} {node.name!r} is the copy of a router that "
                f"{made_by} kept to feed com.microsoft.MoE its choice and weights"
            )
    return None


def _own_routing_reason(block: Block) -> str | None:
    """Why the kernel cannot route the block itself from the logits (None: it may)."""
    if block.classes is not None:
        return (
            f"the router scores {block.classes} classes for {block.experts} experts (a skip "
            "class, or shared experts' gates): the kernel's own routing picks among experts"
        )
    if block.kept:
        return (
            f"the router's {block.kept[0].name!r} is also read outside the block: the "
            "kernel's own routing does not give it"
        )
    return None


def _shaped(routing: Routing, block: Block) -> Routing:
    """``routing``, over the leading axes merged where the logits are [B, S, E] or the
    hidden states the kernel reads [B, S, D] (the block's output shaped as them)."""
    if len(block.logits.shape or ()) <= 2 and len(block.hidden.shape or ()) <= 2:
        return routing
    width = block.hidden.shape[-1] if block.hidden.shape is not None else None
    return merged(routing, block.columns, int(width))


def _proven(
    ctx: RewriteContext,
    block: Block,
    fast: tuple[Callable[[Block], Routing] | None, int],
    reasons: list[str],
) -> tuple[Experts, Routing] | str:
    """The experts and the routing the block is proven to compute with: the fast path's
    first, then each reading of the router as the graph computes it; or why none."""
    opsets = dict(ctx.model.opset_imports)
    routing_of, k = fast
    if routing_of is not None and _own_routing_reason(block) is None:
        routes = _shaped(routing_of(block), block)
        experts = prove(block, k, opsets, routes)
        if not isinstance(experts, str):
            return experts, routes
        reasons.append(experts)
    elif routing_of is not None:
        reasons.append(_own_routing_reason(block))
    if ctx.opset < 16:  # ScatterElements' reduction
        reasons.append(opset_refusal("the general router's ScatterElements(add)", 16, ctx))
        return "; ".join(reasons)
    for routes in any_routings(block, opsets):
        if isinstance(routes, str):
            reasons.append(routes)
            continue
        routes = _shaped(routes, block)
        try:
            experts = prove(block, routes.k or k, opsets, routes)
        except RuntimeError as exc:  # the router cannot run alone on the proof's logits
            experts = str(exc)
        if not isinstance(experts, str):
            return experts, routes
        reasons.append(experts)
    return "; ".join(dict.fromkeys(reasons[:_MOST_REASONS]))


def _merge_reason(block: Block) -> Block | str:
    """The block, where its [B, S, E] logits may be merged to [B * S, E] (``_merged.py``:
    the router reads the hidden states as they are, unflattened), or why not."""
    hidden, logits = block.hidden.shape, block.logits.shape
    if hidden is None or len(hidden) != len(logits) or not isinstance(hidden[-1], int):
        return (
            f"the router's logits {block.logits.name!r} are not [tokens, experts], nor "
            "[B, S, experts] over the hidden states [B, S, hidden]"
        )
    return block  # the router's values read outside: its copy runs unmerged (_merged.py)


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
        copied = _copied_router(match)
        if copied is not None:
            return copied
        if params.router == "sparse_mixer" or params.topk_node is None:
            argmax = match.node(params.argmax_node or "argmax")
            logits = argmax_logits(argmax)
            if isinstance(logits, str):
                return logits
            nodes = list(match.nodes.values())
            return self._fuse(
                ctx, match, (argmax, logits, 0), nodes, sorted_ok=params.sorted_dispatch
            )
        softmax, topk = match.node(params.softmax_node), match.node(params.topk_node)
        if params.router == "sigmoid":
            return self._sigmoid(match, params, ctx)
        if params.router == "gathered":
            return self._gathered(match, params, ctx)
        topk_first = softmax.inputs[0] is topk.outputs[0]
        logits = topk.inputs[0] if topk_first else softmax.inputs[0]
        if not (_last_axis(softmax, softmax.inputs[0]) and _last_axis(topk, topk.inputs[0])):
            return "the router's Softmax or TopK is not over the experts' (last) axis"
        k = _top_k(topk)
        if isinstance(k, str):
            return k
        nodes = list(match.nodes.values())
        return self._fuse(
            ctx, match, (topk, logits, k), nodes, lambda block: SOFTMAX,
            sorted_ok=params.sorted_dispatch,
        )  # fmt: skip

    def _gathered(
        self, match: Match, params: MixtureOfExpertsParams, ctx: RewriteContext
    ) -> Rewrite | str:
        """A router that picks by a TopK of something computed from its probabilities (a
        selection bias added to them, the groups not kept masked) and weighs by gathering
        them or by the TopK's values: the general path."""
        softmax, topk = match.node(params.softmax_node), match.node(params.topk_node)
        logits = softmax.inputs[0]
        nodes = [*match.nodes.values(), *between(softmax, topk)]
        return self._fuse(ctx, match, (topk, logits, 0), nodes, sorted_ok=params.sorted_dispatch)

    def _sigmoid(
        self, match: Match, params: MixtureOfExpertsParams, ctx: RewriteContext
    ) -> Rewrite | str:
        """A DeepSeek-V3 router: the fast path where its choice is the top k of its
        logits (``_sigmoid.py``), else the general one, with every step between the
        Sigmoid and the TopK."""
        sigmoid, topk = match.node(params.softmax_node), match.node(params.topk_node)
        pick_axis = match.node(params.pick_node or "pick").attributes.get("axis")
        over_experts = pick_axis is not None and pick_axis.value in (1, -1)  # default: 0
        if not (_last_axis(topk, topk.inputs[0]) and over_experts):
            return "the router's TopK or GatherElements is not over the experts' (last) axis"
        k = _top_k(topk)
        if isinstance(k, str):
            return k
        logits = sigmoid.inputs[0]
        if logits.shape is None or len(logits.shape) < 2:
            return f"the router's logits {logits.name!r} are not [tokens, experts]"
        found = router_input(logits)  # before running anything: is this a router at all
        if isinstance(found, str):
            return found
        nodes = between(sigmoid, topk)
        reason = choice_reason(sigmoid, topk, k, nodes, dict(ctx.model.opset_imports))
        if ctx.opset < 13:  # the not-renormalized case sums the scores, axes an input
            return opset_refusal("the sigmoid router's ReduceSum", 13, ctx)
        matched = list(match.nodes.values())
        fast = sigmoid_routing if reason is None else None
        return self._fuse(
            ctx, match, (topk, logits, k), [*matched, *nodes], fast, reason,
            sorted_ok=params.sorted_dispatch,
        )  # fmt: skip

    def _fuse(
        self,
        ctx: RewriteContext,
        match: Match,
        router: tuple[ir.Node, ir.Value, int],
        nodes: list[ir.Node],
        fast: Callable[[Block], Routing] | None = None,
        why_not_fast: str | None = None,
        *,
        sorted_ok: bool = False,
    ) -> Rewrite | str:
        """The first block the router's ``nodes`` feed that the experts prove, as one MoE
        routed by ``fast`` (the block's routing with the router's own k) where it applies,
        else by the router as the graph computes it (``_any_router.py``); experts
        dispatched by sorting tokens only where ``sorted_ok``."""
        anchor, logits, k = router
        if logits.shape is None or len(logits.shape) < 2:
            return f"the router's logits {logits.name!r} are not [tokens, experts]"
        reason = _NO_BLOCK
        for block in find_blocks(ctx.graph, nodes, logits):
            if isinstance(block, str) or len(logits.shape) > 2:
                block = _merge_reason(block) if not isinstance(block, str) else block
            if isinstance(block, str):
                reason = block
                continue
            if block.hidden.dtype != ir.DataType.FLOAT:
                return "onnxruntime's CPU MoE kernel is used for float32 blocks only"
            reasons = [why_not_fast] if why_not_fast else []
            found = _proven(ctx, block, (fast, k), reasons)
            if isinstance(found, str):
                # a term beside a shared expert says less than the whole block's refusal
                reason = reason if block.beside and reason != _NO_BLOCK else found
                continue
            experts, routes = found
            if block.sorted_slabs and not sorted_ok:
                return _SORTED_SLOWER
            extra = [n for n in nodes if all(n is not m for m in match.nodes.values())]
            return self._emit(ctx, anchor, block, experts, routes, extra)
        return reason

    def _emit(
        self,
        ctx: RewriteContext,
        anchor: ir.Node,
        block: Block,
        experts: Experts,
        routing: Routing,
        extra: list[ir.Node],
    ) -> Rewrite:
        """The emitted nodes in the block's place; ``extra``: the router's nodes beyond
        the match (a sigmoid router's bias and groups), which go with it."""
        ctx.use_domain(MS_DOMAIN)
        prefix = anchor.name or "moe"

        def constant(hint, array):
            return ctx.initializer(f"{prefix}_{hint}", array)

        emitted = routing.emit(block.hidden, block.logits, experts, constant, lambda v: v)
        out = emitted.output
        out.dtype, out.shape = block.output.dtype, block.output.shape
        replaced = [(block.output, out), *emitted.kept]
        return Rewrite(emitted.nodes, replaced, absorbed=[*block.absorbed, *extra])
