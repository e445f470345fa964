"""Any router whose choice and weights the graph computes: the kernel fed exactly those.

A router of any kind (a softmax or sigmoid picked with a selection bias, within the best
groups, PhiMoE's sparsemixer that picks by ArgMax twice...) computes per token the
chosen experts ``idx [T, k]`` and the weights ``w [T, k]`` the block combines them with::

    y[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t])

Its subgraph stays as the graph computes it (cloned, reading the same logits), and
onnxruntime 1.32's CPU ``MoE`` (``contrib_ops/cpu/moe/moe_cpu.cc``: ``p = softmax(r)``
over all experts, the top k of p, weighted by p, divided by their sum when
``normalize_routing_weights``) is handed a router input whose softmax is those weights::

    W = ScatterElements(zeros [T, E], idx, w, axis=1, reduction=add)   # W[t, e] = sum of w at e
    r = Log(W)                                   # log 0 = -inf where no weight is
    y = MoE(x, r, ..., k, normalize_routing_weights=1) * ReduceSum(w, -1)

``softmax(log W) = W / sum(W)``: every expert with a weight has p > 0 and every other
p = 0 (probed: the kernel gives -inf a weight of exactly 0, and a token whose every
input is -inf an output of 0), and at most k experts have a weight, so the kernel's top
k holds all of them whatever its order or ties (a zero-weight expert it adds is
weighted 0); renormalized, their weights are ``W_e / sum(W)``, and the product by
``sum(w) = sum(W)`` gives the block's ``sum_e W_e expert_e``. Scattering with ``add``
makes a duplicate choice harmless (the block weighs such an expert twice, and so does
W), so distinct choices need no proof. Where the proof finds the block renormalizes w
itself (``sum(w) = 1``), the product is left out.

What is proven before emitting: w is not negative by construction (``nonnegative``:
Softmax, Sigmoid, Exp and their gathers, products, ratios, sums, maxima and
non-negative constants; ``log`` of a negative weight is NaN); which values are idx and
w is found by running the router on random logits (values shaped [T, k]) and kept only
where the block, run on its own, computes exactly the sum above (``_proof.py``), and
the emitted nodes, run alone, reproduce it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array, constant_tensor
from autofusion.fusion_core.rewriters.mixture_of_experts._block import Block
from autofusion.fusion_core.rewriters.mixture_of_experts._experts import (
    Constant,
    Experts,
    moe_node,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._proof import (
    Emitted,
    Outside,
    Routing,
    external,
    options,
    probe_rows,
    router_feed,
    subgraph_model,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._walk import computing, from_logits

__all__ = ["any_routings", "nonnegative", "router_part"]

_PROBE_TOKENS = 13  # random tokens the router is run on to find idx and w (a prime)
_MOST_PAIRS = 6  # (idx, w) pairs tried, latest first
_INDICES = frozenset({ir.DataType.INT64, ir.DataType.INT32})
_SHAPE_ONLY = frozenset({"Shape", "Size"})

# Ops whose result is not negative whatever they read, and ops that keep the sign of
# what they read (output 0 from input 0: a gather, a reshape, a top-k's values...).
_NONNEGATIVE = frozenset({"Softmax", "Sigmoid", "Exp", "Abs", "Relu", "Softplus"})
_FIRST_INPUT = frozenset(
    {
        "Gather", "GatherElements", "GatherND", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
        "Identity", "Slice", "Split", "Transpose", "Expand", "Tile", "TopK", "ReduceMax",
        "ReduceMin", "ReduceSum", "ReduceMean", "Cast", "Sqrt", "Pow",
    }
)  # fmt: skip
_EVERY_INPUT = frozenset({"Mul", "Div", "Add", "Min", "Concat", "Sum", "Mean"})


def router_part(block: Block) -> list[ir.Node]:
    """The block's nodes computed from the logits, constants and shapes alone, in graph
    order: the router (its choice, its weights and the masks between; a mask's shape
    may be read from the hidden states)."""
    return from_logits(block.nodes, block.logits)


def nonnegative(value: ir.Value, inside: set[int], seen: dict[int, str | None]) -> str | None:
    """Why ``value`` may be negative (None: it cannot be), read back through the nodes
    whose ids are ``inside``; ``seen`` remembers the answers."""
    if id(value) in seen:
        return seen[id(value)]
    seen[id(value)] = None  # a cycle cannot occur; this only stops a revisit
    seen[id(value)] = reason = _sign_reason(value, inside, seen)
    return reason


def _sign_reason(value: ir.Value, inside: set[int], seen: dict[int, str | None]) -> str | None:
    array = constant_array(value) if constant_tensor(value) is not None else None
    if array is not None:
        numbers = array.astype(np.float64) if array.dtype.kind in "fiub" else None
        if numbers is None or not np.all(numbers >= 0):
            return f"the constant {value.name!r} has negative values"
        return None
    node = value.producer()
    if node is None or id(node) not in inside:
        return f"{value.name!r} is not computed by the router from its probabilities"
    op, inputs = node.op_type, list(node.inputs)
    if op in _NONNEGATIVE:
        return None
    if op == "Cast" and inputs[0] is not None and inputs[0].dtype == ir.DataType.BOOL:
        return None
    checks: list[ir.Value | None]
    if op in _FIRST_INPUT:
        checks = inputs[:1]
    elif op in _EVERY_INPUT:
        checks = inputs
    elif op == "Where":
        checks = inputs[1:3]
    elif op in ("ScatterElements", "ScatterND"):
        checks = [inputs[0], inputs[2]]
    elif op == "Max":  # one non-negative input is enough
        reasons = [nonnegative(v, inside, seen) for v in inputs if v is not None]
        return None if any(r is None for r in reasons) else f"Max {node.name!r}: {reasons}"
    elif op == "Clip":
        low = constant_array(inputs[1]) if len(inputs) > 1 else None
        if low is not None and low.size == 1 and float(low.reshape(-1)[0]) >= 0:
            return None
        checks = inputs[:1]
    else:
        return f"{op} {node.name!r} may give a negative value"
    for input_value in checks:
        if input_value is not None:
            reason = nonnegative(input_value, inside, seen)
            if reason is not None:
                return reason
    return None


def _closure(part: list[ir.Node], values: list[ir.Value]) -> list[ir.Node]:
    """The nodes of ``part`` that ``values`` are computed from, in ``part``'s order."""
    needed = computing({id(n): n for n in part}, list(values))
    return [n for n in part if id(n) in needed]


