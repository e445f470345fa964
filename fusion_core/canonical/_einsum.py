"""Rule ``einsum_matmul``: a two-operand Einsum that is one batched dot product is
written as Transposes and a MatMul.

Funnel writes its attention scores and context as ``Einsum("bind,bjnd->bnij", q, k)``
and ``Einsum("bnij,bjnd->bind", p, v)``; the attention pattern reads MatMuls of heads
laid out ``[B, N, S, H]``. An equation qualifies when it has no ellipsis, no index twice
in one term, and each index is one of

* batch: in both operands and the output;
* contracted: in both operands, not in the output (exactly one such index);
* free: in one operand and the output (at least one per operand).

With ``A`` and ``B`` transposed so that ``A' = [a.., batch.., i, k]`` and
``B' = [b.., batch.., k, j]`` (``i``, ``j`` each operand's free index that comes last
in the output, ``a..``, ``b..`` its other free indices, ``k`` the contracted one)::

    Einsum(A, B)[out] = Transpose(MatMul(A', B'), perm),
    MatMul(A', B')[a.., b.., batch.., i, j] = sum_k A'[.., i, k] * B'[.., k, j]

where ``b..`` reach ``A'`` as unit axes (an Unsqueeze, only where both operands have
other free indices) and ``a..`` reach ``B'`` by MatMul's broadcast of missing leading
axes (https://onnx.ai/onnx/operators/onnx__MatMul.html, numpy's ``matmul``). Batch and
free indices keep the output's order, so the attention Einsums need no Transpose after
the MatMul but the context's head merge ``[0, 2, 1, 3]``. The sums are the same; only
the order of one dot product's additions may differ (float rounding), as between two
Einsum kernels (https://onnx.ai/onnx/operators/onnx__Einsum.html).

Where no fusion took the MatMul, the chain is written back as the Einsum
(``undo_einsums``): an Einsum that is no attention's (Mamba's state-space scan in
Granite-4 and Bamba: five of them a layer) would otherwise come out as up to four nodes
where one stood, and a small decode step pays for each launch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s, take_place
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["RULE", "Plan", "einsum_plan", "einsums_as_matmuls", "undo_einsums"]

RULE = "einsum_matmul"
_ONNX = ("", "ai.onnx")
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE})
_UNSQUEEZE_INPUTS = 13  # the opset from which Unsqueeze takes its axes as an input
_EQUATION = "autofusion.einsum"  # on the chain's last node: the equation it computes


@dataclass(frozen=True)
class Plan:
    """How an equation is computed: each operand's Transpose (None: as it is), the unit
    axes inserted into the first operand, and the Transpose of the product."""

    first: list[int] | None
    unit_axes: list[int]
    second: list[int] | None
    product: list[int] | None


def einsum_plan(equation: str) -> Plan | str:
    """The plan of ``equation``, or why it is not one batched dot product."""
    terms = _terms(equation)
    if isinstance(terms, str):
        return terms
    a, b, out = terms
    batch = [c for c in out if c in a and c in b]
    summed = [c for c in a if c in b and c not in out]
    free_a = [c for c in out if c in a and c not in b]
    free_b = [c for c in out if c in b and c not in a]
    alone = [c for c in a + b if c not in out and not (c in a and c in b)]
    if alone:
        return f"index {alone[0]!r} is summed over one operand alone"
    if len(summed) != 1:
        return f"{len(summed)} contracted indices, not one"
    if not free_a or not free_b:
        return "an operand has no free index"
    laid_a = free_a[:-1] + batch + [free_a[-1]] + summed
    laid_b = free_b[:-1] + batch + summed + [free_b[-1]]
    extra_a, extra_b = len(free_a) - 1, len(free_b) - 1
    # b.. reach A' as unit axes only where A' has axes of its own in front of them
    units = list(range(extra_a, extra_a + extra_b)) if extra_a else []
    product = free_a[:-1] + free_b[:-1] + batch + [free_a[-1], free_b[-1]]
    return Plan(
        _perm([a.index(c) for c in laid_a]),
        units,
        _perm([b.index(c) for c in laid_b]),
        _perm([product.index(c) for c in out]),
    )


def einsums_as_matmuls(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every qualifying two-operand Einsum as Transposes and a MatMul; how many."""
    done = 0
    for node in list(graph):
        if node.op_type != "Einsum" or node.domain not in _ONNX or node.graph is not graph:
            continue
        if len(node.inputs) != 2 or None in node.inputs:
            continue
        if node.outputs[0].dtype not in _FLOATS:
            continue  # MatMul takes fewer types than Einsum
        plan = einsum_plan(str(attribute_value(node, "equation", "")))
        if isinstance(plan, str) or not _ranks_agree(node):
            continue
        _write(graph, node, plan, fresh_name, mark)
        done += 1
    return done


