"""Sizes proven from the graph's structure, never from an inferred shape.

A rewrite that relies on two sizes being equal needs them equal at every input size,
not at the ones a shape inference guessed. onnxruntime's symbolic inference
"auto-merges" symbols it cannot compare: it labelled Kimi-Linear's padded length (the
sequence rounded up to a chunk) ``sequence``, the very symbol of the unpadded length.
So ``axis_size`` follows a value back to where its size is fixed: a graph input's
declared dimension, a constant's shape, an entry of a Reshape or Expand target read
from another size (a ``-1`` entry where the other sizes cancel against the input's,
``N * batch`` against ``batch`` too),
the length of ``Range(a, b, 1)``, a Conv's or pool's window, a Pad by numbers, a Split;
through the ops that keep or move an axis (elementwise ops, whose other inputs are 1 or
the same size there, Transpose, Unsqueeze, Squeeze, Concat, Gather, MatMul, Slices of
proven bounds, reductions). What no rule ties to other sizes (a Pad by computed
amounts, Swin's windows) is the value's own size (``own``): an atom of its own, equal
to the sizes read from that value's shape and kept by the ops after it, to nothing
else; never a guess. A Slice of a constant cut at a size ``e`` (learned positions
``table[:S]``) is ``min(e, n)``: it is "capped", proven only where it broadcasts
against ``e`` itself. So is ``Min(x, k * (x Div k))`` and torch.export's ceil spelled
``Min(x, -k * ((-x) Div k))`` (``_rounding.py``: ONNX's integer Div truncates, so both
are ``k * floor(x / k) <= x``); ``Min(x, k * ((x + k - 1) Div k))`` is ``x``. The inferred
shapes give only ranks here.

A size is a sum of atoms and a constant (``Size``): an atom is a declared symbol of a
graph input (``batch``), an unnamed input dimension, or an inner value's own size. A
declared expression ``past_sequence_length + sequence_length`` is that sum, so it
equals the length of a Range to ``past + sequence`` read from the cache's and the ids'
shapes. Symbols the model declares on its inputs are its interface (the check
generates inputs that keep them), unlike those an inference assigned to inner values.

Readers: the pre-pass ``shape_reads`` (a Shape read becomes a read of the graph input
whose declared dimension it is proven to be) and canonical's ``identity_slice``,
``identity_reshape`` and ``copied_dims``. One ``SizeProof`` remembers what it proved,
so the many reads of one graph cost one walk (a residual stream's sizes are asked
again through every layer); it stays right while the graph changes only in ways that
keep every value (a read replaced by an equal one).

What every stage reads and decides with (``_shape_values.py``, ``_decide.py``):
``known_dims`` (a value's labels), ``entries``/``dim_entries``/``scalar`` (a shape
computation read entry by entry), ``axes_of``, ``grid_parts``/``grid_component`` (an index
grid's parts); and the one rule that decides two sizes equal, ``proven_equal`` (the proof
alone) and ``proven_same`` (the proof where it decides, the labels only where it cannot).
Canonical's rules and the rewriters both use them: a later stage reads them here, not
through an earlier stage's face.
"""

from autofusion.fusion_core.sizes._decide import proven_equal, proven_other, proven_same
from autofusion.fusion_core.sizes._proof import SizeProof, axis_size, read_sizes
from autofusion.fusion_core.sizes._shape_values import (
    Dim,
    axes_of,
    dim_entries,
    entries,
    grid_component,
    grid_parts,
    known_dims,
    scalar,
)
from autofusion.fusion_core.sizes._size import ONE, Size, declared, is_own

__all__ = [
    "ONE",
    "Dim",
    "Size",
    "SizeProof",
    "axes_of",
    "axis_size",
    "declared",
    "dim_entries",
    "entries",
    "grid_component",
    "grid_parts",
    "is_own",
    "known_dims",
    "proven_equal",
    "proven_other",
    "proven_same",
    "read_sizes",
    "scalar",
]
