"""Where a mixture-of-experts block is in the graph, found from its router alone.

The router is what every spelling shares: logits ``x @ W_r`` (a MatMul or Gemm by a
constant), a Softmax and a TopK (in either order). What follows differs with the
exporter and the library (experts' weights gathered by the chosen indices and
multiplied batch-wise, a Gather or a GatherND, Split or Slice for the gate and up
halves, repeat_interleave as Tile or Expand...), so the block is found by data flow,
not by spelling:

* its **output** is the first value after the router that every path from the TopK's
  results goes through (a dominator), shaped like the hidden states and computed from
  them by more than the router (a dense routing matrix [tokens, experts] is the router's
  alone): the sum of the weighted expert outputs (``_tokens.py``: the hidden states are
  the router's input, or the input of one of its linears where the router computes
  features of its own);
* its **nodes** are what that output is computed from, back to the hidden states (and
  the Reshapes they came through), the logits and constants;
* its **experts** are the rank-3 constants with one row per expert that the block
  gathers by the router's indices (transformers' batched experts), each with the
  [experts, n] bias gathered the same way and added to its product where there is one
  (gpt-oss), or one SwiGLU MLP per expert with its own weights (an unrolled loop over
  the experts: ``_units.py``), or each expert's linear on its slab of the tokens sorted
  by expert (``_sorted_dispatch.py``).

What the block computes is then proven by evaluating it (``_proof.py``), not read from
its ops.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array, constant_tensor
from autofusion.fusion_core.rewriters.mixture_of_experts._sorted_dispatch import (
    SlabLinears,
    experts_around,
    slab_linears,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._tokens import (
    LAYOUT,
    dominators,
    hidden_states,
    root,
    summands,
)
from autofusion.fusion_core.rewriters.mixture_of_experts._units import Unit, swiglu_units
from autofusion.fusion_core.rewriters.mixture_of_experts._walk import (
    SHAPE_ONLY,
    from_logits,
    reading,
    walk_back,
)

__all__ = ["Block", "StackedWeight", "find_blocks", "router_input", "upstream"]

# The most nodes a block may have (Qwen3-MoE's batched experts: about 90 per layer).
_BLOCK_LIMIT = 600
_CANDIDATES = 3  # outputs tried, nearest first


@dataclass
class StackedWeight:
    """A constant [experts, a, b] the block gathers per chosen expert, and the MatMul
    that multiplies the gathered rows (``weight_first``: it is that MatMul's input 0,
    so the rows are [out, in]; else [in, out]); ``bias``: the constant [experts, out]
    gathered by the same choice and added to the product, if there is one."""

    gather: ir.Node
    array_value: ir.Value
    matmul: ir.Node
    weight_first: bool
    bias: ir.Value | None = None


@dataclass
class Block:
    hidden: ir.Value  # the router's input: the tokens the experts read, [tokens, hidden]
    root: ir.Value  # the earliest value the hidden states are a Reshape of
    logits: ir.Value  # the router's logits, [tokens, experts]
    experts: int
    output: ir.Value  # the weighted sum of the expert outputs
    nodes: list[ir.Node]  # what computes ``output`` from root, logits and constants, in order
    absorbed: list[ir.Node]  # those the rewrite removes (nothing outside reads them)
    weights: list[StackedWeight]  # the experts' weights stacked [experts, ...], or
    units: list[Unit]  # one SwiGLU MLP per expert, in the experts' order
    sorted_slabs: bool = False  # the weights are linears on slabs of the sorted tokens
    # the logits' width where it is more than the experts (ZAYA's skip class, Inkling's
    # shared experts' gates: classes no stacked weight has), else None
    classes: int | None = None
    # the router's values that nodes outside the block read (Inkling's shared experts'
    # gates): the rewrite hands those readers its copy of the router's (_any_router.py)
    kept: list[ir.Value] = field(default_factory=list)
    beside: bool = False  # a term of the first value all results flow into (_summands)

    @property
    def columns(self) -> int:
        """The logits' width: the experts, and the classes no expert has."""
        return self.classes or self.experts


def _under_bias(node: ir.Node | None) -> ir.Node | None:
    """The MatMul of ``MatMul(x, W) + b`` (b a constant), else ``node`` itself."""
    if node is None or node.op_type != "Add" or len(node.inputs) != 2:
        return node
    for product, bias in (node.inputs, node.inputs[::-1]):
        inner = product.producer() if product is not None else None
        if inner is not None and inner.op_type == "MatMul" and constant_array(bias) is not None:
            return inner
    return node