def _write(
    graph: ir.Graph, node: ir.Node, plan: Plan, fresh_name: Callable[[str], str], mark: str
) -> None:
    """Put the plan's nodes in ``node``'s place; its output keeps its name."""
    new: list[ir.Node] = []

    def add(op: str, inputs: list, attrs: list[ir.Attr], dims: list | None) -> ir.Value:
        made = ir.Node("", op, inputs, attrs, name=fresh_name(f"{RULE}_{op.lower()}"))
        made.metadata_props[mark] = RULE
        made.outputs[0].name = fresh_name(f"{RULE}_{op.lower()}_out")
        made.outputs[0].dtype = node.outputs[0].dtype
        made.outputs[0].shape = ir.Shape(dims) if dims is not None else None
        new.append(made)
        return made.outputs[0]

    first, second = node.inputs
    if plan.first is not None:
        first = add("Transpose", [first], [_perm_attr(plan.first)], _laid(first, plan.first))
    if plan.unit_axes:
        dims = _dims(first)
        for axis in plan.unit_axes:
            dims = dims[:axis] + [1] + dims[axis:] if dims is not None else None
        if graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0)) < _UNSQUEEZE_INPUTS:
            first = add("Unsqueeze", [first], [ir.AttrInt64s("axes", plan.unit_axes)], dims)
        else:
            axes = int64s(graph, fresh_name, plan.unit_axes)
            first = add("Unsqueeze", [first, axes], [], dims)
    if plan.second is not None:
        second = add("Transpose", [second], [_perm_attr(plan.second)], _laid(second, plan.second))
    out = _dims(node.outputs[0])
    product = out
    if plan.product is not None and out is not None:
        product = [None] * len(out)
        for j, p in enumerate(plan.product):  # out[j] is the product's axis p
            product[p] = out[j]
    result = add("MatMul", [first, second], [], product)
    if plan.product is not None:
        result = add("Transpose", [result], [_perm_attr(plan.product)], out)
    new[-1].metadata_props[_EQUATION] = str(attribute_value(node, "equation", ""))
    graph.insert_before(node, new)
    take_place(node.outputs[0], result)
    graph.remove(node, safe=True)


def undo_einsums(graph: ir.Graph, mark: str) -> int:
    """Write back as its Einsum every chain this rule wrote that is still whole (no
    fusion took its MatMul, no other rule changed a node of it); how many."""
    undone = 0
    for last in [n for n in graph if n.metadata_props.get(_EQUATION)]:
        found = _whole_chain(last, mark)
        if found is None:
            continue
        chain, operands = found
        equation = ir.AttrString("equation", last.metadata_props[_EQUATION])
        einsum = ir.Node("", "Einsum", operands, [equation], name=f"{last.name}_einsum")
        graph.insert_before(last, [einsum])
        einsum.outputs[0].dtype, einsum.outputs[0].shape = (
            last.outputs[0].dtype,
            last.outputs[0].shape,
        )
        take_place(last.outputs[0], einsum.outputs[0])
        for node in reversed(chain):
            graph.remove(node, safe=True)
        undone += 1
    return undone


