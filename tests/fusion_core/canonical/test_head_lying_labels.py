"""The rules around the head Transpose decide on sizes the graph proves, not on labels.

Each block is an attention whose heads are split by a target computed from shapes
(``Concat(Gather(Shape(x), 0), Gather(Shape(x), 1), [N], [H])``) with one of the rules
between the split and the attention:

* ``norm_heads``/``neg_heads``: a per-head op (a Mul by ``[H]``, a Neg) between the head
  split and the head Transpose of q and k (``head_split``);
* ``scaled_heads``: q scaled by ``[N, 1, H]`` after its head Transpose
  (``head_read_before_transpose``);
* ``gated``: the context scaled by ``[N, 1, H]`` before its head Transpose
  (``context_read_after_transpose``);
* ``norm_after``: a LayerNormalization of the transposed q and k heads
  (``transpose_after_norm``);
* ``rotary``: com.microsoft's RotaryEmbedding of the transposed q and k heads
  (``transpose_after_rotary``);
* ``norm_heads_crossed``: the split reads ``x[B, S, E]`` as ``[S, B, N, H]`` (and merges
  back so): its labels are a head split's once ``B`` and ``S`` are merged.

``tests/fusion_core/lying_labels.py`` draws the labels an inference could have written
(two symbols merged, an inner axis given an input's symbol, a label dropped): these
rules read symbols nowhere (their Reshapes copy ``B`` and ``S`` with 0, and their
identities hold at every size), and the blocks guard that. ``stale_layouts`` gives two
fixed axes each other's numbers (a ``value_info`` left from another layout, which
onnxruntime does not check through a computed target or a contrib op): ``head_split``
and ``transpose_after_rotary`` wrote those numbers into their new Reshapes and broke the
model; they now take them from ``fusion_core.sizes`` where it proves them. Whatever the
optimizer (check off) makes of a lying model must compute what the block does at two
sizes with ``B != S``.

Tolerance: rtol = atol = 1e-5 (the fused attention sums in another order, as in
test_flat_head_split.py); the canonical form alone moves elements only: rtol = atol = 0.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import canonical_form
from autofusion.fusion_core.testing import build_model, canonical_twice, fuse_quiet, run_both
from autofusion.fusion_core.validate import make_session
from tests.fusion_core.lying_labels import inferred, lies, stale_layouts, swapped
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
EXACT = dict(rtol=0, atol=0)
N, H = 2, 4
E = N * H
SHAPES = [(2, 5, E), (3, 2, E)]
_TRANSPOSE = "<perm = [0, 2, 1, 3]>"
# q's and k's heads as each block reads them: rq and rk are the head splits
_READS = {
    "plain": ["q = Transpose {t} (rq)", "k = Transpose <perm = [0, 2, 3, 1]> (rk)"],
    "norm_heads": [
        "nq = Mul (rq, gamma)",
        "nk = Mul (rk, gamma)",
        "q = Transpose {t} (nq)",
        "k = Transpose <perm = [0, 2, 3, 1]> (nk)",
    ],
    "neg_heads": [
        "nq = Neg (rq)",
        "nk = Neg (rk)",
        "q = Transpose {t} (nq)",
        "k = Transpose <perm = [0, 2, 3, 1]> (nk)",
    ],
    "scaled_heads": [
        "tq = Transpose {t} (rq)",
        "q = Mul (tq, scale)",
        "k = Transpose <perm = [0, 2, 3, 1]> (rk)",
    ],
    "norm_after": [
        "tq = Transpose {t} (rq)",
        "tk = Transpose {t} (rk)",
        "q = LayerNormalization <axis = -1> (tq, gamma, beta)",
        "nk = LayerNormalization <axis = -1> (tk, gamma, beta)",
        "k = Transpose <perm = [0, 1, 3, 2]> (nk)",
    ],
    "rotary": [
        "tq = Transpose {t} (rq)",
        "tk = Transpose {t} (rk)",
        "q = com.microsoft.RotaryEmbedding (tq, pos, cos, sin)",
        "rok = com.microsoft.RotaryEmbedding (tk, pos, cos, sin)",
        "k = Transpose <perm = [0, 1, 3, 2]> (rok)",
    ],
}
RULES = {
    "norm_heads": "head_split",
    "neg_heads": "head_split",
    "scaled_heads": "head_read_before_transpose",
    "gated": "context_read_after_transpose",
    "norm_after": "transpose_after_norm",
    "rotary": "transpose_after_rotary",
}
KINDS = [*RULES, "norm_heads_crossed"]


def block(kind: str) -> onnx.ModelProto:
    """The attention of ``x[B, S, E]`` with ``kind``'s op around its head Transposes."""
    rng = np.random.default_rng(3)
    inits = {f"i{a}": np.array([a], np.int64) for a in range(2)}
    inits |= {"n": np.array([N]), "h": np.array([H]), "e": np.array([E]), "half": np.float32(0.5)}
    inits |= {w: rng.standard_normal((E, E)).astype(np.float32) / 3 for w in ("wq", "wk", "wv")}
    inits |= {
        "gamma": rng.uniform(0.5, 1.5, H).astype(np.float32),
        "beta": rng.uniform(-0.5, 0.5, H).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, (N, 1, H)).astype(np.float32),
        "cos": np.cos(angles := rng.uniform(0, 3, (16, H // 2))).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }
    lead = "s1, s0" if kind.endswith("crossed") else "s0, s1"
    reads = _READS.get(kind.removesuffix("_crossed"), _READS["plain"])
    gate = ["cg = Mul (c, scale)"] if kind == "gated" else ["cg = Identity (c)"]
    body = [
        "d = Shape (x)",
        "s0 = Gather <axis = 0> (d, i0)",
        "s1 = Gather <axis = 0> (d, i1)",
        f"t = Concat <axis = 0> ({lead}, n, h)",
        *(f"p{z} = MatMul (x, w{z})" for z in "qkv"),
        *(f"r{z} = Reshape (p{z}, t)" for z in "qkv"),
        *(r.format(t=_TRANSPOSE) for r in reads),
        f"v = Transpose {_TRANSPOSE} (rv)",
        "raw = MatMul (q, k)",
        "scaled = Mul (raw, half)",
        "probs = Softmax <axis = -1> (scaled)",
        "c = MatMul (probs, v)",
        *gate,
        f"ct = Transpose {_TRANSPOSE} (cg)",
        f"m = Concat <axis = 0> ({lead}, e)",
        "y = Reshape (ct, m)",
    ]
    inputs = f"float[B, S, {E}] x" + (", int64[B, S] pos" if kind == "rotary" else "")
    text = f"""<ir_version: 8, opset_import: ["" : 18, "com.microsoft" : 1]>
    g ({inputs}) => (float[?, ?, {E}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def _feeds(kind: str, seed: int, shape: tuple[int, int, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    if kind == "rotary":
        feeds["pos"] = rng.integers(0, 16, shape[:2]).astype(np.int64)
    return feeds


def _same_at_both_sizes(kind: str, model: onnx.ModelProto) -> list[str]:
    """The optimized ``model``'s ops; it computes what the block does at both sizes."""
    fused = fuse_quiet(model)
    for seed, shape in enumerate(SHAPES):
        run_both(block(kind), fused.model, feeds=_feeds(kind, seed, shape), **TOL)
    return fused.ops


def _runs(kind: str, model: onnx.ModelProto) -> bool:
    """Whether onnxruntime runs ``model`` at both sizes (it rejects a stale label its own
    inference contradicts)."""
    try:
        session = make_session(model)
        for seed, shape in enumerate(SHAPES):
            session.run(None, _feeds(kind, seed, shape))
    except Exception:  # onnxruntime's errors have no common type: any is a refusal
        return False
    return True


_LIES = {kind: lies(block(kind)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
@SPELLINGS
@given(data=st.data())
def test_lying_labels_leave_the_head_rules_exact(kind, data) -> None:
    lie, lying = data.draw(_LIES[kind], label="lie")
    note(lie)
    _same_at_both_sizes(kind, lying)


def _stale() -> list[tuple[str, int]]:
    return [(kind, i) for kind in KINDS for i in range(len(stale_layouts(block(kind))))]


@pytest.mark.parametrize(("kind", "index"), _stale())
def test_a_stale_layout_leaves_the_head_rules_exact(kind, index) -> None:
    """Every stale layout of every block onnxruntime runs: the optimized model too."""
    lie, lying = stale_layouts(block(kind))[index]
    if _runs(kind, lying):  # else onnxruntime catches the lie itself
        _same_at_both_sizes(kind, lying)


@pytest.mark.parametrize("kind", sorted(RULES))
def test_true_labels_still_fuse_through_the_rule(kind) -> None:
    assert RULES[kind] in canonical_twice(block(kind))[1]
    ops = _same_at_both_sizes(kind, inferred(block(kind)))
    assert "MultiHeadAttention" in ops and "Softmax" not in ops, ops


def _canonical(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """The canonical form of ``model`` as its labels are (no inference first)."""
    work, counter = ir.from_proto(model), itertools.count()
    done = canonical_form(work.graph, lambda hint: f"{hint}__{next(counter)}")
    return ir.to_proto(work), dict(done)


@pytest.mark.parametrize(
    ("kind", "rule"), [("neg_heads", "head_split"), ("rotary", RULES["rotary"])]
)
def test_heads_labelled_in_another_layout_are_not_split_by_the_labels(kind, rule) -> None:
    """q, k and v heads ``[B, S, 2, 4]`` all labelled ``[B, S, 4, 2]`` (their split's
    target is computed, so onnxruntime runs the model): the graph proves ``2`` and ``4``,
    the rule leaves the heads, and the canonical form computes what the model does. The
    old rules merged and split them ``[B, S, 4, 2]`` and the model failed to run."""
    base = inferred(block(kind))
    names = [v.name for v in base.graph.value_info if v.name in ("rq", "rk", "rv", "nq", "nk")]
    lying = swapped(base, names, (2, 3))
    assert _runs(kind, lying)
    canonical, done = _canonical(lying)
    assert rule not in done
    for seed, shape in enumerate(SHAPES):
        run_both(block(kind), canonical, feeds=_feeds(kind, seed, shape), **EXACT)