def router_input(logits: ir.Value) -> tuple[ir.Value, int] | str:
    """The hidden states the router reads and the number of experts: ``logits`` must be
    a MatMul or a Gemm of them by a constant [hidden, experts], with a bias or without
    (gpt-oss's has one): the router stays outside the fused op, which reads its logits,
    so only what it reads and how many experts it scores matter here."""
    node = _under_bias(logits.producer())
    if node is None or node.op_type not in ("MatMul", "Gemm"):
        found = node.op_type if node is not None else "a graph input"
        return f"the router's logits {logits.name!r} come from {found}, not a MatMul or Gemm"
    weight = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if weight is None or weight.ndim != 2:
        return f"the router {node.op_type} {node.name!r} does not multiply by a constant matrix"
    if node.op_type == "Gemm":
        attrs = {a.name: a.value for a in node.attributes.values()}
        if attrs.get("transA", 0):
            return f"the router Gemm {node.name!r} transposes its input"
        experts = weight.shape[0] if attrs.get("transB", 0) else weight.shape[1]
    else:
        experts = weight.shape[1]
    return node.inputs[0], int(experts)


def upstream(output: ir.Value, stops: set[int]) -> list[ir.Node] | str:
    """The nodes ``output`` is computed from, back to ``stops`` and constants (past no
    Shape: ``walk_back``), or why the block is not so computed."""
    walked = walk_back(output, stops, _BLOCK_LIMIT)
    if walked is None:
        return f"the block would have more than {_BLOCK_LIMIT} nodes"
    nodes, reads = walked
    if reads:
        value = next(iter(reads.values()))
        return f"the block reads {value.name!r}, neither the hidden states nor a constant"
    return list(nodes.values())


def _routed_gather(
    node: ir.Node | None, experts: int, routed: set[int], ndim: int, *, at_most: bool = False
) -> bool:
    """Whether ``node`` gathers rows of a constant [experts, ...] of rank ``ndim`` by the
    router's indices (``at_most``: [n, ...] with n up to ``experts``)."""
    if node is None or node.op_type not in ("Gather", "GatherND") or len(node.inputs) < 2:
        return False
    attrs = {a.name: a.value for a in node.attributes.values()}
    if attrs.get("axis", 0) != 0 or attrs.get("batch_dims", 0) != 0:
        return False
    array = constant_array(node.inputs[0])
    if array is None or array.ndim != ndim:
        return False
    fits = 0 < array.shape[0] <= experts if at_most else array.shape[0] == experts
    return fits and id(node.inputs[1]) in routed


def _rows(value: ir.Value) -> int:
    """The first dimension of a constant (its tensor's, not read)."""
    return int(constant_tensor(value).shape[0])


def _stacked(nodes: list[ir.Node], classes: int, routed: set[int]) -> list[StackedWeight]:
    """The block's gathers of a constant [experts, a, b] by the router's indices: as many
    experts as the logits have classes, or fewer (a skip class, shared experts' gates:
    ``Block.classes``); those of the first gather's count."""
    found: list[StackedWeight] = []
    for node in nodes:
        if not _routed_gather(node, classes, routed, 3, at_most=True):
            continue
        experts = _rows(node.inputs[0])
        if found and experts != _rows(found[0].array_value):
            continue
        matmul = _reading(node.outputs[0], "MatMul")
        if matmul is None:
            continue
        first = matmul[1] == 0
        bias = _bias_of(matmul[0], experts, routed)
        found.append(StackedWeight(node, node.inputs[0], matmul[0], first, bias))
    return found


def _bias_of(matmul: ir.Node, experts: int, routed: set[int]) -> ir.Value | None:
    """The constant [experts, out] that an Add after ``matmul`` (through layout ops)
    adds, gathered by the router's indices: the chosen experts' biases."""
    found = _reading(matmul.outputs[0], "Add")
    if found is None:
        return None
    add, index = found
    other = add.inputs[1 - index]
    for _ in range(4):
        node = other.producer() if other is not None else None
        if _routed_gather(node, experts, routed, 2):
            return node.inputs[0]
        if node is None or node.op_type not in LAYOUT or not node.inputs:
            return None
        other = node.inputs[0]
    return None


