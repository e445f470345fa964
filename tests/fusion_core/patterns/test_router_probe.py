"""The router probes: which Sigmoid picks experts, and so is owed a near miss when the
sigmoid router pattern binds nothing there."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

from autofusion.fusion_core.ir import model_from_proto
from autofusion.fusion_core.patterns._probes import router_sigmoid

ROUTERS = {
    # DeepSeek-V3: the choice is made on the scores plus a selection bias
    "biased-choice": """
        l = MatMul(x, wr)
        s = Sigmoid(l)
        b = Add(s, bias)
        v, i = TopK(b, k2)
        y = GatherElements<axis = 1>(s, i)""",
    # group-limited: the biased scores are reshaped into groups before a TopK
    "grouped": """
        l = MatMul(x, wr)
        s = Sigmoid(l)
        b = Add(s, bias)
        g = Reshape(b, groups)
        v, i = TopK(g, k2)
        y = Cast<to = 7>(i)""",
    "plain": """
        l = MatMul(x, wr)
        s = Sigmoid(l)
        v, i = TopK(s, k2)
        y = Cast<to = 7>(i)""",
    # a gate's Sigmoid (SiLU, a shared expert's gate) multiplies a projection
    "silu-gate": """
        l = MatMul(x, wr)
        s = Sigmoid(l)
        y = Mul(s, l)""",
    # scores of two activations are attention-like, not a router
    "no-constant-weight": """
        l = MatMul(x, x2)
        s = Sigmoid(l)
        v, i = TopK(s, k2)
        y = Cast<to = 7>(i)""",
}
EXPECTED = {
    "biased-choice": True,
    "grouped": True,
    "plain": True,
    "silu-gate": False,
    "no-constant-weight": False,
}


@pytest.mark.parametrize("case", list(ROUTERS), ids=list(ROUTERS))
def test_router_sigmoid_probe(case):
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[6, 8] x, float[8, 4] x2) => (y) {{
        {ROUTERS[case]}
    }}"""
    model = onnx.parser.parse_model(text)
    consts = {
        "wr": np.ones((8, 4), np.float32),
        "bias": np.zeros((4,), np.float32),
        "k2": np.array([2], np.int64),
        "groups": np.array([6, 2, 2], np.int64),
    }
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in consts.items())
    graph = model_from_proto(model).graph
    sigmoid = next(n for n in graph if n.op_type == "Sigmoid")
    assert router_sigmoid(sigmoid) is EXPECTED[case]