def _whole_chain(last: ir.Node, mark: str) -> tuple[list[ir.Node], list[ir.Value]] | None:
    """The rule's nodes ending in ``last`` and the Einsum's operands, where the chain is
    still the plan of ``last``'s equation node for node (each the rule's, read only by
    the next, each Transpose with the plan's perm): then it computes the Einsum of what
    it reads, whatever value-preserving rule rewired its inputs."""
    plan = einsum_plan(last.metadata_props[_EQUATION])
    if isinstance(plan, str):
        return None
    matmul = last
    if plan.product is not None:
        perm = (
            list(attribute_value(last, "perm", []) or []) if last.op_type == "Transpose" else None
        )
        matmul = _own_producer(last.inputs[0], mark) if perm == plan.product else None
    if matmul is None or matmul.op_type != "MatMul" or matmul.metadata_props.get(mark) != RULE:
        return None
    first_steps = [("Unsqueeze", None)] if plan.unit_axes else []
    first_steps += [("Transpose", plan.first)] if plan.first is not None else []
    second_steps = [("Transpose", plan.second)] if plan.second is not None else []
    chain, operands = [matmul] + ([last] if last is not matmul else []), []
    for value, steps in zip(matmul.inputs, (first_steps, second_steps), strict=True):
        for op, perm in steps:  # from the MatMul back to the operand
            node = _step(value, mark, op, perm)
            if node is None:
                return None
            chain.insert(0, node)
            value = node.inputs[0]
        operands.append(value)
    return chain, operands


def _step(value: ir.Value | None, mark: str, op: str, perm: list[int] | None) -> ir.Node | None:
    """The rule's ``op`` (with ``perm``, for a Transpose) computing ``value``, read once."""
    node = _own_producer(value, mark)
    if node is None or node.op_type != op or node.metadata_props.get(_EQUATION):
        return None
    if op == "Transpose" and list(attribute_value(node, "perm", []) or []) != perm:
        return None
    return node


def _own_producer(value: ir.Value | None, mark: str) -> ir.Node | None:
    """The node this rule made that computes ``value``, where only one node reads it."""
    node = value.producer() if value is not None else None
    if node is None or node.metadata_props.get(mark) != RULE:
        return None
    if value.is_graph_output() or len(list(value.uses())) != 1:
        return None
    return node


def _terms(equation: str) -> tuple[str, str, str] | str:
    """The two input terms and the output term of ``equation``, or why not."""
    text = equation.replace(" ", "")
    if "." in text:
        return "an ellipsis"
    inputs, arrow, out = text.partition("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return f"{len(parts)} operands, not two"
    a, b = parts
    if not arrow:  # implicit output: the indices seen once, in alphabetical order
        out = "".join(sorted(c for c in set(a + b) if (a + b).count(c) == 1))
    for term in (a, b, out):
        if not term.isalpha() or len(set(term)) != len(term):
            return f"term {term!r} repeats an index or is empty"
    if not set(out) <= set(a + b):
        return f"output {out!r} names an index no operand has"
    return a, b, out


def _ranks_agree(node: ir.Node) -> bool:
    """Each input's rank, where known, is its term's length (else the model is invalid
    and the rule leaves it to fail as it would)."""
    terms = _terms(str(attribute_value(node, "equation", "")))
    if isinstance(terms, str):
        return False
    for value, term in zip(node.inputs, terms[:2], strict=True):
        if value is not None and value.shape is not None and len(value.shape) != len(term):
            return False
    return True


def _dims(value: ir.Value | None) -> list | None:
    return list(value.shape) if value is not None and value.shape is not None else None


def _laid(value: ir.Value | None, perm: list[int]) -> list | None:
    dims = _dims(value)
    return [dims[p] for p in perm] if dims is not None else None


def _perm_attr(perm: list[int]) -> ir.Attr:
    return ir.AttrInt64s("perm", perm)


def _perm(perm: list[int]) -> list[int] | None:
    """``perm``, or None where it is the identity (no Transpose to write)."""
    return None if perm == list(range(len(perm))) else perm
