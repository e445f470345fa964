"""Rule ``one_bias``: the scores take one additive bias, however many the model adds.

T5 adds its relative position bias and then the mask, ``(scores + position) + mask``;
ALiBi models add their slopes and the mask the same way; Funnel adds a positional
score, a token-type score and its mask, ``((scores + p) + t) + mask``. The attention
patterns read one ``Add(scores, bias)`` before the Softmax, so a chain of any length is
folded to one bias, the biases summed in the graph's order::

    Add(Add(Add(scores, b1), b2), b3)  ->  Add(scores, Add(Add(b1, b2), b3))

Each bias is one of three kinds, and what the regrouping rounds follows from them:

* an *absorbing mask*: ``Where(c, 0, negative)`` with ``negative`` -inf or at most
  -1e30, or BERT's ``(1 - Cast(m, float)) * negative`` of an integer ``m`` (0 where m
  is 1, else at least ``|negative|`` or infinite). Where it is 0 both sides add the
  same numbers; elsewhere it absorbs them on both sides (a score or a bias would need
  to exceed 1e31 to round otherwise);
* a *finite mask*: the same forms with a finite fill ``f`` between -1e30 and -104
  (Funnel's -1e6, BERT's -1e4; a fill above -104 never absorbs: a general bias), one
  to a chain and no absorbing mask beside it. It counts only where the rest of the row
  is proven small: ``|scores + other biases| <= B`` (``score_bound``, ``element_bound``) with
  ``2 B + 104 < -f``. Then in every row with a kept key the masked keys hold at most
  ``B + f`` on both sides, more than 104 below the kept key's ``-B``: ``exp`` of the
  difference is below float32's smallest subnormal, so they weigh exactly 0 either way.
  Rows with no kept key (a sequence all padding, or ``m`` outside {0, 1}) hold
  ``s + k f`` on both sides, each side rounded to units of ``|k f|`` as the graph
  itself rounds it there. Where ``B`` is unknown or too large the chain stays;
* a *general bias* (a position or token-type score, ALiBi's slopes), any other value
  of the scores' type that is not a constant holding an infinity or a NaN. Two or more
  of them regrouped round differently from the graph: each sum is within half a unit
  in the last place of the magnitudes summed, so the logits differ by a few units in
  the last place of the scores' magnitude, which the fused op (it adds its
  ``attention_bias`` to the scaled scores) rounds anyway, as ``scale_to_scores`` does.

A chain of absorbing masks and at most one general bias is exact; any other chain that
folds is marked, and ``undo_biases`` writes it back in the graph's order where no fusion
took it (exact: the same sums again). A chain stays where an intermediate sum is read
elsewhere or is a graph output; a Cast of a sum to its own type (TorchScript's
``attn_score.float()``) is the identity and goes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import INTEGER_TYPES, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.canonical._score_bounds import element_bound, score_bound
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "biases_summed", "undo_biases"]

RULE = "one_bias"
_ONNX = ("", "ai.onnx")
_MASKED = -1e30
_UNDERFLOW = 104.0  # exp(-104) is below float32's smallest subnormal (1.4e-45)
_ROUNDING = 1.05  # the sums of the bounds, rounded in float32 (as _score_bounds)
_LONGEST = 8  # biases in one chain
_THROUGH = frozenset({"Expand", "Identity", "Slice", "Unsqueeze"})
_INTEGERS = INTEGER_TYPES
_SUMMED = "autofusion.canonical.one_bias.summed"  # on the Adds that sum the biases
_ROUNDS = "autofusion.canonical.one_bias.rounds"  # on an Add whose regroup rounds


def biases_summed(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Fold each chain of biases added to attention scores into one bias, where the
    regrouping is exact or rounds as the module says; how many chains."""
    done = 0
    for outer in reversed(list(graph)):  # the last Add of a chain first: its longest form
        if outer.graph is not graph:
            continue  # an inner Add of a chain already folded
        found = _chain(outer)
        if found is None or (rounds := _regroup_rounds(*found[:2])) is None:
            continue
        scores, biases, inner = found
        written, total = [], biases[0]
        for bias in biases[1:]:
            node = ir.Node("", "Add", [total, bias], name=fresh_name(f"{RULE}_biases"))
            node.outputs[0].name = fresh_name(f"{RULE}_bias")
            node.outputs[0].dtype = scores.dtype
            node.outputs[0].shape = _broadcast(total.shape, bias.shape, outer.outputs[0].shape)
            node.metadata_props[_SUMMED] = "1"
            written.append(node)
            total = node.outputs[0]
        added = ir.Node("", "Add", [scores, total], name=fresh_name(f"{RULE}_Add"))
        added.outputs[0].name = fresh_name(f"{RULE}_scores")
        added.outputs[0].dtype = outer.outputs[0].dtype
        added.outputs[0].shape = outer.outputs[0].shape
        if rounds or any(n.metadata_props.get(_ROUNDS) for n in inner):  # a fold folded again
            added.metadata_props[_ROUNDS] = "1"
        replace(graph, outer, [*written, added], mark, RULE)
        for node in inner:  # outermost first: each is read by the one removed before it
            if not node.outputs[0].uses():
                graph.remove(node, safe=True)
        done += 1
    return done


