"""``identity_reshape`` (and ``copied_dims``) prove a Reshape keeps its input's shape
from the Reshape's own target (``fusion_core.sizes``), never from a symbol a shape
inference put on the values.

onnxruntime's symbolic inference merges symbols it cannot compare ("auto merge"): it
labelled Kimi-Linear's padded length (the sequence rounded up to a chunk) ``sequence``.
Here rows padded to a multiple of a chunk, ``[B, P, S]``, are turned to ``[B, S, P]``
by a Reshape to ``[batch, sequence, -1]`` read from the unpadded input; both sides
carry the label ``[batch, sequence, sequence]`` as value_info (a model may bring it;
the pre-pass inference never overwrites a known dim), which is what the auto-merge
leaves. Before, ``identity_reshape`` dropped that Reshape (every dim read the same
symbol) and ``copied_dims`` made its target ``[0, 0, -1]`` (the entries read the
input's symbols): the fused model returned ``[B, P, S]`` wherever P is not S.

The generated test writes the target of a Reshape in random proven spellings
(constants, ``Shape`` reads of the input or of the graph input sliced, gathered or
cut by attributes, 0 copies, one -1), to the input's own shape or to a permutation of
its dims, and asserts the Reshape goes exactly when the target is the input's shape.
Every comparison is exact (rtol = atol = 0): a Reshape only re-views data. The
example budget is ``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, canonical_twice, optimize_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

EXACT = dict(rtol=0, atol=0)
D = 4
PAD_INTS = {"one": [1], "two": [2], "zero": [0], "pads0": [0] * 6, "pad_at": [4]}
PAIR_INTS = {"one": [1], "two": [2], "zero": [0], "pads0": [0] * 8, "pad_at": [6]}


def _labelled(model: onnx.ModelProto, labels: dict[str, list]) -> onnx.ModelProto:
    """``labels`` as value_info: the dims an auto-merging inference leaves."""
    for name, dims in labels.items():
        info = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims)
        model.graph.value_info.append(info)
    return model


def _turned_padded_rows(chunk: int) -> onnx.ModelProto:
    """x [batch, sequence, D] -> scores x x^T [B, S, S], rows padded to a multiple of
    ``chunk`` [B, P, S], turned to [B, S, P] by a Reshape to ``[batch, sequence, -1]``
    read from x; the padded and the turned rows labelled [batch, sequence, sequence]."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {D}] x) => (float[batch, sequence, padded] y) {{
        xt = Transpose <perm = [0, 2, 1]> (x)
        scores = MatMul (x, xt)
        xs = Shape (x)
        s1 = Slice (xs, one, two)
        rem = Mod (s1, chunk)
        gap = Sub (chunk, rem)
        pad_n = Mod (gap, chunk)
        pads = ScatterElements <axis = 0> (pads0, pad_at, pad_n)
        rows = Pad (scores, pads)
        bs = Slice (xs, zero, two)
        target = Concat <axis = 0> (bs, minus1)
        turned = Reshape (rows, target)
        y = Mul (turned, two_f)
    }}"""
    ints = PAD_INTS | {"chunk": [chunk], "minus1": [-1]}
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two_f": np.float32(2.0)}
    label = ["batch", "sequence", "sequence"]
    return _labelled(build_model(text, inits), {"rows": label, "turned": label})


def _unfolded_padded_heads(chunk: int) -> onnx.ModelProto:
    """The pair: heads' scores [B, 2, S, S] padded to [B, 2, P, S], folded into the
    batch [2B, P, S] and unfolded to [B, 2, S, P] (``[batch, 2, sequence, -1]`` read from
    x); the padded and the unfolded values labelled [batch, 2, sequence, sequence]."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, sequence, {D}] x) => (float[batch, 2, sequence, padded] y) {{
        xt = Transpose <perm = [0, 1, 3, 2]> (x)
        scores = MatMul (x, xt)
        xs = Shape (x)
        s1 = Slice (xs, two, three)
        rem = Mod (s1, chunk)
        gap = Sub (chunk, rem)
        pad_n = Mod (gap, chunk)
        pads = ScatterElements <axis = 0> (pads0, pad_at, pad_n)
        rows = Pad (scores, pads)
        ps = Shape (rows)
        last_two = Slice (ps, two, four)
        fold = Concat <axis = 0> (minus1, last_two)
        folded = Reshape (rows, fold)
        bh = Slice (xs, zero, three)
        target = Concat <axis = 0> (bh, minus1)
        unfolded = Reshape (folded, target)
        y = Mul (unfolded, two_f)
    }}"""
    ints = PAIR_INTS | {"chunk": [chunk], "minus1": [-1], "three": [3], "four": [4]}
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two_f": np.float32(2.0)}
    label = ["batch", 2, "sequence", "sequence"]
    return _labelled(build_model(text, inits), {"rows": label, "unfolded": label})


def test_a_turn_of_padded_rows_labelled_sequence_stays() -> None:
    canonical, done, again = canonical_twice(_turned_padded_rows(4))[:3]
    assert not {"identity_reshape", "copied_dims"} & set(done), done
    assert [n.op_type for n in canonical.graph.node].count("Reshape") == 1 and again == 0


def test_the_unfold_of_padded_heads_labelled_sequence_stays() -> None:
    canonical, done, again = canonical_twice(_unfolded_padded_heads(4))[:3]
    assert not {"identity_reshape", "copied_dims"} & set(done), done
    assert [n.op_type for n in canonical.graph.node].count("Reshape") == 2 and again == 0


def test_the_fused_models_of_labelled_padded_rows_are_right_at_every_length() -> None:
    """Lengths that are and are not multiples of the chunk (before: right only at the
    multiples, where P is S)."""
    for build, rank in ((_turned_padded_rows, 3), (_unfolded_padded_heads, 4)):
        model = build(4)
        fused = optimize_quiet(model, target="onnxruntime").to_proto()
        for length in (3, 5, 8):
            dims = (2, length, D) if rank == 3 else (2, 2, length, D)
            x = np.random.default_rng(length).standard_normal(dims).astype(np.float32)
            run_both(model, fused, feeds={"x": x}, **EXACT)


def _projected_padded_rows(read_from: str) -> onnx.ModelProto:
    """x [batch, sequence, D] padded by ``S mod 4`` rows (an amount computed from its
    length: a size no rule ties to x's, as Swin's windows), projected, and reshaped to
    ``[B, P, -1]`` read from ``read_from`` (``padded``, or ``other``: x padded by ``S
    mod 3`` rows, as long only at some lengths)."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {D}] x) => (float[batch, rows, {D}] y) {{
        xs = Shape (x)
        s1 = Slice (xs, one, two)
        gap = Mod (s1, four)
        pads = ScatterElements <axis = 0> (pads0, pad_at, gap)
        padded = Pad (x, pads)
        gap3 = Mod (s1, three)
        pads3 = ScatterElements <axis = 0> (pads0, pad_at, gap3)
        other = Pad (x, pads3)
        projected = MatMul (padded, w)
        biased = Add (projected, bias)
        read = Shape <start = 0, end = 2> ({read_from})
        target = Concat <axis = 0> (read, minus1)
        r = Reshape (biased, target)
        y = Mul (r, two_f)
    }}"""
    ints = PAD_INTS | {"four": [4], "three": [3], "minus1": [-1]}
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two_f": np.float32(2.0)}
    rng = np.random.default_rng(0)
    inits |= {"w": rng.standard_normal((D, D)).astype(np.float32)}
    inits |= {"bias": rng.standard_normal(D).astype(np.float32)}
    return build_model(text, inits)


@pytest.mark.parametrize(("read_from", "goes"), [("padded", True), ("other", False)])
def test_a_size_no_rule_ties_to_the_inputs_is_its_own(read_from: str, goes: bool) -> None:
    """The padded length is proven nothing but itself (``sizes``' own atom): a Reshape
    to the shape read from the padded rows themselves goes, one read from other padded
    rows stays (the same length only where both pads agree)."""
    model = _projected_padded_rows(read_from)
    canonical, done, again = canonical_twice(model)[:3]
    assert done.get("identity_reshape", 0) == int(goes) and again == 0, done
    assert [n.op_type for n in canonical.graph.node].count("Reshape") == int(not goes)
    x = np.random.default_rng(2).standard_normal((2, 2, D)).astype(np.float32)
    run_both(model, canonical, feeds={"x": x}, **EXACT)  # a length both pad alike


def test_a_reshape_past_a_chain_deeper_than_the_bound_is_proven_in_a_moment() -> None:
    """80 residual blocks (``x + Relu(x)``) and a Reshape to the last one's own shape:
    the first question walks past the sizes' depth bound through 80 diamonds. Before,
    what was cut there was walked again from both sides of every diamond (2^40 walks:
    it never ended); now once per question, then proven from the top down."""
    body, last = [], "x"
    for i in range(80):
        body += [f"r{i} = Relu ({last})", f"a{i} = Add ({last}, r{i})"]
        last = f"a{i}"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {D}] x) => (float[batch, sequence, {D}] y) {{
        {chr(10).join(body)}
        s = Shape ({last})
        t = Reshape ({last}, s)
        y = Mul (t, two_f)
    }}"""
    model = build_model(text, {"two_f": np.float32(2.0)})
    found: list = []
    worker = threading.Thread(target=lambda: found.append(canonical_twice(model)), daemon=True)
    worker.start()
    worker.join(timeout=60)  # a moment now (0.1 s); without an end before
    assert found, "the proof did not end within 60 s"
    canonical, done, again = found[0][:3]
    assert done == {"identity_reshape": 1} and again == 0, done
    x = np.random.default_rng(3).standard_normal((2, 3, D)).astype(np.float32)
    run_both(model, canonical, feeds={"x": x}, **EXACT)


# the unfold's target read from x [batch, 2, sequence, D] (``b``, ``s``: its B and S): the
# nodes that write it as ``t``, and whether it is x's shape
UNFOLDS = {
    "shape_read": (["bh = Slice (xs, zero, three)", "t = Concat <axis = 0> (bh, minus1)"], True),
    "rest_first": (["t = Concat <axis = 0> (minus1, n2, s, dd)"], True),
    "last_two_turned": (["t = Concat <axis = 0> (b, n2, minus1, s)"], False),
    "copy_of_the_folded": (["t = Concat <axis = 0> (b, n2, z0, minus1)"], False),
}


@pytest.mark.parametrize("unfold", sorted(UNFOLDS))
def test_heads_folded_into_the_batch_and_back_go_exactly_when_back_is_the_shape(unfold) -> None:
    """``[B, 2, S, D]`` folded to ``[2B, S, D]`` and unfolded by a target that is the
    input's shape (read, or ``-1`` and sizes) or is not (``[B, 2, -1, S]``; a 0 in the
    unfold copies the folded value's own axis 2, D, not the input's S)."""
    lines, _ = UNFOLDS[unfold]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 2, sequence, {D}] x) => (float[batch, 2, unfolded_2, unfolded_3] y) {{
        r = Relu (x)
        xs = Shape (x)
        b = Slice (xs, zero, one)
        s = Slice (xs, two, three)
        sd = Slice (xs, two, four)
        fold = Concat <axis = 0> (minus1, sd)
        folded = Reshape (r, fold)
        {chr(10).join(lines)}
        unfolded = Reshape (folded, t)
        y = Mul (unfolded, two_f)
    }}"""
    ints = {"zero": [0], "one": [1], "two": [2], "three": [3], "four": [4], "minus1": [-1],
            "n2": [2], "dd": [D], "z0": [0]}  # fmt: skip
    inits = {k: np.array(v, np.int64) for k, v in ints.items()} | {"two_f": np.float32(2.0)}
    model = build_model(text, inits)
    goes = UNFOLDS[unfold][1]
    canonical, done, again = canonical_twice(model)[:3]
    assert done.get("identity_reshape", 0) == int(goes) and again == 0, done
    assert [n.op_type for n in canonical.graph.node].count("Reshape") == 2 * (not goes)
    x = np.random.default_rng(1).standard_normal((2, 2, 3, D)).astype(np.float32)
    run_both(model, canonical, feeds={"x": x}, **EXACT)


@dataclass(frozen=True)
class Target:
    """A Reshape of ``source`` (x, Relu(x) or x with its last two axes swapped) to the
    source's dims in the order ``order``, entry ``i`` written as ``spellings[i]``."""

    static: tuple[int, int]  # x is [batch, sequence, *static]
    source: str  # "input", "relu" or "swapped"
    order: tuple[int, ...]  # output axis i has the source's dim order[i]
    spellings: tuple[str, ...]  # per entry: const, shape_attr, gather, scalar, slice, zero, rest
    read_input: tuple[bool, ...]  # per entry: a read of x's shape rather than the source's

    @property
    def source_dims(self) -> list:
        dims = ["batch", "sequence", *self.static]
        return dims[:2] + dims[:1:-1] if self.source == "swapped" else dims

    @property
    def keeps_shape(self) -> bool:
        dims = self.source_dims
        return all(dims[j] == dims[i] for i, j in enumerate(self.order))


