"""What a mixture-of-experts block computes, proven by running it.

The block's ops say little on their own (``_block.py``); what it must compute is::

    p = softmax(logits)                       # over the experts
    chosen, w = top_k(p)                      # w renormalized to sum 1, or not
    y[t] = sum_j w[t, j] * expert_e(x[t]),  e = chosen[t, j]

with each expert the SwiGLU MLP onnxruntime's kernel runs (``_experts.py``: the plain
``down(silu(gate) * up)``, or gpt-oss's clamped one, with biases or without) and its
weights read from the stacked constants. Which weight is which, how a fused gate/up
weight is split, the activation's constants and whether the weights are renormalized
are hypotheses; each is tried against the block itself, run by onnxruntime on random
tokens and logits (with the model's own weights, so only the experts the tokens choose
are touched). A sigmoid router (``_sigmoid.py``) is proven the same way with its own
``Routing``: the top k of the logits weighted by their sigmoid, and a constant factor;
any other router (``_any_router.py``) with the choice and weights its own subgraph
computes, run on the same logits.
Where the block reads a clamp limit, the tokens are also run scaled so that the clamp
bites (random weights rarely reach it). The hypothesis that reproduces
the block (rtol 1e-4, atol 1e-5 of the output's scale) on every run is kept, then
checked once more against what the rewrite emits (``com.microsoft.MoE``, and for a
sigmoid router the steps around it), run on the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block
from autofusion.fusion_core.rewriters.mixture_of_experts._experts import (
    Activation,
    Constant,
    Experts,
    Layout,
    activations,
    as_moe,
    layouts,
    moe_node,
    scaled,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._feeds import (
    TOKENS,
    paired,
    probe_rows,
    random_inputs,
    router_feed,
    sized,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._walk import external
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = [
    "probe_rows",
    "router_feed",
    "SOFTMAX",
    "Emitted",
    "Routing",
    "external",
    "options",
    "prove",
    "sized",
    "subgraph_model",
]

RTOL, ATOL = 1e-4, 1e-5
# The largest weight slice the proof gathers (tokens x top-k experts), in elements.
_PROOF_ELEMENTS = 400_000_000
_CLAMP_REACH = 3.0  # the scaled tokens' largest pre-activation, in clamp limits


def _softmax_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The chosen experts [tokens, k] and their softmax probabilities (float64)."""
    scores = logits.astype(np.float64)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    return chosen, np.take_along_axis(p, chosen, -1)


# A value the emitted nodes read that is neither the hidden states, the logits nor a
# constant (a router's shape arithmetic reads the hidden states' shape): the value
# itself in the rewrite, a fed input in the proof's model.
Outside = Callable[[ir.Value], ir.Value]


@dataclass
class Emitted:
    """What the rewrite puts in the block's place: its nodes, the value that stands for
    the block's output, and (the router's value read outside the block, the emitted copy's
    value that stands for it) pairs (``Block.kept``)."""

    nodes: list[ir.Node]
    output: ir.Value
    kept: list[tuple[ir.Value, ir.Value]] = field(default_factory=list)


Emit = Callable[[ir.Value, ir.Value, Experts, Constant, Outside], Emitted]


@dataclass(frozen=True)
class Routing:
    """How a router picks and weights the experts, as the proof computes it: ``choose``
    gives the chosen experts [tokens, k] and their weights before any renormalization
    (float64) for the logits; ``scales`` are the constant factors the weights may carry
    (folded into the experts' down projection); ``emit`` builds what the rewrite puts in
    the block's place, (nodes, output), from the hidden states, the logits and the
    experts (``Outside``), so that the proof runs exactly what is emitted; ``name`` says what it
    routes by in a refusal; ``k``, where set, is the kernel's k (a router that the
    graph computes, ``_any_router.py``), else the router's TopK's."""

    choose: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]
    emit: Emit
    scales: tuple[float, ...] = (1.0,)
    name: str = "softmax, top-k"
    k: int | None = None
    # emit reads the logits as the graph shapes them, [B, S, E] too (a copy of the
    # graph's own router, ``_any_router.py``), not merged as the kernel reads them
    unmerged: bool = False


def _emit_softmax(hidden, logits, experts, constant, _outside) -> Emitted:
    node = moe_node(hidden, logits, experts, constant)
    return Emitted([node], node.outputs[0])


# Softmax routers (Mixtral, Qwen3-MoE...): the kernel reads the logits as they are.
SOFTMAX = Routing(_softmax_top_k, _emit_softmax)


def _per_choice(weights: np.ndarray, bias, vectors: np.ndarray, chosen: np.ndarray):
    """weights[e] @ vectors[t, j] (+ bias[e]) for e = chosen[t, j], [tokens, k, out] in
    float64, one expert's slice at a time (never a copy of every chosen expert's weights)."""
    tokens, k = chosen.shape
    out = np.empty((tokens, k, weights.shape[1]))
    for t, j in np.ndindex(tokens, k):
        e = chosen[t, j]
        out[t, j] = weights[e].astype(np.float64) @ vectors[t, j]
        if bias is not None:
            out[t, j] += bias[e]
    return out


