"""Rules ``identity_reshape``, ``identity_slice`` and ``identity_zero_add``: a Reshape to
its input's own shape, a Slice (forward steps) that keeps its input's whole shape, and
an Add of zeros that does not broadcast the other operand larger, are no ops.

Exporters write them where the source reshapes "to the same view" (Falcon's
``transpose(1, 2).reshape(batch, heads, q_len, head_dim)``, SDPA's reshape of
``P @ V``), from shapes read at run time, so constant folding keeps them, and every
pattern through that place would need a copy with the Reshape and one without. A
Reshape is proven to keep its input's shape by its own target (``_ends_in``): each
entry the input's size on that axis as the graph proves it (``fusion_core.sizes``), a
0 that copies it, at most one -1 for the rest; or every dimension of both is the same
number. Never by a symbol an inference put on the values: onnxruntime's symbolic
inference merges symbols it cannot compare, so a sequence padded to a multiple of a
chunk and viewed in chunks can read ``sequence`` before and after a Reshape that
changes it.

The Slice is the eager attention's ``causal_mask[:, :, :, : key.shape[-2]]`` of a mask
built as long as the keys already (optimum's KV-cache exports): with the Slice between
them the mask's builder (``Where(allowed, 0, lowest)``) is hidden from the rewriter
that reads it. A Slice is proven whole by its own bounds (start 0, step 1, an end that
is the input's own size on each axis it names), never by the shape inferred for its
output (``_whole_slice`` says why).

The zero Add is ``torch.baddbmm(zeros, q, k^T, beta=1, alpha=1 / norm)`` (GPT-NeoX-
Japanese: dynamo's ``Expand(0, [B * N, S, T])``, TorchScript's ``ConstantOfShape(..) *
beta``), which hides the scores' scale from the attention pattern. ``x + 0 = x`` for
every number. The zeros (a constant all zero, ``ConstantOfShape`` of one, an ``Expand``
of zeros, zeros times a finite constant) must be proven no larger than ``x`` on any axis
(``_fits``: each size ``x``'s own there, proven from the graph by ``fusion_core.sizes``,
or 1; no more axes), or the Add broadcasts ``x`` to a larger shape and stays. Not an Add
a rule inserted (``norm_spelling`` writes a missing epsilon as ``+ 0``). It runs after
``blend_mask``, which reads ``w * b + c * (1 - b)`` whole where ``1 - b`` is all zero.

The one value it changes is a zero's sign: ``-0 + 0`` is ``+0`` in IEEE arithmetic, and
without the Add ``x``'s ``-0`` goes on as ``-0``. The two are equal numbers (every
comparison, the check's included, and every op but a division by them, ``Div``,
``Reciprocal`` or a negative ``Pow``, gives equal results for them), and the source
wrote the zeros as "no bias", not to clear a sign (a fused attention adds no zeros
either), so the rule takes that.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._contexts import HEADS_RULE
from autofusion.fusion_core.canonical._head_split import MERGE, SPLIT
from autofusion.fusion_core.ir import constant_tensor
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import ONE, Size, SizeProof, axis_size, entries, read_sizes

__all__ = ["all_zero", "drop_identity_reshapes", "drop_identity_slices", "drop_zero_adds"]

_ONNX = ("", "ai.onnx")
_WHOLE = 2**31 - 1  # an end this large is "to the end" (torch writes INT64_MAX)
_COPY, _REST = Size((), 0), Size((), -1)  # a Reshape target's 0 (allowzero 0) and -1
_MAX_ZEROS = 1 << 16  # a constant read to see it is all zeros: not a weight


def drop_identity_reshapes(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass every Reshape proven to keep its input's shape, and every Reshape of a
    Reshape proven to give back the first one's input shape; how many."""
    del fresh_name  # it inserts nothing
    proof = SizeProof()  # one walk for the graph's many targets read from one residual
    alone = _bypass(graph, lambda node: _reshape_to_own_shape(node, proof, mark))
    return alone + _bypass_pairs(graph, mark, proof)


def _reshape_to_own_shape(node: ir.Node, proof: SizeProof, mark: str) -> bool:
    """A Reshape proven to keep its input's shape. Not one another rule inserted and
    finds again to undo what no fusion took (``position_scale``'s factor as rows, a
    Reshape to ``[1, -1, 1]`` of a factor laid out so already), but ``head_split``'s
    merges and splits may go (its undo takes back the pairs still there)."""
    inserted = node.metadata_props.get(mark)
    if node.op_type != "Reshape" or (inserted and inserted not in (MERGE, SPLIT)):
        return False
    return _ends_in(node, node.inputs[0], proof)