def _reading(value: ir.Value, op_type: str) -> tuple[ir.Node, int] | None:
    """The ``op_type`` node that reads ``value`` (through layout ops), and at which input."""
    for _ in range(4):
        uses = list(value.uses())
        if len(uses) != 1:
            return None
        node, index = uses[0].node, uses[0].idx
        if node.op_type == op_type:
            return node, index
        if node.op_type not in LAYOUT:
            return None
        value = node.outputs[0]
    return None


def find_blocks(graph: ir.Graph, router: list[ir.Node], logits: ir.Value) -> Iterator[Block | str]:
    """The blocks the ``router`` nodes (its Softmax, TopK and what is between) may
    choose experts for, nearest output first, or why there is none (a string). The
    hidden states are the first of ``hidden_states`` that a value after the router is
    shaped like (``_tokens.py``) and computed from by more than the router
    (``_experts_read``)."""
    found = router_input(logits)
    if isinstance(found, str):
        yield found
        return
    router_in, experts = found
    for node in router:
        for value in node.outputs:
            if value.is_graph_output():
                yield f"the router's {value.name!r} is a graph output, which MoE does not give"
                return
    for hidden in hidden_states(router_in):
        tokens = (hidden, root(hidden))
        ends = dominators(graph, router, tokens)
        sums = (end for end in ends if _experts_read(end[0], tokens[1], logits))
        outputs = list(itertools.islice(sums, _CANDIDATES))
        if outputs:
            yield from _blocks_at(graph, router, (*tokens, logits, experts), outputs)
            return
    yield (
        "no value after the router that all of its results flow into has the hidden states' shape"
    )


def _experts_read(output: ir.Value, earliest: ir.Value, logits: ir.Value) -> bool:
    """Whether ``output`` may be the experts' sum: False only where it is provably one
    of the router's own values, computed from its logits, constants and shapes alone
    (the hidden states, ``earliest`` their root, read by no data op on the way). A dense
    routing matrix [tokens, experts] is one, shaped like the hidden states where the
    router's own features are as wide as there are experts (ZAYA's down_proj to 8 with 8
    experts): taken for the block's output, it hid the block the wider hidden states end."""
    walked = walk_back(output, {id(earliest), id(logits)}, _BLOCK_LIMIT)
    if walked is None or walked[1]:
        return True  # too large, or reads more: the block says what it is (upstream)
    return any(
        node.op_type not in SHAPE_ONLY and any(v is earliest for v in node.inputs)
        for node in walked[0].values()
    )


def _blocks_at(
    graph: ir.Graph,
    router: list[ir.Node],
    reads: tuple[ir.Value, ir.Value, ir.Value, int],
    outputs: list[tuple[ir.Value, list[ir.Node]]],
) -> Iterator[Block | str]:
    """The blocks ending at each of ``outputs``, then at each term of those sums."""
    for output, downstream in outputs:
        yield _block(graph, router, reads, output, downstream)
    for output, downstream in outputs:  # the routed experts beside shared ones
        for part in summands(output, reads[:2], downstream):
            block = _block(graph, router, reads, part, downstream)
            if not isinstance(block, str):  # a term that is no block: nothing to say
                block.beside = True
                yield block


def _block(
    graph: ir.Graph,
    router: list[ir.Node],
    reads: tuple[ir.Value, ir.Value, ir.Value, int],
    output: ir.Value,
    downstream: list[ir.Node],
) -> Block | str:
    hidden, earliest, logits, classes = reads
    if len(output.shape) != len(hidden.shape):
        # the experts' sum shaped back as the value the hidden states flatten (shaped_like):
        # the kernel reads that value flattened, its output shaped back the same way
        hidden = earliest
    nodes = upstream(output, {id(earliest), id(logits)})
    if isinstance(nodes, str):  # experts around an attention read more: say so plainly
        return experts_around(graph, output, {id(earliest), id(logits)}, classes) or nodes
    order = {id(n): i for i, n in enumerate(graph)}
    nodes.sort(key=lambda n: order[id(n)])
    routed = {id(v) for n in [*router, *downstream] for v in n.outputs}
    inside = {id(n) for n in [*nodes, *router]}
    own = reading(from_logits(nodes, logits), logits)  # not a shape read beside them
    for node in downstream:  # what reads the choice and does not make the output
        if id(node) not in inside and not _reads_router_only(node, (inside, own), output):
            return (
                f"{node.op_type} {node.name!r} reads the router's choice but the block's "
                f"output {output.name!r} does not depend on it"
            )
    absorbed = _absorbed(nodes, router, output, (routed, own))
    if isinstance(absorbed, str):
        return absorbed
    absorbed, kept = absorbed
    weights = _stacked(nodes, classes, routed)
    units = swiglu_units(nodes) if len(weights) < 2 else []
    slabbed, experts = False, classes
    if len(weights) >= 2:
        experts = _rows(weights[0].array_value)
    elif 2 <= len(units) <= classes:
        experts = len(units)
    else:
        slabs = slab_linears(nodes, classes)
        if slabs is None:
            return (
                f"the block ending at {_value_and_producer(output)} has experts neither constants "
                f"[{classes}, out, in] gathered "
                f"by the router's indices (found {len(weights)}) nor {classes} SwiGLU MLPs "
                f"with their own weights (found {len(units)}) nor {classes} linears per "
                "projection on the slabs of the tokens sorted by expert"
            )
        if isinstance(slabs, str):
            return slabs
        weights, units, slabbed = [_slab_weight(s) for s in slabs], [], True
    extra = classes if classes != experts else None
    return Block(
        hidden, earliest, logits, experts, output, nodes, absorbed, weights, units, slabbed, extra,
        kept,
    )  # fmt: skip