READS = ("shape_attr", "gather", "scalar", "slice")


@st.composite
def targets(draw) -> Target:
    static = draw(st.sampled_from([(4, 6), (4, 4), (2, 12)]))
    source = draw(st.sampled_from(["input", "relu", "swapped"]))
    order = tuple(range(4)) if draw(st.booleans()) else tuple(draw(st.permutations(range(4))))
    rest = draw(st.sampled_from([None, 0, 1, 2, 3]))
    spellings, read_input = [], []
    dims = Target(static, source, order, (), ()).source_dims
    for i, j in enumerate(order):
        choices = list(READS) + (["zero"] if i == j else [])
        choices += ["const"] if isinstance(dims[j], int) else []
        spellings.append("rest" if i == rest else draw(st.sampled_from(choices)))
        read_input.append(draw(st.booleans()))
    return Target(static, source, order, tuple(spellings), tuple(read_input))


def _entry(t: Target, i: int, inits: dict) -> list[str]:
    """Nodes that write entry ``i`` of the target as ``e{i}`` (1-D, one element)."""
    j, spelling = t.order[i], t.spellings[i]
    if spelling in ("const", "zero", "rest"):
        value = {"zero": 0, "rest": -1}.get(spelling, t.source_dims[j])
        inits[f"e{i}"] = np.array([value], np.int64)
        return []
    swapped = t.source == "swapped" and j >= 2
    read, axis = ("x", 5 - j if swapped else j) if t.read_input[i] else ("src", j)
    inits |= {f"k{i}": np.array([axis], np.int64), f"k{i}_end": np.array([axis + 1], np.int64)}
    inits[f"k{i}_s"] = np.array(axis, np.int64)
    if spelling == "shape_attr":
        return [f"e{i} = Shape <start = {axis}, end = {axis + 1}> ({read})"]
    nodes = [f"s{i} = Shape ({read})"]
    if spelling == "gather":
        return [*nodes, f"e{i} = Gather <axis = 0> (s{i}, k{i})"]
    if spelling == "scalar":
        return [*nodes, f"g{i} = Gather <axis = 0> (s{i}, k{i}_s)", f"e{i} = Unsqueeze (g{i}, k0z)"]
    return [*nodes, f"e{i} = Slice (s{i}, k{i}, k{i}_end)"]