def _bypass_pairs(graph: ir.Graph, mark: str, proof: SizeProof) -> int:
    """A Reshape keeps the row-major order of the elements, so two in a row that end in
    the first one's input shape give back that input: here the fold of the heads into
    the batch and its unfold (``[B, N, S, H]`` to ``[B * N, S, H]`` and back, what
    ``heads_in_batch`` leaves between a Softmax and a product). Other pairs stay: the
    pairs a rule inserts on purpose (marked: ``head_split``'s merge and split,
    ``context_heads``'; dropping them, the rule would insert them again each round and
    the canonical form would never settle), and the steps of
    spellings later rules read whole (dynamo's K^T through a 3-D Reshape). The second
    one's target is proven to be the first one's input shape, as for one Reshape."""
    dropped = 0
    for node in list(graph):
        if node.graph is not graph or node.op_type != "Reshape" or node.domain not in _ONNX:
            continue
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        if inner is None or inner.op_type != "Reshape" or inner.domain not in _ONNX:
            continue
        if _kept_pair(node.metadata_props.get(mark), inner.metadata_props.get(mark)):
            continue  # a rule's own pair (head_split's, context_heads'): its undo reads it
        source, out = inner.inputs[0], node.outputs[0]
        if source is None or out.is_graph_output() or not _ends_in(node, source, proof):
            continue
        if len(source.shape) != 4 or inner.outputs[0].shape is None:  # type: ignore[arg-type]
            continue  # only the heads' fold [B, N, S, H] -> [B * N, S, H] and its unfold:
        if len(inner.outputs[0].shape) != 3:  # other pairs are steps later rules read
            continue
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        if not inner.outputs[0].uses() and not inner.outputs[0].is_graph_output():
            graph.remove(inner, safe=True)
        dropped += 1
    return dropped


def _kept_pair(*marks: str | None) -> bool:
    """Whether a Reshape pair is one a rule inserts on purpose and reads again:
    ``head_split``'s merge and split, ``context_heads``' (whose every size may be a
    number: taken out, it would be put back each run). Pairs other rules leave, such as
    ``heads_in_batch``'s fold and unfold, may go."""
    return any(m in (MERGE, SPLIT) or (m or "").startswith(f"{HEADS_RULE}:") for m in marks)


def _ends_in(node: ir.Node, source: ir.Value | None, proof: SizeProof) -> bool:
    """Whether the Reshape ``node`` (of ``source``, or of a Reshape of it: the same
    elements) gives ``source``'s shape, proven from its target: as many entries as
    ``source`` has axes, each ``source``'s proven size on its axis, or 0 copying a size
    proven the same (allowzero 0), or one -1 (the others equal, it is the same too); or
    every dimension of ``source`` and the output the same number.

    Not from a symbol inferred on the values: onnxruntime's symbolic inference merges
    symbols it cannot compare ("auto merge"), so a padded length ``P >= S`` viewed in
    chunks reads ``sequence`` on both sides of a Reshape that changes it."""
    if source is None or source.shape is None or len(node.inputs) < 2:
        return False
    if _same_numbers(source, node.outputs[0]):
        return True
    entries = proof.entries(node.inputs[1])
    if entries is None or len(entries) != len(source.shape):
        return False
    copies = not attribute_value(node, "allowzero", 0)
    rest = [i for i, e in enumerate(entries) if e == _REST]
    if len(rest) > 1:
        return False
    data = node.inputs[0]
    for axis, entry in enumerate(entries):
        if axis in rest:
            continue
        if entry == _COPY and copies:
            if data is not source and not _proven_equal(proof, data, source, axis):
                return False
        elif entry is None or entry != proof.size(source, axis):
            return False
    return True


def _proven_equal(proof: SizeProof, a: ir.Value | None, b: ir.Value, axis: int) -> bool:
    size = proof.size(b, axis)
    return size is not None and proof.size(a, axis) == size


def _same_numbers(a: ir.Value, b: ir.Value) -> bool:
    """Every dimension of ``a`` and ``b`` the same number (a symbol proves nothing)."""
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(isinstance(x, int) and x == y for x, y in zip(a.shape, b.shape, strict=True))


