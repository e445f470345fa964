"""Rule ``per_head_norm``: a LayerNorm of each head, with weights of its own, as one
LayerNorm of every head and the heads' weights after it.

StableLM's ``qk_layernorm`` normalizes each head of q and k with a LayerNorm of its own
(``nn.ModuleList`` of N LayerNorms over the head size): both torch exporters write it as
a Split of the heads ``[B, N, S, H]`` into N parts, one LayerNormalization each, and a
Concat of the results. A LayerNorm over the last axis normalizes each row alone, so::

    Concat_i(LayerNorm(Split(x, axis=1)_i, w_i, b_i), axis=1)
      == LayerNorm(x, 1, 0) * W + B            W, B: [N, 1, H], row i = w_i, b_i

and where ``x`` is the head Transpose ``Transpose(y, [0, 2, 1, 3])`` of ``y: [B, S, N, H]``
read by the Split alone, the same on ``y`` with ``W, B: [N, H]`` and the Transpose after:
the per-head ops then sit between the head split and its Transpose, where ``head_split``
makes the head split the rotary and attention patterns read. One LayerNorm kernel in
place of N (and a Split and a Concat): no undo. The values are those of the N
LayerNorms up to the rounding of the scale and bias applied after the normalization
instead of inside the kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import by_op_type, replace
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "per_head_norms"]

RULE = "per_head_norm"
_HEAD_PERM = [0, 2, 1, 3]


def per_head_norms(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rewrite every Concat of per-head LayerNorms of a head Split; how many."""
    return by_op_type(graph, {"Concat": lambda node: _one_norm(graph, node, fresh_name, mark)})


def _one_norm(graph: ir.Graph, concat: ir.Node, fresh_name, mark: str) -> int:
    found = _heads_normed(concat)
    if found is None:
        return 0
    split, norms, weights, biases = found
    x = split.inputs[0]
    assert x is not None
    turn = x.producer()
    before = (
        turn is not None
        and turn.op_type == "Transpose"
        and list(attribute_value(turn, "perm", []) or []) == _HEAD_PERM
        and len(x.uses()) == 1
        and not x.is_graph_output()
    )
    source = turn.inputs[0] if before and turn is not None else x
    # [N, 1, H] broadcasts over [B, N, S, H]; [N, H] over [B, S, N, H]
    shape = (len(norms), weights.shape[-1]) if before else (len(norms), 1, weights.shape[-1])

    def constant(hint: str, array: np.ndarray) -> ir.Value:
        value = ir.Value(name=fresh_name(hint), const_value=ir.tensor(array))
        value.dtype, value.shape = ir.DataType.from_numpy(array.dtype), ir.Shape(array.shape)
        return value

    ones = constant("per_head_norm_ones", np.ones(weights.shape[-1], weights.dtype))
    attrs = list(norms[0].attributes.values())
    norm = ir.Node("", "LayerNormalization", [source, ones], attrs, name=fresh_name(RULE))
    scale = constant("per_head_scale", weights.reshape(shape))
    new = [norm, ir.Node("", "Mul", [norm.outputs[0], scale])]
    if np.any(biases != 0):
        bias = constant("per_head_bias", biases.reshape(shape))
        new.append(ir.Node("", "Add", [new[-1].outputs[0], bias]))
    if before:
        new.append(ir.Node("", "Transpose", [new[-1].outputs[0]], turn.attributes.values()))  # type: ignore[union-attr]
    for node in new:
        node.outputs[0].dtype = x.dtype
        node.outputs[0].shape = source.shape
    new[-1].outputs[0].shape = concat.outputs[0].shape
    replace(graph, concat, new, mark, RULE)
    graph.remove([*norms, split, *([turn] if before else [])], safe=True)
    return 1


def _heads_normed(concat: ir.Node):
    """(the Split, the norms, the weights [N, H], the biases [N, H]) of a Concat on axis 1
    of LayerNorms over the last axis of each one-head part of a Split on axis 1, in order;
    None where it is not that."""
    dims = known_dims(concat.outputs[0])
    if dims is None or len(dims) != 4 or attribute_value(concat, "axis", 0) % 4 != 1:
        return None
    if concat.outputs[0].is_graph_output():  # its name is the model's: left as it is
        return None
    norms = [v.producer() if v is not None else None for v in concat.inputs]
    if len(norms) < 2 or any(not _a_norm_read_once(n, concat) for n in norms):
        return None
    split = norms[0].inputs[0].producer()  # type: ignore[union-attr]
    if split is None or split.op_type != "Split" or split.domain not in ("", "ai.onnx"):
        return None
    if attribute_value(split, "axis", 0) % 4 != 1 or len(split.outputs) != len(norms):
        return None
    parts = [n.inputs[0] for n in norms]  # type: ignore[union-attr]
    if parts != list(split.outputs) or any(len(p.uses()) != 1 for p in parts):
        return None
    if any((known_dims(p) or [0, 0])[1] != 1 for p in parts):
        return None
    if len({_settings(n) for n in norms}) != 1:  # type: ignore[arg-type]
        return None
    weights = [constant_array(n.inputs[1]) for n in norms]  # type: ignore[union-attr]
    biases = [_bias(n) for n in norms]  # type: ignore[arg-type]
    if any(w is None or w.ndim != 1 for w in weights) or any(b is None for b in biases):
        return None
    if len({w.shape for w in weights} | {b.shape for b in biases}) != 1:  # type: ignore[union-attr]
        return None
    return split, norms, np.stack(weights), np.stack(biases)  # type: ignore[arg-type]


def _a_norm_read_once(node: ir.Node | None, concat: ir.Node) -> bool:
    if node is None or node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
        return False
    if attribute_value(node, "axis", -1) not in (-1, 3) or len(node.inputs) < 2:
        return False
    out = node.outputs[0]
    extra_used = any(o.uses() or o.is_graph_output() for o in node.outputs[1:])
    return not extra_used and not out.is_graph_output() and [u.node for u in out.uses()] == [concat]


def _settings(norm: ir.Node) -> tuple:
    return (
        float(attribute_value(norm, "epsilon", 1e-5)),
        int(attribute_value(norm, "stash_type", 1)),
        attribute_value(norm, "axis", -1) % 4,
    )


def _bias(norm: ir.Node) -> np.ndarray | None:
    """The norm's constant bias (zeros without one), None if not a constant."""
    weight = constant_array(norm.inputs[1])
    if len(norm.inputs) < 3 or norm.inputs[2] is None:
        return None if weight is None else np.zeros_like(weight)
    return constant_array(norm.inputs[2])