def undo_biases(graph: ir.Graph, mark: str) -> int:
    """Write back, in the graph's own order, each chain whose regroup rounds and that no
    fusion took: ``Add(scores, sum of b1..bk)`` is ``(scores + b1) + ... + bk`` again
    (exact: the same sums in the same order); how many."""
    undone = 0
    for added in [n for n in graph if n.metadata_props.get(_ROUNDS) and n.op_type == "Add"]:
        scores, total = added.inputs
        biases, sums = _summed_biases(total, mark)
        if scores is None or not biases:
            continue
        written, value = [], scores
        for index, bias in enumerate(biases):
            node = ir.Node("", "Add", [value, bias], name=f"{added.name}_back_{index}")
            node.outputs[0].dtype = added.outputs[0].dtype
            node.outputs[0].name = f"{added.outputs[0].name}_back_{index}"
            node.outputs[0].shape = _broadcast(value.shape, bias.shape, added.outputs[0].shape)
            written.append(node)
            value = node.outputs[0]
        value.shape = added.outputs[0].shape
        graph.insert_before(added, written)
        added.outputs[0].replace_all_uses_with(value, replace_graph_outputs=True)
        graph.remove([added, *sums], safe=True)
        undone += 1
    return undone


def _summed_biases(total: ir.Value | None, mark: str) -> tuple[list[ir.Value], list[ir.Node]]:
    """The biases a left fold of this rule's Adds sums, in order, and those Adds
    (outermost first); no biases where a sum is read elsewhere."""
    biases: list[ir.Value] = []
    sums: list[ir.Node] = []
    value = total
    while value is not None:
        node = value.producer()
        if (
            node is None
            or not node.metadata_props.get(_SUMMED)
            or node.metadata_props.get(mark) != RULE
        ):
            biases.insert(0, value)
            return biases, sums
        if len(value.uses()) != 1 or value.is_graph_output():
            return [], []
        sums.append(node)
        biases.insert(0, node.inputs[1])  # type: ignore[arg-type]
        value = node.inputs[0]
    return [], []


def _chain(outer: ir.Node) -> tuple[ir.Value, list[ir.Value], list[ir.Node]] | None:
    """(scores, biases in the order added, the inner Adds outermost first) of
    ``Add(...Add(Add(scores, b1), b2)..., bk)`` read by a Softmax, k >= 2; else None."""
    if not _an_add(outer) or outer.metadata_props.get(_SUMMED):
        return None
    out = outer.outputs[0]
    if out.is_graph_output() or out.dtype != ir.DataType.FLOAT or not reads_into_softmax(out):
        return None
    found = _down(outer, 0)
    if found is None or len(found[1]) < 2:
        return None
    scores, biases, inner = found
    if scores.dtype != out.dtype or any(b.dtype != scores.dtype for b in biases):
        return None
    return scores, biases, inner[1:]


