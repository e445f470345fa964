"""Shape values and the proven-size rule, read through ``fusion_core.sizes``' face.

They moved out of canonical (a later stage, the rewriters, read them through canonical's
face): every stage now reads them from ``sizes``, beside the proof that decides sizes,
and canonical's face no longer names them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from autofusion.fusion_core import canonical, sizes
from autofusion.fusion_core.testing import build_model

_TEXT = """<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, sequence, 8] x, float[batch, other, 8] y)
    => (float[batch, other, 8] z, int64 h, int64[3] t, float[batch, padded, 8] p,
        float[1, batch, sequence, 8, 1] u) {
    s = Shape (x)
    d = Gather <axis = 0> (s, two)
    h = Div (d, two)
    lead = Slice (s, zero1, two1)
    t = Concat <axis = 0> (lead, minus1)
    z = Identity (y)
    s1 = Shape <start = 1, end = 2> (x)
    gap = Mod (s1, three1)
    pads = ScatterElements <axis = 0> (zeros6, four1, gap)
    p = Pad (x, pads)
    u = Unsqueeze (x, axes)
}"""


@pytest.fixture
def graph() -> ir.Graph:
    """A fresh graph per test: the tests relabel its values."""
    ints = {"two": 2, "zero1": [0], "two1": [2], "minus1": [-1], "three1": [3]}
    ints |= {"zeros6": [0] * 6, "four1": [4], "axes": [0, -1]}
    model = build_model(_TEXT, {k: np.array(v, np.int64) for k, v in ints.items()})
    return ir.from_proto(model).graph


def _values(graph: ir.Graph) -> dict[str, ir.Value]:
    return {v.name: v for n in graph for v in n.outputs} | {v.name: v for v in graph.inputs}


def test_a_shape_computation_is_read_entry_by_entry(graph: ir.Graph) -> None:
    v = _values(graph)
    assert sizes.known_dims(v["x"]) == ["batch", "sequence", 8]
    assert sizes.entries(v["s"]) == [None, None, 8]  # a symbol is no number
    assert sizes.dim_entries(v["t"]) == ["batch", "sequence", -1]
    assert sizes.scalar(v["h"]) == 4  # Div(Gather(Shape(x), 2), 2): 8 // 2
    assert sizes.scalar(v["d"]) == 8
    assert sizes.scalar(v["s"]) is None  # three entries, not one
    unsqueeze = v["u"].producer()
    assert unsqueeze is not None and sizes.axes_of(unsqueeze) == [0, -1]


def test_the_proof_decides_before_the_labels(graph: ir.Graph) -> None:
    v = _values(graph)
    z, x = v["z"], v["x"]
    # an inference's auto-merge: z (y's ``other``) labelled with x's ``sequence``
    z.shape = ir.Shape(["batch", "sequence", 8])
    proof = sizes.SizeProof()
    assert sizes.known_dims(z)[1] == sizes.known_dims(x)[1]  # the labels agree ...
    assert not sizes.proven_same(proof, ((z, 1), (x, 1)))  # ... the graph does not
    assert sizes.proven_equal(proof.size(z, 1), proof.size(x, 1)) is False
    assert sizes.proven_other(proof, (z, 1), "sequence")
    assert sizes.proven_same(proof, ((z, 0), (x, 0)), ((z, 2), (x, 2)))
    assert not sizes.proven_other(proof, (x, 2), 8)


def test_the_labels_decide_only_where_the_proof_cannot_tell(graph: ir.Graph) -> None:
    v = _values(graph)
    padded, x = v["p"], v["x"]
    proof = sizes.SizeProof()
    own = proof.size(padded, 1)  # padded by amounts the graph computes: its own size
    assert own is not None and sizes.is_own(own)
    assert sizes.proven_equal(own, proof.size(x, 1)) is None
    assert not sizes.proven_other(proof, (padded, 1), "sequence")
    padded.shape = ir.Shape(["batch", "sequence", 8])
    assert sizes.proven_same(proof, ((padded, 1), (x, 1)))
    padded.shape = ir.Shape(["batch", "padded", 8])
    assert not sizes.proven_same(proof, ((padded, 1), (x, 1)))
    padded.shape = ir.Shape(["batch", None, 8])
    assert not sizes.proven_same(proof, ((padded, 1), (x, 1)))  # unknown is not equal


@pytest.mark.parametrize(
    "name", ["Dim", "axes_of", "entries", "known_dims", "proven_equal", "proven_same", "scalar"]
)
def test_canonical_no_longer_names_the_shape_values(name: str) -> None:
    """One place for them: a stage that wants them imports ``sizes``, not canonical."""
    assert hasattr(sizes, name) and not hasattr(canonical, name)
