"""A model's own ``autofusion.*`` marks are not believed: loading takes them off.

A pass marks what it inserts (``autofusion.canonical``: a head split's merge and split,
undone when no fusion took them), what layers share and the sizes it proved. A model a
user brings may carry such marks, forged or left by an earlier run of this tool on its
own output; read as they are, ``undo_unused`` took out a "pair" it never inserted: here a
``Neg`` and a ``Relu`` marked as a merge and its split, and the model computed
``sigmoid(x)`` for ``sigmoid(relu(-x))``. The provenance (``autofusion.pattern``, what a
fused node replaced) stays: it describes the output. Outputs compared exactly (rtol =
atol = 0).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from autofusion.fusion_core.canonical import MARK
from autofusion.fusion_core.ir import load_model, model_from_proto
from autofusion.fusion_core.provenance import PATTERN
from autofusion.fusion_core.testing import build_model, optimize_quiet, run_both

# the values the head-split rule writes into its mark
MERGE, SPLIT = "head_split:merge", "head_split:split"


def _forged() -> onnx.ModelProto:
    model = build_model(
        """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 6] x) => (float[2, 6] y) {
  n = Neg (x)
  r = Relu (n)
  y = Sigmoid (r)
}
"""
    )
    for node, mark in zip(model.graph.node[:2], (MERGE, SPLIT), strict=True):
        node.metadata_props.add(key=MARK, value=mark)
    model.graph.node[1].metadata_props.add(key=PATTERN, value="a_pattern")
    return model


@pytest.mark.parametrize("given_as", ["proto", "file"])
def test_a_forged_merge_and_split_are_not_undone(given_as: str, tmp_path) -> None:
    model = _forged()
    source = model
    if given_as == "file":
        source = tmp_path / "forged.onnx"
        onnx.save(model, source)
    fused = optimize_quiet(source, patterns=[]).model
    assert [n.op_type for n in fused.graph] == ["Neg", "Relu", "Sigmoid"]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)}
    run_both(model, ir.to_proto(fused), feeds=feeds, rtol=0, atol=0)


def test_loading_keeps_the_provenance_and_drops_the_working_marks(tmp_path) -> None:
    onnx.save(_forged(), tmp_path / "forged.onnx")
    for model in (load_model(tmp_path / "forged.onnx"), model_from_proto(_forged())):
        marks = [dict(n.metadata_props) for n in model.graph]
        assert marks == [{}, {PATTERN: "a_pattern"}, {}], marks
