"""DeepSeek-V3-style sigmoid routers, and the one case ``com.microsoft.MoE`` computes.

transformers' DeepSeek-V3 router (``models/deepseek_v3``; GLM-4.5's ``glm4_moe``,
``dots1``, ``exaone_moe``; AFMoE's ``AfmoeTokenChoiceRouter`` without the groups) scores
the experts by ``s = sigmoid(logits)`` and::

    choice = s + b                              # b: e_score_correction_bias / expert_bias
    [groups: G groups scored by the sum of their top 2 choices; all but the best
     topk_group groups set to -inf]
    chosen = top_k(choice)                      # only the indices are used
    w = s[chosen]  [/ (sum(w) + 1e-20)]  * routed_scaling_factor

onnxruntime 1.32's CPU ``MoE`` (``contrib_ops/cpu/moe/moe_cpu.cc``) picks and weights by
one ``p = softmax(r)`` of its router input ``r``: the top k of p (a partial sort of
(p, index) pairs, descending, so a tie goes to the higher index), weighted by p,
divided by their sum when ``normalize_routing_weights``. With ``r = log(s)``:

* ``p = s / sum(s)``: the order of s, so the top k of s, which is the model's choice
  when b is all zero and the groups drop nothing (one group, or topk_group = G);
* renormalized, ``p[chosen] / sum(p[chosen]) = s[chosen] / sum(s[chosen])``: the model's
  weights (its 1e-20 vanishes in float32 unless every chosen logit is below about -30);
  not renormalized, ``p[chosen] * sum(s) = s[chosen]``: a ReduceSum and a Mul after it;
* the scaling factor multiplies every expert's output: folded into fc2 and its bias;
* ties: ``s`` is exactly 1.0 in float32 for logits above about 16.6, where ONNX's TopK
  takes the lower index first and the kernel the higher: the rewrite hands the kernel
  the experts in reverse order (its input and the stacked weights), so that a tie goes
  to the lower original index, as in the model.

What it emits::

    r = Gather(Log(Sigmoid(logits)), [E-1, ..., 0], axis=1)
    y = MoE(x, r, fc1[::-1], fc1_bias[::-1], c * fc2[::-1], c * fc2_bias[::-1])
        [* ReduceSum(Sigmoid(logits), -1)   when the weights are not renormalized]

A selection bias that is not all zero, or groups that drop experts, move the choice
and not the weights; the kernel has one softmax for both, so those blocks take the
general path instead (``_any_router.py``: the router's own choice and weights fed to
the kernel). Random-init checkpoints have b = 0 (a buffer initialized to zeros),
trained ones do not: the bias is read from the constant, never assumed.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block, upstream
from autofusion.fusion_core.rewriters.mixture_of_experts._experts import (
    Constant,
    Experts,
    moe_node,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._proof import (
    Emitted,
    Routing,
    external,
    options,
    probe_rows,
    sized,
    subgraph_model,
)

__all__ = ["between", "choice_reason", "emit_sigmoid", "sigmoid_routing"]

_CHOICE_TOKENS = 256  # random tokens the router's choice is run on
_LOGIT_SPREAD = 3.0  # their logits' standard deviation: spread, far from saturation
_MOST_SCALES = 8


def between(sigmoid: ir.Node, topk: ir.Node) -> list[ir.Node]:
    """The nodes on the way from the Sigmoid to the TopK's input (the selection bias,
    the groups' TopKs and masks), in graph order."""
    after: dict[int, ir.Node] = {}
    todo = [sigmoid]
    while todo:
        for value in todo.pop().outputs:
            for use in value.uses():
                if id(use.node) not in after and use.node is not topk:
                    after[id(use.node)] = use.node
                    todo.append(use.node)
    before: set[int] = set()
    todo = [topk.inputs[0]] if topk.inputs else []
    while todo:
        node = todo.pop().producer()
        if node is None or id(node) in before or id(node) not in after:
            continue
        before.add(id(node))
        todo.extend(v for v in node.inputs if v is not None)
    order = {id(n): i for i, n in enumerate(sigmoid.graph or [])}
    found = [after[i] for i in before]
    return sorted(found, key=lambda n: order.get(id(n), 0))


def _bias_reason(logits: ir.Value, nodes: list[ir.Node]) -> str | None:
    """Why the choice is biased: an Add (or Sub) on the way from the logits to the
    choice that adds a float constant not all zero, or a value that is not a constant."""
    made = {id(v) for n in nodes for v in n.outputs} | {id(logits)}
    for node in nodes:
        if node.op_type not in ("Add", "Sub"):
            continue
        for value in node.inputs:
            if value is None or id(value) in made:
                continue
            array = constant_array(value)
            if array is not None and array.dtype.kind != "f":
                continue  # shape arithmetic
            if array is None:
                return (
                    "the experts are picked by sigmoid(logits) plus a selection bias "
                    f"{value.name!r} that is not a constant; MoE's kernel picks and weights "
                    "by one softmax of its input"
                )
            if np.any(array != 0):
                return (
                    "the experts are picked by sigmoid(logits) plus a selection bias "
                    f"({value.name!r}, not all zero) and weighted by the sigmoid alone; "
                    "MoE's kernel picks and weights by one softmax of its input, which "
                    "cannot hold a bias that moves only the choice"
                )
    return None


def _group_reason(topk: ir.Node, nodes: list[ir.Node]) -> str:
    groups = [n for n in nodes if n.op_type == "TopK"]
    if not groups:
        return (
            f"TopK {topk.name!r} does not pick the top k of sigmoid(logits) (run on "
            f"{_CHOICE_TOKENS} random tokens)"
        )
    return (
        "the experts are picked within the best groups first (group-limited routing: "
        f"TopK {groups[0].name!r} scores each group, and the groups not chosen are masked "
        "out); MoE's kernel picks the top k of all experts"
    )