def _down(node: ir.Node, depth: int) -> tuple[ir.Value, list[ir.Value], list[ir.Node]] | None:
    """(scores, biases, Adds from ``node`` down) where ``node`` adds a bias to the
    scores or to such an Add read only by it."""
    side = _scores_side(node)
    if side is not None:
        scores, bias = node.inputs[side], node.inputs[1 - side]
        return (scores, [bias], [node]) if scores is not None and bias is not None else None
    if depth >= _LONGEST:
        return None
    for index, value in enumerate(node.inputs):
        bias, casts = node.inputs[1 - index], []
        if _same_type_cast(value) is not None:  # TorchScript's attn_score.float()
            casts = [value.producer()]  # type: ignore[union-attr]
            value = _same_type_cast(value)
        inner = value.producer() if value is not None else None
        if inner is None or bias is None or not _an_add(inner) or inner.metadata_props.get(_SUMMED):
            continue
        if len(value.uses()) != 1 or value.is_graph_output():  # type: ignore[union-attr]
            continue
        found = _down(inner, depth + 1)
        if found is not None:
            return found[0], [*found[1], bias], [node, *casts, *found[2]]  # type: ignore[list-item]
    return None


def _same_type_cast(value: ir.Value | None) -> ir.Value | None:
    """The input of ``Cast(x)`` to ``x``'s own type read only once (the identity,
    exact), else None."""
    cast = value.producer() if value is not None else None
    if cast is None or cast.op_type != "Cast" or cast.domain not in _ONNX or not cast.inputs:
        return None
    source = cast.inputs[0]
    if source is None or source.dtype is None or source.dtype != value.dtype:  # type: ignore[union-attr]
        return None
    if len(value.uses()) != 1 or value.is_graph_output():  # type: ignore[union-attr]
        return None
    return source


def _an_add(node: ir.Node) -> bool:
    return node.op_type == "Add" and node.domain in _ONNX and len(node.inputs) == 2


def _regroup_rounds(scores: ir.Value, biases: list[ir.Value]) -> bool | None:
    """Whether folding ``biases`` rounds (True) or is exact (False); None where it is
    not taken: a constant bias holding an infinity or NaN that is no mask, or a finite
    mask the rest of the row is not proven too small to reach."""
    # a fill no larger than 104 could never absorb: such a Where is one more general bias
    fills = [f if (f := _mask_fill(b)) is None or f < -_UNDERFLOW else None for b in biases]
    absorbing = [f is not None and f <= _MASKED for f in fills]
    finite = [f for f in fills if f is not None and f > _MASKED]
    for bias, fill in zip(biases, fills, strict=True):
        constant = constant_array(bias)
        if fill is None and constant is not None and not np.all(np.isfinite(constant)):
            return None
    if finite:
        if len(finite) > 1 or any(absorbing):
            return None  # one finite mask, bounded against all the rest
        bound = _rest_bound(scores, [b for b, f in zip(biases, fills, strict=True) if f is None])
        if bound is None or 2 * bound + _UNDERFLOW >= -finite[0]:
            return None
        return True  # rows with no kept key round at the fill's magnitude, as the graph
    return absorbing.count(False) >= 2


def _rest_bound(scores: ir.Value, others: list[ir.Value]) -> float | None:
    """A proven bound on ``|scores + sum(others)|``, else None."""
    total = score_bound(scores)
    for value in others:
        part = element_bound(value)
        if total is None or part is None:
            return None
        total += part
    return None if total is None else total * _ROUNDING


def _scores_side(add: ir.Node) -> int | None:
    """Which input of ``add`` is attention scores: ``Q @ K^T`` of rank 4, or it times or
    divided by a scalar constant (the scale)."""
    for index, value in enumerate(add.inputs):
        producer = value.producer() if value is not None else None
        if producer is not None and producer.op_type in ("Mul", "Div"):
            scaled, factor = producer.inputs[0], producer.inputs[1]
            if producer.op_type == "Mul" and _scalar(scaled):
                scaled, factor = factor, scaled
            if not _scalar(factor) or scaled is None:
                continue
            producer = scaled.producer()
        if (
            producer is not None
            and producer.op_type == "MatMul"
            and producer.outputs[0].shape is not None
            and len(producer.outputs[0].shape) == 4
        ):
            return index
    return None


