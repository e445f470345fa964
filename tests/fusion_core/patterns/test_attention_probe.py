"""The attention probe: which Softmax is attention-like, and so owed a near miss."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

from autofusion.fusion_core.ir import model_from_proto
from autofusion.fusion_core.patterns._probes import attention_softmax

SCORES = {
    # DeBERTa-v2: the scores are reshaped between the position Add and the mask's Where
    "reshaped-then-masked": """
        s = MatMul(q, k)
        d = Div(s, c8)
        r = Reshape(d, shape)
        w = Where(m, neg, r)
        y = Softmax<axis = -1>(w)""",
    "scaled": """
        s = MatMul(q, k)
        d = Mul(s, c8)
        y = Softmax<axis = -1>(d)""",
    # Gemma-2: soft-capped scores, c * tanh(s / c), then the mask
    "soft-capped": """
        s = MatMul(q, k)
        d = Div(s, cap)
        t = Tanh(d)
        c = Mul(t, cap)
        w = Where(m, neg, c)
        y = Softmax<axis = -1>(w)""",
    "classifier-over-weights": """
        s = MatMul(q, wconst)
        y = Softmax<axis = -1>(s)""",
}
EXPECTED = {
    "reshaped-then-masked": True,
    "scaled": True,
    "soft-capped": True,
    "classifier-over-weights": False,
}


@pytest.mark.parametrize("case", list(SCORES), ids=list(SCORES))
def test_attention_softmax_probe(case):
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 8, 8] q, float[1, 4, 8, 8] k, bool[1, 4, 8, 8] m) => (float[1, 4, 8, 8] y) {{
        {SCORES[case]}
    }}"""
    model = onnx.parser.parse_model(text)
    consts = {
        "c8": np.array(0.125, np.float32),
        "cap": np.array(50.0, np.float32),
        "neg": np.array(-1e4, np.float32),
        "shape": np.array([1, 4, 8, 8], np.int64),
        "wconst": np.ones((8, 8), np.float32),
    }
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in consts.items())
    graph = model_from_proto(model).graph
    softmax = next(n for n in graph if n.op_type == "Softmax")
    assert attention_softmax(softmax) is EXPECTED[case]