def choice_reason(
    sigmoid: ir.Node, topk: ir.Node, k: int, nodes: list[ir.Node], opsets: dict[str, int]
) -> str | None:
    """Why the router's choice is not the top k of its logits (None: it is). The bias
    is read from its constant; what the groups and masks do is run, on random logits;
    ``nodes`` (between the Sigmoid and the TopK) name the group step when there is one."""
    logits, chosen = sigmoid.inputs[0], topk.outputs[1]
    found = upstream(chosen, {id(logits)})
    if isinstance(found, str):
        return found
    order = {id(n): i for i, n in enumerate(sigmoid.graph or [])}
    found.sort(key=lambda n: order.get(id(n), 0))
    reason = _bias_reason(logits, found)
    if reason is not None:
        return reason
    rng = np.random.default_rng(0)
    experts = logits.shape[-1] if logits.shape is not None else None
    if not isinstance(experts, int):
        return f"the router's logits {logits.name!r} have no known width"
    rows = probe_rows(logits, _CHOICE_TOKENS)  # a graph exported for one length: its count
    runs = max(1, _CHOICE_TOKENS // rows)
    scores = rng.standard_normal((runs * rows, experts)) * _LOGIT_SPREAD
    scores = scores.astype(np.float32)
    got = _run_choice(found, logits, chosen, np.split(scores, runs), opsets)
    if isinstance(got, str):
        return got
    expected = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    if got.shape != expected.shape or np.any(np.sort(got, -1) != np.sort(expected, -1)):
        return _group_reason(topk, nodes)
    return None


def _run_choice(nodes, logits, chosen, parts, opsets) -> np.ndarray | str:
    """The router's choice on each part of the scores (one session), joined."""
    import onnxruntime as ort  # only a sigmoid router pays for it

    rows = len(parts[0])
    feeds = {logits.name: parts[0]}
    tokens = {str(d): rows for d in (logits.shape or [])[:-1] if not isinstance(d, int)}
    for value in external(nodes):
        if value is logits:
            continue
        array = constant_array(value)
        if array is None:
            array = sized(value, nodes, tokens)
        if isinstance(array, str):
            return array
        feeds[value.name] = array
    try:
        session = ort.InferenceSession(
            subgraph_model(nodes, [chosen], opsets).SerializeToString(),
            options(ort),
            providers=["CPUExecutionProvider"],
        )
        got = [session.run(None, {**feeds, logits.name: part})[0] for part in parts]
    except Exception as exc:
        return f"onnxruntime cannot run the router's choice on its own ({type(exc).__name__})"
    return np.concatenate(got)


def _sigmoid_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top k of the logits and their sigmoid scores (float64)."""
    chosen = np.argsort(-logits.astype(np.float64), axis=-1, kind="stable")[:, :k]
    s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    return chosen, np.take_along_axis(s, chosen, -1)


def _scales(block: Block) -> tuple[float, ...]:
    """1, and the scalars the block multiplies (or divides) by: the routing weights'
    scaling factor is among them; running decides which."""
    found = [1.0]
    for node in block.nodes:
        if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
            continue
        array = constant_array(node.inputs[1])
        if node.op_type == "Mul" and array is None:
            array = constant_array(node.inputs[0])
        if array is None or array.size != 1 or array.dtype.kind != "f":
            continue
        value = float(array.reshape(-1)[0])
        value = 1.0 / value if node.op_type == "Div" and value != 0 else value
        if value not in found and np.isfinite(value) and value != 0:
            found.append(value)
    return tuple(found[:_MOST_SCALES])


def emit_sigmoid(
    hidden: ir.Value, logits: ir.Value, experts: Experts, constant: Constant, _outside=None
) -> Emitted:
    """The kernel fed log(sigmoid(logits)) with the experts reversed (the module doc)."""
    count = experts.fc1.shape[0]
    reverse = constant("reverse", np.arange(count - 1, -1, -1, dtype=np.int64))
    sigmoid = ir.node("Sigmoid", [logits])
    log = ir.node("Log", [sigmoid.outputs[0]])
    router = ir.node("Gather", [log.outputs[0], reverse], {"axis": 1})
    reversed_experts = Experts(
        experts.k,
        experts.normalize,
        np.ascontiguousarray(experts.fc1[::-1]),
        np.ascontiguousarray(experts.fc2[::-1]),
        None if experts.fc1_bias is None else np.ascontiguousarray(experts.fc1_bias[::-1]),
        None if experts.fc2_bias is None else np.ascontiguousarray(experts.fc2_bias[::-1]),
        experts.activation,
    )
    moe = moe_node(hidden, router.outputs[0], reversed_experts, constant)
    nodes = [sigmoid, log, router, moe]
    if experts.normalize:
        return Emitted(nodes, moe.outputs[0])
    axes = constant("last_axis", np.array([-1], np.int64))
    total = ir.node("ReduceSum", [sigmoid.outputs[0], axes], {"keepdims": 1})
    weighted = ir.node("Mul", [moe.outputs[0], total.outputs[0]])
    return Emitted([*nodes, total, weighted], weighted.outputs[0])


def sigmoid_routing(block: Block) -> Routing:
    """How the proof routes a sigmoid router's block, and what the rewrite emits."""
    return Routing(_sigmoid_top_k, emit_sigmoid, _scales(block), name="sigmoid, top-k")