def _pre_activations(layout: Layout, x: np.ndarray, chosen: np.ndarray):
    """gate and up before the activation, [tokens, k, inter] each."""
    rows = np.repeat(x.astype(np.float64)[:, None], chosen.shape[1], axis=1)
    return [
        _per_choice(layout.gate, layout.gate_bias, rows, chosen),
        _per_choice(layout.up, layout.up_bias, rows, chosen),
    ]


def _combined(layout: Layout, activation: Activation, pre, chosen, weights) -> np.ndarray:
    """sum_j w[t, j] * expert_e(x[t]) given the pre-activations of the chosen experts."""
    out = _per_choice(layout.down, layout.down_bias, activation(*pre), chosen)
    return np.einsum("tk,tkh->th", weights, out)


def _close(expected: np.ndarray, got: np.ndarray) -> bool:
    if expected.shape != got.shape or not np.all(np.isfinite(expected)):
        return False  # a hypothesis that weighs a token by 0 / 0 reproduces nothing
    scale = float(np.abs(expected).max()) or 1.0
    return bool(np.allclose(got, expected, rtol=RTOL, atol=ATOL * scale))


def _matching(candidates, acts, probes, logits, k, routing: Routing) -> Experts | None:
    """The first hypothesis that reproduces the block on every probe (x, output)."""
    chosen, top = routing.choose(logits, k)
    with np.errstate(invalid="ignore", divide="ignore"):  # a token weighing nothing (a
        renormalized = top / top.sum(-1, keepdims=True)  # skip class): no renormalizing
    for layout in candidates:
        if layout.gate.shape[1:] != (layout.down.shape[2], probes[0][0].shape[1]):
            continue
        pres = [_pre_activations(layout, x, chosen) for x, _ in probes]
        for activation in acts:
            for normalize, weights in ((True, renormalized), (False, top)):
                outputs = [_combined(layout, activation, pre, chosen, weights) for pre in pres]
                for scale in routing.scales:
                    if all(
                        _close(scale * out, got.reshape(out.shape))
                        for out, (_, got) in zip(outputs, probes, strict=True)
                    ):
                        return scaled(as_moe(layout, activation, k, normalize), scale)
    return None


def _clamp_scale(candidates: list[Layout], acts: list[Activation], x: np.ndarray) -> float:
    """How much to scale the tokens so their gate/up values reach past the largest clamp
    limit the block reads (0: it reads none)."""
    limits = [a.limit for a in acts if math.isfinite(a.limit)]
    if not limits or not candidates:
        return 0.0
    layout, rows = candidates[0], x.astype(np.float64)
    reach = max(
        float(np.abs(part[e] @ rows.T).max())
        for part in (layout.gate, layout.up)
        for e in range(part.shape[0])
    )
    return _CLAMP_REACH * max(limits) / reach if reach > 0 else 0.0


def prove(
    block: Block, k: int, opsets: dict[str, int], routing: Routing = SOFTMAX
) -> Experts | str:
    """The experts the block computes with, routed as ``routing`` says, or why it is not
    a mixture of experts."""
    import onnxruntime as ort  # only a block that looks like experts pays for it

    candidates = layouts(block)
    if not candidates:
        return "the stacked weights are not a fused gate/up pair or a gate, an up and a down"
    first = candidates[0]
    rows = int(np.prod(TOKENS)) + len(paired(block, k))
    cost = rows * k * (2 * first.gate[0].size + first.down[0].size)
    if cost > _PROOF_ELEMENTS:
        return "the experts are too large to prove by running the block"
    feeds, x, logits = random_inputs(block, paired(block, k))
    if isinstance(feeds, str):
        return feeds
    acts = activations(block.nodes)
    scales = [1.0] + [s for s in [_clamp_scale(candidates, acts, x)] if s > 0]
    probes = _run_block(ort, block, opsets, feeds, x, scales)
    if isinstance(probes, str):
        return probes
    experts = _matching(candidates, acts, probes, logits, k, routing)
    if experts is None:
        return (
            f"the block does not compute {routing.name} and SwiGLU experts (silu(gate) * "
            "up, or gpt-oss's clamped form, then down) with its stacked weights"
        )
    shaped = feeds[block.logits.name]  # as the block reads them: [B, S, E] or [T, E]
    if len(block.hidden.shape) > 2:  # the kernel reads [B, S, D] merged (_merged.py)
        dims = feeds[block.root.name].shape[:-1]
        if len(block.root.shape) != len(block.hidden.shape):
            return f"the hidden states {block.hidden.name!r} are not shaped as the tokens"
        probes = [(x.reshape(*dims, -1), got) for x, got in probes]
    return _kernel_agrees(ort, experts, (probes, feeds, shaped), routing, opsets)