def _sized(value: ir.Value, nodes: list[ir.Node], tokens: int) -> np.ndarray | str:
    """Zeros shaped like ``value``, which ``nodes`` read the shape of only: its last
    symbolic dimension the tokens, the others 1 (the hidden states, [tokens, hidden]
    or [1, tokens, hidden], as the logits' tokens say)."""
    readers = [u.node for u in value.uses() if any(u.node is n for n in nodes)]
    if not readers or any(n.op_type not in _SHAPE_ONLY for n in readers):
        return f"the router reads {value.name!r}, neither its logits nor a constant"
    if value.shape is None or value.dtype is None:
        return f"the router reads the shape of {value.name!r}, which is not known"
    symbolic = [i for i, d in enumerate(value.shape) if not isinstance(d, int)]
    dims = [d if isinstance(d, int) else 1 for d in value.shape]
    if symbolic:
        dims[symbolic[-1]] = tokens
    return np.zeros(dims, value.dtype.numpy())


def _run(nodes: list[ir.Node], logits: ir.Value, outputs, feed: np.ndarray, opsets):
    """The ``outputs`` of ``nodes`` run alone on the logits ``feed``, or why not."""
    import onnxruntime as ort  # only a router the fast paths refuse pays for it

    feeds = {logits.name: feed}
    tokens = int(np.prod(feed.shape[:-1]))
    for value in external(nodes):
        if value is not logits:
            array = constant_array(value)
            if array is None:
                array = _sized(value, nodes, tokens)
            if isinstance(array, str):
                return array
            feeds[value.name] = array
    try:
        session = ort.InferenceSession(
            subgraph_model(nodes, outputs, opsets).SerializeToString(),
            options(ort),
            providers=["CPUExecutionProvider"],
        )
        return session.run(None, feeds)
    except Exception as exc:
        return f"onnxruntime cannot run the router on its own ({type(exc).__name__})"