def drop_identity_slices(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass every Slice proven whole by its own bounds; how many."""
    del fresh_name, mark
    return _bypass(graph, _whole_slice)


def _whole_slice(node: ir.Node) -> bool:
    """Whether the Slice picks every element of its input in order, proven from its
    bounds: on every axis it names, step 1 (or none), start 0, and an end at least the
    input's size there: a constant as large, or a size the graph proves at least as
    large (``fusion_core.sizes``: read from the shape of a value whose size there the
    graph ties to the input's, through the ops in between).

    Not from an inferred shape, the output's or the input's: where onnxruntime's
    symbolic inference cannot decide ``end <= dim`` it treats them as equal, and it
    merges symbols it cannot compare ("auto merge": Kimi-Linear's padded length read as
    ``sequence``), so a Slice that cuts a padded length back (``rows[:, :, :S]`` of
    ``P >= S`` rows) would read as keeping its input."""
    if node.op_type != "Slice" or len(node.inputs) < 3:
        return False  # before opset 10 the bounds are attributes: not exported any more
    source = node.inputs[0]
    starts, ends = entries(node.inputs[1]), read_sizes(node.inputs[2])
    if source is None or source.shape is None or starts is None or ends is None:
        return False
    if len(starts) != len(ends):
        return False
    rank = len(source.shape)
    axes = entries(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    axes = list(range(len(starts))) if axes is None and len(node.inputs) <= 3 else axes
    steps = entries(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    if axes is None or len(axes) != len(starts) or (steps is not None and set(steps) != {1}):
        return False
    for axis, start, end in zip(axes, starts, ends, strict=True):
        if axis is None or not -rank <= axis < rank or start != 0:
            return False
        if not _reaches(end, axis_size(source, axis)):
            return False
    return True


def _reaches(end: Size | None, size: Size | None) -> bool:
    """Whether a Slice's ``end`` is at least the input's proven ``size`` on its axis."""
    if end is None:
        return False
    if end.value is not None and end.value >= _WHOLE:
        return True
    if size is None or end.atoms != size.atoms:
        return False
    return end.constant >= size.constant


def drop_zero_adds(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass every Add of zeros proven not to broadcast its other operand larger (the
    other operand goes on in its place) on the way to a Softmax (attention scores:
    ``baddbmm``'s ``beta * zeros``); how many. Not an Add a rule inserted
    (``norm_spelling``'s epsilon of 0, ``+ 0``, which it would insert again), and not
    elsewhere: an Add of zeros may be part of a spelling another recognizer reads whole
    (a mixture of experts' ``index_add`` starts its sum from zeros; dropping that Add
    moved the experts' block end past the residual: Qwen3-MoE's MoE 2 -> 0)."""
    del fresh_name  # it inserts nothing
    proof = SizeProof()
    dropped = 0
    for node in list(graph):
        if node.op_type != "Add" or node.domain not in _ONNX or len(node.inputs) != 2:
            continue
        if node.metadata_props.get(mark):
            continue
        out = node.outputs[0]
        if out.is_graph_output() or not _into_softmax(out):
            continue
        for zeros, other in (node.inputs, reversed(node.inputs)):
            if all_zero(zeros) and _fits(proof, zeros, other):  # type: ignore[arg-type]
                out.replace_all_uses_with(other)  # type: ignore[arg-type]
                graph.remove(node, safe=True)
                dropped += 1
                break
    return dropped


_SCORE_STEPS = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Tanh"})


def _into_softmax(value: ir.Value) -> bool:
    """Whether a Softmax reads ``value`` through a few score steps, each the one reader
    (a scale, a mask, a soft-cap, the heads unfolded from the batch)."""
    for _ in range(6):
        readers = [use.node for use in value.uses()]
        if len(readers) != 1:
            return False
        if readers[0].op_type == "Softmax":
            return True
        if readers[0].op_type not in _SCORE_STEPS:
            return False
        value = readers[0].outputs[0]
    return False


def all_zero(value: ir.Value | None) -> bool:
    """A tensor of zeros: a small constant all zero, ``ConstantOfShape`` of a zero (its
    default value is a float 0), or an ``Expand`` of zeros, or zeros times a finite
    constant (TorchScript's ``beta * zeros``: ``0 * c`` is a zero for finite ``c``)."""
    if value is None:
        return False
    node = value.producer()
    if node is not None and node.domain in _ONNX and node.op_type == "Expand":
        return all_zero(node.inputs[0])
    if node is not None and node.domain in _ONNX and node.op_type == "Mul":
        return any(
            all_zero(a) and _finite(b)
            for a, b in (node.inputs, reversed(node.inputs))  # type: ignore[misc]
        )
    if node is not None and node.domain in _ONNX and node.op_type == "ConstantOfShape":
        fill = node.attributes.get("value")
        return fill is None or not fill.value.numpy().any()
    tensor = constant_tensor(value)
    if tensor is None or tensor.size > _MAX_ZEROS:
        return False
    return not tensor.numpy().any()


def _finite(value: ir.Value | None) -> bool:
    tensor = constant_tensor(value)
    if tensor is None or tensor.size > _MAX_ZEROS:
        return False
    array = tensor.numpy()
    return array.dtype.kind in "iub" or (array.dtype.kind == "f" and bool(np.isfinite(array).all()))


def _fits(proof: SizeProof, zeros: ir.Value | None, other: ir.Value | None) -> bool:
    """Whether ``zeros`` broadcasts into ``other``'s shape: no more axes, and each of its
    sizes 1 or ``other``'s proven size on the axis it aligns with."""
    if zeros is None or other is None or zeros.shape is None or other.shape is None:
        return False
    shift = len(other.shape) - len(zeros.shape)
    if shift < 0:
        return False
    for axis in range(len(zeros.shape)):
        size = proof.size(zeros, axis)
        if size is None or (size != ONE and size != proof.size(other, axis + shift)):
            return False
    return True


def _bypass(graph: ir.Graph, kind: Callable[[ir.Node], bool]) -> int:
    dropped = 0
    for node in list(graph):
        if node.domain not in _ONNX or not kind(node):
            continue
        source, out = node.inputs[0], node.outputs[0]
        if source is None or out.is_graph_output():
            continue
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        dropped += 1
    return dropped