def _run_block(ort, block: Block, opsets, feeds, x, scales):
    """[(tokens, block output)] for the tokens at each scale, or why it cannot run."""
    try:
        session = ort.InferenceSession(
            subgraph_model(block.nodes, [block.output], opsets).SerializeToString(),
            options(ort),
            providers=["CPUExecutionProvider"],
        )
        probes = []
        for scale in scales:
            scaled = dict(feeds, **{block.root.name: feeds[block.root.name] * np.float32(scale)})
            (got,) = session.run(None, scaled)
            probes.append(((x * np.float32(scale)).astype(np.float32), got))
    except Exception as exc:
        return f"onnxruntime cannot run the block on its own ({type(exc).__name__})"
    if probes[0][1].size != x.size:  # [B, S, hidden] where the router reads [B, S, hidden]
        return f"the block's output has shape {list(probes[0][1].shape)}, its input {list(x.shape)}"
    return probes


def _kernel_model(routing: Routing, experts: Experts, inputs, opset: int):
    """What the rewrite emits, alone: graph inputs x, logits and the experts' constants
    (fed, not copied into the model), and what else it reads (fed as the block was:
    ``inputs`` holds the block's feeds); and those constants by name."""
    x, logits, block_feeds = inputs
    fed: dict[str, np.ndarray] = {}
    hidden = ir.val("x", ir.DataType.FLOAT, _symbolic(x))
    scores = ir.val("logits", ir.DataType.FLOAT, _symbolic(logits))

    def constant(hint: str, array: np.ndarray) -> ir.Value:
        fed[hint] = array
        return ir.val(hint, ir.DataType.from_numpy(array.dtype), list(array.shape))

    def outside(value: ir.Value) -> ir.Value:
        return constant(f"outside_{value.name}", block_feeds[value.name])

    emitted = routing.emit(hidden, scores, experts, constant, outside)
    nodes, output = emitted.nodes, emitted.output
    output.name = "y"
    inputs = [hidden, scores, *_fed_inputs(nodes, fed)]
    graph = ir.Graph(
        inputs, [output], nodes=nodes, opset_imports={"": opset, MS_DOMAIN: 1}, name="moe"
    )
    return ir.serde.serialize_model(ir.Model(graph, ir_version=8)), fed


def _symbolic(array: np.ndarray) -> list[int | str]:
    """``array``'s shape with its leading axes (the tokens) symbolic."""
    return [*(f"rows_{i}" for i in range(array.ndim - 1)), array.shape[-1]]


def _fed_inputs(nodes: list[ir.Node], fed: dict[str, np.ndarray]) -> list[ir.Value]:
    """The values the nodes read that ``constant`` made (graph inputs of the model)."""
    found: dict[str, ir.Value] = {}
    for node in nodes:
        for value in node.inputs:
            if value is not None and value.name in fed and value.producer() is None:
                found.setdefault(value.name, value)
    return list(found.values())


def _kernel_agrees(
    ort, experts: Experts, runs_of, routing: Routing, opsets: dict[str, int]
) -> Experts | str:
    """What the rewrite emits (com.microsoft.MoE, and the router's steps around it) gives
    on the same inputs what the block gave (at the model's opset, 17 at least: the
    router's copied ops are the model's)."""
    probes, feeds, logits = runs_of
    opset = max(17, opsets.get("", opsets.get("ai.onnx", 17)))
    try:
        model, constants = _kernel_model(routing, experts, (probes[0][0], logits, feeds), opset)
        session = ort.InferenceSession(
            model.SerializeToString(), options(ort), providers=["CPUExecutionProvider"]
        )
        runs = [
            (expected, session.run(None, {"x": x, "logits": logits, **constants})[0])
            for x, expected in probes
        ]
    except Exception as exc:
        return f"onnxruntime's MoE kernel cannot run these experts ({type(exc).__name__})"
    if not all(_close(expected.astype(np.float64), got) for expected, got in runs):
        return "onnxruntime's MoE kernel does not reproduce the block"
    return experts


def options(ort):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return options


def subgraph_model(
    nodes: list[ir.Node], outputs: list[ir.Value], opsets: dict[str, int]
) -> onnx.ModelProto:
    """``nodes`` alone (in graph order), what they read as inputs, constants too (so no
    weight is copied into the model: the caller feeds them)."""
    inputs = [
        onnx.helper.make_tensor_value_info(
            v.name, int(v.dtype) if v.dtype is not None else onnx.TensorProto.FLOAT, None
        )
        for v in external(nodes)
    ]
    results = [
        onnx.helper.make_tensor_value_info(
            v.name, int(v.dtype) if v.dtype is not None else onnx.TensorProto.FLOAT, None
        )
        for v in outputs
    ]
    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(n) for n in nodes], "subgraph", inputs, results
    )
    imports = [onnx.helper.make_opsetid(d, v) for d, v in opsets.items()]
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=8)