def _value_and_producer(value: ir.Value) -> str:
    """``'v' (Add 'name')``: a value as a near miss names it, with the op computing it."""
    node = value.producer()
    if node is None:
        return repr(value.name)
    return f"{value.name!r} ({node.op_type}{f' {node.name!r}' if node.name else ''})"


def _slab_weight(slabs: SlabLinears) -> StackedWeight:
    """A projection over the sorted tokens' slabs as the stacked [experts, out, in]
    weight (and [experts, out] bias) the proof reads (``_sorted_dispatch.py``)."""
    first = slabs.linears[0]  # the projection's place in graph order

    def value(array):
        return ir.Value(name=f"{first.name}_stacked", const_value=ir.tensor(array))

    bias = None if slabs.bias is None else value(slabs.bias)
    return StackedWeight(slabs.split, value(slabs.weight), first, True, bias)


def _reads_router_only(node: ir.Node, block: tuple[set[int], set[int]], output: ir.Value) -> bool:
    """Whether what ``node`` reads of the block (``block``: its nodes, and the router's own
    values, computed from the logits alone, which the rewrite keeps) is the router's own
    values or the block's output, as a shared expert reads its gate."""
    inside, own = block
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        if producer is None or id(producer) not in inside or value is output:
            continue
        if id(value) not in own:
            return False
    return True


def _absorbed(
    nodes: list[ir.Node], router: list[ir.Node], output: ir.Value, values: tuple[set, set]
) -> tuple[list[ir.Node], list[ir.Value]] | str:
    """The block's nodes that nothing outside it reads (the others stay: a Shape of the
    hidden states the layer reads again), and the router's own values read outside
    (``Block.kept``). Any other node computed from the router's choice must be among
    them: the fused op does not give its value."""
    routed, own = values
    matched = {id(n) for n in router}
    absorbed = {id(n): n for n in nodes if id(n) not in matched}
    kept: dict[int, ir.Value] = {}
    changed = True
    while changed:
        changed = False
        for key, node in list(absorbed.items()):
            value = _read_outside(node, absorbed.keys() | matched, output, kept)
            if value is None:
                continue
            if id(value) in own and not value.is_graph_output():
                kept[id(value)] = value  # the rewrite's copy of the router gives it
                changed = True
                continue
            if id(value) in routed or any(id(v) in routed for v in node.outputs):
                return (
                    f"{value.name!r}, computed from the router's choice, is also read "
                    "outside the block"
                )
            del absorbed[key]
            changed = True
    inside = absorbed.keys() | matched
    for node in router:  # the matched nodes go whatever is read of them
        for value in node.outputs:
            if id(value) in own and any(id(u.node) not in inside for u in value.uses()):
                kept[id(value)] = value
    return [n for n in nodes if id(n) in absorbed], list(kept.values())


def _read_outside(
    node: ir.Node, inside: set[int], output: ir.Value, known: dict[int, ir.Value] | None = None
) -> ir.Value | None:
    """An output of ``node`` (other than the block's output and those ``known``) read by
    a node not in ``inside``, or a graph output; None if there is none."""
    for value in node.outputs:
        if value is output or (known is not None and id(value) in known):
            continue
        if value.is_graph_output():
            return value
        # every use, a node out of the graph's too: the rewrite may not drop what one reads
        if any(id(use.node) not in inside for use in value.uses()):
            return value
    return None