def _infer_types(part: list[ir.Node], opsets) -> None:
    """Give the router's values the element types ONNX's inference finds, where the
    graph does not say (a value's type only: its shape stays as the graph has it)."""
    untyped = {v.name: v for n in part for v in n.outputs if v.dtype is None and v.name}
    if not untyped or not part:
        return
    last = part[-1].outputs[0]
    model = subgraph_model(part, [last], opsets)
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    except Exception:  # inference is a help here, not a requirement
        return
    for info in inferred:
        value = untyped.get(info.name)
        if value is not None and info.type.tensor_type.elem_type:
            value.dtype = ir.DataType(info.type.tensor_type.elem_type)


def _shaped_values(block: Block, part: list[ir.Node], opsets):
    """(choices, weights): the router's values shaped [T, k] (k at most the experts) on
    random logits, integer ones and float ones, latest first; or why none."""
    _infer_types(part, opsets)
    typed = [
        v
        for n in part
        for v in n.outputs
        if v.dtype in (*_INDICES, ir.DataType.FLOAT) and (v.uses() or v.is_graph_output())
    ]
    if not typed:
        return "the router computes no typed value"
    rng = np.random.default_rng(0)
    rows = probe_rows(block.logits, _PROBE_TOKENS)
    logits = rng.standard_normal((rows, block.columns)).astype(np.float32)
    got = _run(part, block.logits, typed, router_feed(block.logits, logits), opsets)
    if isinstance(got, str):
        return got
    choices, weights = [], []
    for value, array in zip(typed, got, strict=True):
        if array.ndim != 2 or array.shape[0] != rows:
            continue
        if not 1 <= array.shape[1] <= block.experts:
            continue
        if value.dtype not in _INDICES:
            weights.append((value, array.shape[1]))
        elif _expert_ids(array, block.experts):
            choices.append((value, array.shape[1]))
    return choices[::-1], weights[::-1]


def _expert_ids(array: np.ndarray, experts: int) -> bool:
    """Whether every entry of ``array`` names one of the experts."""
    return bool(array.size) and int(array.min()) >= 0 and int(array.max()) < experts


def any_routings(block: Block, opsets: dict[str, int]) -> Iterator[Routing | str]:
    """Each (idx, w) reading of the router worth proving, latest values first, as a
    ``Routing`` with k; or why there is none (a string)."""
    part = router_part(block)
    found = _shaped_values(block, part, opsets)
    if isinstance(found, str):
        yield found
        return
    choices, weights = found
    if not choices or not weights:
        yield (
            "the router computes no chosen experts and weights per token ([tokens, k] "
            "integers and floats from its logits)"
        )
        return
    inside, seen = {id(n) for n in part}, {}
    signed = [(w, k, nonnegative(w, inside, seen)) for w, k in weights]
    usable = [(w, k) for w, k, reason in signed if reason is None]
    latest, _, reason = signed[0]
    if reason is not None:  # the weights the block reads last: the likeliest ones
        yield (
            f"the routing weights {latest.name!r} may be negative ({reason}); the MoE "
            "kernel weighs the experts by a softmax, which is never negative"
        )
    pairs = [(i, w, k) for w, k in usable for i, ki in choices if ki == k][:_MOST_PAIRS]
    if not pairs:
        yield "the router's weights and chosen experts have different widths"
    for idx, w, k in pairs:
        yield _routing(block, part, (idx, w, k), opsets)


def _routing(block: Block, part, pair: tuple[ir.Value, ir.Value, int], opsets) -> Routing:
    idx, w, k = pair
    nodes = _closure(part, [idx, w, *block.kept])

    def choose(logits: np.ndarray, _k: int) -> tuple[np.ndarray, np.ndarray]:
        feed = router_feed(block.logits, logits.astype(np.float32))
        got = _run(nodes, block.logits, [idx, w], feed, opsets)
        if isinstance(got, str):
            raise RuntimeError(got)
        chosen, weights = got
        if not _expert_ids(chosen, block.experts):
            raise RuntimeError(f"{idx.name!r} names no expert on the proof's logits")
        return chosen.astype(np.int64), weights.astype(np.float64)

    def emit(hidden, logits, experts, constant, outside) -> Emitted:
        reads = (block.logits, idx, w, block.kept)
        return _emit(nodes, reads, (hidden, logits), experts, (constant, outside))

    name = f"the experts {idx.name!r} weighted by {w.name!r} (k = {k})"
    return Routing(choose, emit, (1.0,), name=name, k=k, unmerged=True)


