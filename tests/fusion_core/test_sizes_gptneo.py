"""GPT-Neo's KV graph in ``fusion_core.sizes``: torch.export writes its query length
clamped to the 128 positions, ``Max(0, -P + Min(N, P + S))``, into the Reshape that
merges the heads. That is ``min(S, max(0, N - P))``, not ``S``: the entry stays unread,
and the Reshape's output is proven ``S`` long by counting elements (it runs only where
the entry is ``S``). ``Max`` and ``Min`` of entries one of which is proven at most the
other are read (``Max(0, S)`` is ``S``); ``Max(1, S)`` is not (``S`` may be 0).

A generator (hypothesis) draws ``N``, the heads, the operands' order and the sizes ``P``
and ``S``; onnxruntime runs the graph: where it runs, the merged axis is ``S`` long; it
fails to run where the entry is neither ``S`` nor 0 (a 0 copies the input's ``S``).
Exact integers: no tolerance. The example budget is ``AUTOFUSION_SPELLING_EXAMPLES``
(25 in ``make test``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.sizes import Size, axis_size, read_sizes
from autofusion.fusion_core.testing import build_model
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

S, P = Size(("S",), 0), Size(("P",), 0)


def _merge_model(n: int, heads: int, max_first: bool, min_first: bool):
    clamp = "Max (zero, rest)" if max_first else "Max (rest, zero)"
    least = "Min (n, total)" if min_first else "Min (total, n)"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[B, P, 2] past, float[B, S, {heads}, 4] x) => (float[B, L, {heads * 4}] y) {{
        p = Shape <start = 1, end = 2> (past)
        s = Shape <start = 1, end = 2> (x)
        b = Shape <start = 0, end = 1> (x)
        total = Add (p, s)
        capped = {least}
        minus_p = Mul (minus_one, p)
        rest = Add (minus_p, capped)
        length = {clamp}
        target = Concat <axis = 0> (b, length, width)
        y = Reshape (x, target)
    }}"""
    inits = {
        "zero": np.array([0], np.int64),
        "n": np.array([n], np.int64),
        "minus_one": np.array([-1], np.int64),
        "width": np.array([heads * 4], np.int64),
    }
    return build_model(text, inits)


@SPELLINGS
@given(
    n=st.integers(1, 12),
    heads=st.integers(1, 4),
    max_first=st.booleans(),
    min_first=st.booleans(),
    runs=st.lists(st.tuples(st.integers(0, 14), st.integers(0, 6)), min_size=1, max_size=4),
)
def test_gptneo_merge_reshape_is_proven_as_long_as_the_query_where_it_runs(
    n: int, heads: int, max_first: bool, min_first: bool, runs: list[tuple[int, int]]
) -> None:
    model = _merge_model(n, heads, max_first, min_first)
    graph = ir.from_proto(model).graph
    assert axis_size(graph.outputs[0], 1) == S
    (clamp,) = (node for node in graph if node.op_type == "Max")
    assert read_sizes(clamp.outputs[0]) == [None]  # min(S, max(0, N - P)): not S
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for p, s in runs:
        feeds = {
            "past": np.zeros((2, p, 2), np.float32),
            "x": np.zeros((2, s, heads, 4), np.float32),
        }
        entry = max(0, min(n, p + s) - p)
        if entry not in (0, s):  # less than S: it cannot run (a 0 copies S: it runs)
            with pytest.raises(Exception):  # noqa: B017 onnxruntime's own error type
                session.run(None, feeds)
            continue
        (y,) = session.run(None, feeds)
        assert y.shape == (2, s, heads * 4), (p, s, y.shape)


# (left, right) as ONNX text terms; what Max and Min of them are proven to be
ORDERED = {
    "max_zero": ("zero", "s", "Max", S),
    "min_zero": ("s", "zero", "Min", Size((), 0)),
    "max_shifted": ("s", "s2", "Max", S + Size((), 2)),
    "min_number": ("two", "s3", "Min", Size((), 2)),
    "max_sum": ("ps", "s", "Max", S + P),
    # near misses: no order at every size
    "max_one": ("one", "s", "Max", None),  # S may be 0
    "min_two_sizes": ("s", "p", "Min", None),
    "min_number_over": ("two", "s1", "Min", None),  # S + 1 < 2 at S = 0
}


@pytest.mark.parametrize("case", sorted(ORDERED))
def test_max_and_min_of_ordered_entries_are_read_as_onnxruntime_computes(case: str) -> None:
    left, right, op, expected = ORDERED[case]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[P] tp, float[S] ts) => (int64[1] m) {{
        p = Shape (tp)
        s = Shape (ts)
        s1 = Add (s, one)
        s2 = Add (s, two)
        s3 = Add (s1, two)
        ps = Add (p, s)
        m = {op} ({left}, {right})
    }}"""
    numbers = {"zero": 0, "one": 1, "two": 2}
    model = build_model(text, {k: np.array([v], np.int64) for k, v in numbers.items()})
    assert read_sizes(ir.from_proto(model).graph.outputs[0]) == [expected]
    if expected is None:
        return
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for p in range(4):
        for s in range(5):
            feeds = {"tp": np.zeros(p, np.float32), "ts": np.zeros(s, np.float32)}
            (m,) = session.run(None, feeds)
            value = (
                expected.constant + s * expected.atoms.count("S") + p * expected.atoms.count("P")
            )
            assert int(m[0]) == value, (case, p, s, m)
