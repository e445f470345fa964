"""``Min(x, k * round(x / k))`` read by ``fusion_core.sizes`` (torch.export's key length
of a chunked attention, MiniMax-M3: ``Min(S, 2 * ceil(S / 2))``, ceil written
``-((-S) // 2)``).

ONNX's integer ``Div`` truncates toward zero, so the graph's ``-k * ((-x) Div k)`` is ``k
* floor(x / k)``, not the ceil torch meant: ``Min`` with ``x`` is then a capped ``x``
(``x`` where ``k`` divides it, smaller elsewhere); ``k * ((x + k - 1) Div k)`` is the
ceil, and ``Min`` with it is ``x``. A generator (hypothesis) writes the rounding in random
spellings (``Neg`` or a Mul by -1, the factor on either side, ``Min``'s operands in either
order, ``x`` a scalar or one entry, the multiple through a Reshape or a Cast) over random
``k``, and near misses that prove nothing (another factor outside, ``x + k`` for ``x + k
- 1``). What the proof says is checked against onnxruntime for ``x`` in 0..24: an exact
``x`` is what it computes for every ``x``; a capped ``x`` is at most ``x``, and ``x``
where ``k`` divides it. Exact integers: no tolerance. The example budget is
``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.sizes import Size, read_sizes
from autofusion.fusion_core.testing import build_model
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

# ``r``: x rounded to a multiple of k; what the proof of Min(x, r) must be
ROUNDINGS = {
    "neg_trunc": (["nx = Neg (x)", "q = Div (nx, k)", "r = Mul (minus_k, q)"], "capped"),
    "mul_trunc": (["nx = Mul (minus_one, x)", "q = Div (nx, k)", "r = Mul (q, minus_k)"], "capped"),
    "neg_outside": (
        ["nx = Neg (x)", "q = Div (nx, k)", "kq = Mul (k, q)", "r = Neg (kq)"],
        "capped",
    ),
    "floor": (["q = Div (x, k)", "r = Mul (k, q)"], "capped"),
    "ceil": (["up = Add (x, k_less)", "q = Div (up, k)", "r = Mul (q, k)"], "exact"),
    "ceil_cast": (
        [
            "up = Add (k_less, x)",
            "q = Div (up, k)",
            "q32 = Cast <to = 6> (q)",
            "r32 = Mul (q32, k32)",
            "r = Cast <to = 7> (r32)",
        ],
        "exact",
    ),  # fmt: skip
    # near misses: no rounding of x to a multiple of k
    "other_factor": (["nx = Neg (x)", "q = Div (nx, k)", "r = Mul (minus_k_less, q)"], None),
    "ceil_plus_k": (["up = Add (x, k)", "q = Div (up, k)", "r = Mul (q, k)"], None),
}


@dataclass(frozen=True)
class Case:
    k: int
    rounding: str  # a key of ROUNDINGS
    x_first: bool  # Min(x, r), not Min(r, x)
    scalar: bool  # x a scalar (torch.export's sym_size: Squeeze), not one entry


@st.composite
def cases(draw) -> Case:
    return Case(
        k=draw(st.integers(1, 6)),
        rounding=draw(st.sampled_from(sorted(ROUNDINGS))),
        x_first=draw(st.booleans()),
        scalar=draw(st.booleans()),
    )


def _model(c: Case):
    body, _ = ROUNDINGS[c.rounding]
    kind = "int64" if c.scalar else "int64[1]"
    picked = "x = Squeeze (shape)" if c.scalar else "x = Identity (shape)"
    least = "Min (x, r)" if c.x_first else "Min (r, x)"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[s] t) => ({kind} m) {{
        shape = Shape (t)
        {picked}
        {chr(10).join(body)}
        m = {least}
    }}"""
    k, shape = c.k, () if c.scalar else (1,)
    inits = {
        "k": np.full(shape, k, np.int64),
        "minus_k": np.full(shape, -k, np.int64),
        "minus_k_less": np.full(shape, -k - 1, np.int64),
        "minus_one": np.full(shape, -1, np.int64),
        "k_less": np.full(shape, k - 1, np.int64),
        "k32": np.full(shape, k, np.int32),
    }
    used = " ".join(body)
    return build_model(text, {name: a for name, a in inits.items() if name in used})


@SPELLINGS
@given(cases())
def test_min_of_a_size_and_its_rounded_multiple_is_proven_as_onnxruntime_computes_it(
    c: Case,
) -> None:
    model = _model(c)
    graph = ir.from_proto(model).graph
    proven = read_sizes(graph.outputs[0])
    expected = ROUNDINGS[c.rounding][1]
    if c.rounding == "ceil_plus_k" and c.k == 1:  # x + 1: at least x, so the Min is x
        expected = "exact"  # (sizes' ordering of Min's entries, _extremes.py)
    s = Size(("s",), 0)
    if expected is None:
        assert proven == [None], (c, proven)
        return
    capped = expected == "capped" and c.k > 1  # k = 1: x Div 1 is x, read as such
    assert proven == [Size(s.atoms, 0, capped=capped)], (c, proven)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for x in range(25):
        (m,) = session.run(None, {"t": np.zeros(x, np.float32)})
        m = int(np.asarray(m).reshape(-1)[0])
        if not capped:
            assert m == x, (c, x, m)
        else:
            assert m <= x and (m == x or x % c.k), (c, x, m)