def _clone(
    nodes: list[ir.Node], mapping: dict[int, ir.Value], makers: tuple[Constant, Outside]
) -> list[ir.Node]:
    """Copies of ``nodes`` reading the values ``mapping`` gives (constants through
    ``constant``, anything else through ``outside``), their outputs added to
    ``mapping``; each typed and shaped as its original (the copy reads the logits as
    the graph shapes them, [B, S, E] too: ``Routing.unmerged``)."""
    constant, outside = makers
    clones = []
    for node in nodes:
        inputs = []
        for value in node.inputs:
            if value is not None and id(value) not in mapping:
                # an initializer or a value read by its shape stays the graph's; a
                # Constant node's output is copied (the node may go with the block)
                inner = value.producer() is not None and constant_tensor(value) is not None
                mapping[id(value)] = (
                    constant(value.name or "router", constant_array(value))
                    if inner
                    else outside(value)
                )
            inputs.append(None if value is None else mapping[id(value)])
        attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        clone = ir.Node(
            node.domain, node.op_type, inputs, attributes,
            num_outputs=len(node.outputs), version=node.version,
        )  # fmt: skip
        for old, new in zip(node.outputs, clone.outputs, strict=True):
            new.dtype, new.shape = old.dtype, old.shape
            mapping[id(old)] = new
        clones.append(clone)
    return clones


def _emit(nodes, reads, inputs, experts: Experts, makers: tuple[Constant, Outside]) -> Emitted:
    """The router's clone, the dense log-weights, the MoE and the product by sum(w); the
    clone's values stand for the router's that are read outside the block (``kept``)."""
    old_logits, idx, w, kept = reads
    hidden, logits = inputs
    constant = makers[0]
    mapping = {id(old_logits): logits}
    clones = _clone(nodes, mapping, makers)
    chosen, weights = mapping[id(idx)], mapping[id(w)]
    shape = _dense_shape((logits, chosen), experts.fc1.shape[0], constant)
    zero = ir.tensor(np.zeros(1, np.float32))
    zeros = ir.node("ConstantOfShape", [shape[-1].outputs[0]], {"value": zero})
    dense = ir.node(
        "ScatterElements",
        [zeros.outputs[0], chosen, weights],
        {"axis": 1, "reduction": "add"},
    )
    router = ir.node("Log", [dense.outputs[0]])
    moe = moe_node(hidden, router.outputs[0], replace(experts, normalize=True), constant)
    made = [*clones, *shape, zeros, dense, router, moe]
    copies = [(value, mapping[id(value)]) for value in kept]
    if experts.normalize:  # the block divides w by its sum itself
        return Emitted(made, moe.outputs[0], copies)
    axes = constant("last_axis", np.array([-1], np.int64))
    total = ir.node("ReduceSum", [weights, axes], {"keepdims": 1})
    weighted = ir.node("Mul", [moe.outputs[0], total.outputs[0]])
    return Emitted([*made, total, weighted], weighted.outputs[0], copies)


def _dense_shape(
    read: tuple[ir.Value, ir.Value], experts: int, constant: Constant
) -> list[ir.Node]:
    """The nodes whose last gives [tokens, experts]: the shape of the logits [T, E], or
    else (more classes than there are experts: a skip class, shared experts' gates;
    logits [B, S, E]) the rows of the chosen experts [T, k] and the experts' count."""
    logits, chosen = read
    if logits.shape is not None and len(logits.shape) == 2 and logits.shape[-1] == experts:
        return [ir.node("Shape", [logits])]
    rows = ir.node("Shape", [chosen], {"start": 0, "end": 1})
    count = constant("experts_count", np.array([experts], np.int64))
    return [rows, ir.node("Concat", [rows.outputs[0], count], {"axis": 0})]