def _scalar(value: ir.Value | None) -> bool:
    constant = constant_array(value)
    return constant is not None and constant.size == 1


def _mask_fill(value: ir.Value) -> float | None:
    """The fill ``f`` of a mask, through the ops that only re-view it: ``Where(c, 0,
    f)`` (``f`` -inf, at most -1e30, or one negative number) or ``(1 - Cast(m)) * f``;
    None where ``value`` is not one."""
    for _ in range(4):
        producer = value.producer()
        if producer is None or producer.domain not in _ONNX:
            return None
        if producer.op_type == "Where":
            zero, negative = (constant_array(v) for v in producer.inputs[1:3])
            if zero is None or negative is None or not np.all(zero == 0) or negative.size == 0:
                return None
            if np.all(negative <= _MASKED) or (negative.size == 1 and np.isfinite(negative)):
                fill = float(np.max(negative))
                return fill if fill < 0 else None
            return None
        if producer.op_type == "Mul":
            return _integer_float_mask(producer)
        if producer.op_type not in _THROUGH or producer.inputs[0] is None:
            return None
        value = producer.inputs[0]
    return None


def _integer_float_mask(mul: ir.Node) -> float | None:
    """``f`` of ``(1 - Cast(m, float)) * f`` of an integer (or boolean) ``m``, the Cast
    perhaps re-viewed (Unsqueeze, Expand) before the Sub: BERT's mask, 0 where ``m`` is
    1 and a whole multiple of ``f`` anywhere else (infinite for an infinite ``f``)."""
    for inverted, fill in (mul.inputs, reversed(mul.inputs)):
        negative = constant_array(fill)
        sub = inverted.producer() if inverted is not None else None
        if negative is None or negative.size != 1 or not negative.item() < 0:
            continue
        if sub is None or sub.op_type != "Sub" or not _scalar(sub.inputs[0]):
            continue
        one = constant_array(sub.inputs[0])
        cast = _through_views(sub.inputs[1])
        if one is None or one.item() != 1 or cast is None or cast.op_type != "Cast":
            continue
        source = cast.inputs[0]
        if source is not None and source.dtype in _INTEGERS:
            return float(negative.item())
    return None


def _through_views(value: ir.Value | None) -> ir.Node | None:
    """The producer of ``value`` past the ops that only re-view it (Funnel's
    ``1 - Unsqueeze(Cast(m))``: the mask made ``[B, 1, 1, L]`` before it is inverted)."""
    for _ in range(4):
        producer = value.producer() if value is not None else None
        if producer is None or producer.op_type not in _THROUGH or producer.domain not in _ONNX:
            return producer
        value = producer.inputs[0]
    return None


def _broadcast(a: ir.Shape | None, b: ir.Shape | None, scores: ir.Shape | None) -> ir.Shape | None:
    """The shape numpy's broadcasting gives the sum of two biases of ``scores``, where
    each dimension is known.

    Where the two dimensions are not known to agree, one of them being the scores' own
    decides it: the graph adds the biases to the scores, which works only where each
    bias's dimension is 1 or the scores', so their sum's is the scores' (MPT's ALiBi,
    a table sliced to ``128 - Max(0, 128 - L)`` keys, beside a mask of ``L`` keys)."""
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    dims_a = [1] * (rank - len(a)) + list(a)
    dims_b = [1] * (rank - len(b)) + list(b)
    like = list(scores)[-rank:] if scores is not None and len(scores) >= rank else [None] * rank
    out = []
    for x, y, s in zip(dims_a, dims_b, like, strict=True):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif s is not None and s != 1 and (x == s or y == s):
            out.append(s)
        else:
            return None  # unknown or symbolic against a different dimension
    return ir.Shape(out)
