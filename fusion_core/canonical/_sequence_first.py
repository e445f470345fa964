"""Rules ``packed_part``, ``sequence_first_heads`` and ``sequence_first_merge``:
``torch.nn.MultiheadAttention``'s sequence-first layout brought to the batch-first one
the attention patterns read.

``nn.TransformerEncoder`` (batch_first or not: its fast path transposes to [L, B, E])
projects q, k and v with one packed ``in_proj`` ([L, B, 3E]), picks each by
``Gather(Squeeze(Transpose(Unsqueeze(Reshape(qkv, [L, B, 3, E]), 0), [3, 1, 2, 0, 4]),
-2), i)``, splits heads sequence-first (``Reshape [L, B*h, d]``, ``Transpose(1, 0,
2)``, ``Reshape [B, h, L, d]``) and merges them back the same way round
(``Transpose(2, 0, 1, 3)``, ``Reshape [L*B, E]``, the ``out_proj`` Gemm, ``Reshape [L,
B, E]``, ``Transpose(1, 0, 2)``). Both torch exporters write it so. Each rule below
replaces one of those steps by the same values in the batch-first spelling:

* ``packed_part``: that Gather of part ``i`` is ``qkv[..., i*E:(i+1)*E]``;
* ``sequence_first_heads``: for x[L, B, E], ``Reshape [L, M, d]`` (M = B * E / d, b
  major: the element count fixes it), ``Transpose(1, 0, 2)``, ``Reshape [B, h, L, d]``
  is ``Transpose(Reshape(Transpose(x, [1, 0, 2]), [0, 0, h, d]), [0, 2, 1, 3])``;
* ``sequence_first_merge``: the rows of a Gemm are independent, so merging the heads
  batch-first (``Transpose(0, 2, 1, 3)``, ``Reshape [B*L, E]``), the same Gemm, and a
  ``Reshape`` to the original target with its first two entries swapped give the
  Transpose's output.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s, replace
from autofusion.fusion_core.canonical._layout_nodes import (
    Fresh,
    perm,
    producer,
    reshape,
    sandwich,
    sole_reader,
    take_place,
    transpose,
    typed,
)
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import (
    SizeProof,
    axes_of,
    entries,
    known_dims,
    proven_other,
    proven_same,
)

__all__ = [
    "packed_parts_as_slices",
    "sequence_first_heads",
    "sequence_first_merges",
]

# --- packed_part ---------------------------------------------------------------------


def packed_parts_as_slices(graph: ir.Graph, fresh: Fresh, mark: str) -> int:
    proof = SizeProof()
    done = 0
    for node in list(graph):
        found = _packed_part(node, proof)
        if found is None:
            continue
        qkv, start, stop = found
        ints = [int64s(graph, fresh, [v]) for v in (start, stop, -1)]
        piece = ir.Node("", "Slice", [qkv, *ints], name=fresh("packed_part_Slice"))
        dims = known_dims(qkv)
        typed(piece, [*dims[:-1], stop - start] if dims else None, qkv.dtype, fresh, "part")
        replace(graph, node, [piece], mark, "packed_part")
        done += 1
    return done


def _packed_part(gather: ir.Node, proof: SizeProof) -> tuple[ir.Value, int, int] | None:
    """(qkv, start, stop) when ``gather`` picks part i of a packed [L, B, P*E] projection
    as nn.MultiheadAttention does: ``P``, ``E`` and ``P*E`` numbers the graph does not
    prove otherwise, ``[L, B]`` kept by the Reshape decided by ``proven_same`` (a merge
    of ``L`` and ``B`` labels a ``[B, L, P, E]`` reinterpretation as the split)."""
    if gather.op_type != "Gather" or attribute_value(gather, "axis", 0) != 0:
        return None
    if gather.outputs[0].is_graph_output():
        return None
    index = constant_array(gather.inputs[1])
    squeeze = producer(gather.inputs[0], "Squeeze")
    transpose = producer(squeeze.inputs[0] if squeeze else None, "Transpose")
    unsqueeze = producer(transpose.inputs[0] if transpose else None, "Unsqueeze")
    reshape = producer(unsqueeze.inputs[0] if unsqueeze else None, "Reshape")
    if index is None or index.size != 1 or reshape is None:
        return None
    if axes_of(squeeze) not in ([-2], [3]) or axes_of(unsqueeze) != [0]:
        return None
    if perm(transpose) != [3, 1, 2, 0, 4]:
        return None
    qkv, parts = reshape.inputs[0], known_dims(reshape.outputs[0])
    dims = known_dims(qkv)
    if dims is None or parts is None or len(dims) != 3 or len(parts) != 4:
        return None
    count, width = parts[2], parts[3]
    if not (isinstance(count, int) and isinstance(width, int) and dims[2] == count * width):
        return None
    split = reshape.outputs[0]
    numbers = [((qkv, 2), count * width), ((split, 2), count), ((split, 3), width)]
    if any(proven_other(proof, at, n) for at, n in numbers):
        return None
    if not proven_same(proof, ((split, 0), (qkv, 0)), ((split, 1), (qkv, 1))):
        return None
    i = int(index.reshape(-1)[0]) % count
    return qkv, i * width, (i + 1) * width


# --- sequence_first_heads ------------------------------------------------------------


def sequence_first_heads(graph: ir.Graph, fresh: Fresh, mark: str) -> int:
    proof = SizeProof()
    done = 0
    for node in list(graph):
        found = _heads(node, proof)
        if found is None:
            continue
        source, heads, size, first, swap = found
        early = transpose(source, [1, 0, 2], fresh)
        dims = known_dims(early.outputs[0])
        split = reshape(
            early.outputs[0],
            int64s(graph, fresh, [0, 0, heads, size]),
            [*dims[:2], heads, size] if dims else None,
            fresh,
        )
        late = transpose(split.outputs[0], [0, 2, 1, 3], fresh)
        take_place(graph, node, [early, split, late], [swap, first], mark, "sequence_first_heads")
        done += 1
    return done


def _heads(last: ir.Node, proof: SizeProof) -> tuple[ir.Value, int, int, ir.Node, ir.Node] | None:
    """(x, h, d, first Reshape, Transpose) when ``last`` ends x[L, B, E]'s sequence-first
    head split: ``E`` and ``d`` numbers, the rest decided by ``proven_same`` (the graph's
    proof, the labels only where it cannot tell: a merge of ``L`` and ``B`` labels ``[L,
    h, B, d]`` as the split's ``[B, h, L, d]``)."""
    found = sandwich(last, [1, 0, 2], (3, 3))
    if found is None:
        return None
    first, swap, xd, fd, out = found
    x, flat, split = first.inputs[0], first.outputs[0], last.outputs[0]
    width, size = xd[2], fd[2]
    if not isinstance(width, int) or not isinstance(size, int) or width % size or len(out) != 4:
        return None
    numbers = [((x, 2), width), ((flat, 2), size), ((split, 1), width // size), ((split, 3), size)]
    if out[1] != width // size or any(proven_other(proof, at, n) for at, n in numbers):
        return None
    if not proven_same(proof, ((flat, 0), (x, 0)), ((split, 0), (x, 1)), ((split, 2), (x, 0))):
        return None
    return x, width // size, size, first, swap


# --- sequence_first_merge ------------------------------------------------------------


def sequence_first_merges(graph: ir.Graph, fresh: Fresh, mark: str) -> int:
    proof = SizeProof()
    done = 0
    for node in list(graph):
        found = _merge(node, proof)
        if found is None:
            continue
        context, width, gemm, unflat, olds = found
        merged = transpose(context, [0, 2, 1, 3], fresh)
        flat = reshape(merged.outputs[0], int64s(graph, fresh, [-1, width]), None, fresh)
        linear = ir.Node(
            gemm.domain,
            gemm.op_type,
            [flat.outputs[0], *gemm.inputs[1:]],
            [ir.Attr(a.name, a.type, a.value) for a in gemm.attributes.values()],
            name=fresh(f"{gemm.name or 'Gemm'}_batch_first"),
        )
        typed(linear, None, gemm.outputs[0].dtype, fresh, "batch_first_rows")
        known = entries(unflat.inputs[1])
        if known is not None and len(known) == 3 and None not in known:
            targets = []  # [L, B, E] fixed: [B, L, E] as a constant (known_scalars would)
            target = int64s(graph, fresh, [known[1], known[0], known[2]])
        else:
            order = int64s(graph, fresh, [1, 0, 2])
            targets = [
                ir.Node(
                    "", "Gather", [unflat.inputs[1], order], [ir.AttrInt64("axis", 0)],
                    name=fresh("sequence_first_Gather"),
                )
            ]  # fmt: skip
            target = typed(targets[0], [3], ir.DataType.INT64, fresh, "batch_first_target")
        out = reshape(linear.outputs[0], target, known_dims(node.outputs[0]), fresh)
        zero = attribute_value(unflat, "allowzero", 0)  # the target's own entries: as they were
        out.attributes["allowzero"] = ir.AttrInt64("allowzero", int(zero))
        new = [merged, flat, linear, *targets, out]
        take_place(graph, node, new, olds, mark, "sequence_first_merge")
        done += 1
    return done


def _merge(last: ir.Node, proof: SizeProof):
    """(context, E, Gemm, last Reshape, nodes to remove) when ``last`` (a Transpose(1, 0,
    2)) ends a sequence-first heads merge and out_proj Gemm: the last Reshape's ``[L, B]``
    the context's, decided by ``proven_same`` (a merge of ``L`` and ``B`` labels a ``[B,
    L, E]`` reinterpretation of the rows as the merge's ``[L, B, E]``)."""
    if last.op_type != "Transpose" or perm(last) != [1, 0, 2] or last.outputs[0].is_graph_output():
        return None
    unflat = producer(last.inputs[0], "Reshape")
    gemm = producer(unflat.inputs[0] if unflat else None, "Gemm")
    flat = producer(gemm.inputs[0] if gemm else None, "Reshape")
    swap = producer(flat.inputs[0] if flat else None, "Transpose")
    if swap is None or perm(swap) != [2, 0, 1, 3] or attribute_value(gemm, "transA", 0):
        return None
    chain = [(swap, flat), (flat, gemm), (gemm, unflat), (unflat, last)]
    if any(sole_reader(a.outputs[0]) is not b for a, b in chain):
        return None
    context = swap.inputs[0]
    cd, fd, ud = known_dims(context), known_dims(flat.outputs[0]), known_dims(unflat.outputs[0])
    if cd is None or fd is None or ud is None or len(cd) != 4 or len(fd) != 2 or len(ud) != 3:
        return None
    heads, size = cd[1], cd[3]
    if not (isinstance(heads, int) and isinstance(size, int)) or fd[1] != heads * size:
        return None
    rows = ((unflat.outputs[0], 0), (context, 2)), ((unflat.outputs[0], 1), (context, 0))
    if unflat.inputs[1] is None or not proven_same(proof, *rows):
        return None
    return context, heads * size, gemm, unflat, [unflat, gemm, flat, swap]