def target_model(t: Target) -> onnx.ModelProto:
    a, b = t.static
    inits: dict = {"two_f": np.float32(2.0), "k0z": np.array([0], np.int64)}
    source = {
        "input": "src = Identity (x)",
        "relu": "src = Relu (x)",
        "swapped": "src = Transpose <perm = [0, 1, 3, 2]> (x)",
    }[t.source]
    body = [source] + [line for i in range(4) for line in _entry(t, i, inits)]
    body += [
        "target = Concat <axis = 0> (e0, e1, e2, e3)",
        "r = Reshape (src, target)",
        "y = Mul (r, two_f)",
    ]
    out = ", ".join(str(t.source_dims[j]) for j in t.order)
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, sequence, {a}, {b}] x) => (float[{out}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


@SPELLINGS
@given(targets(), st.integers(1, 3), st.integers(1, 5))
def test_a_reshape_goes_exactly_when_its_target_is_its_inputs_shape(
    t: Target, batch: int, length: int
) -> None:
    model = target_model(t)
    canonical, done, again = canonical_twice(model)[:3]
    assert done.get("identity_reshape", 0) == int(t.keeps_shape), f"{t}: {done}"
    left = [n.op_type for n in canonical.graph.node].count("Reshape")
    assert left == int(not t.keeps_shape) and again == 0, f"{t}: {left} left"
    x = np.random.default_rng(length).standard_normal((batch, length, *t.static))
    run_both(model, canonical, feeds={"x": x.astype(np.float32)}, **EXACT)
