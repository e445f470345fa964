"""RoFormer's rotary across layers: every layer's query and key rotated by the two parts
of ONE sinusoidal table gathered at ``Range(0, S)``, each layer cutting the parts again
(TorchScript's ``chunk`` per layer). The four fused ``RotaryEmbedding`` ops read one
cos/sin cache pair, on both targets (before, each layer's cut had its own pair of
initializers); and on onnxruntime they read the position ids ``Range(0, S)`` as the
op's one-element offset ``[0]`` (row ``s`` for every batch), so no rotary builds
``[B, S]`` position ids of its own (before, each built them with an Unsqueeze, a Shape,
a Concat and an Expand: 16 nodes for two layers). Ids that are not ``0 .. S - 1``
(``Range(0, S) + 1``) stay the op's ``[B, S]`` ids. Outputs agree with the original at
rtol = atol = 1e-5 (about 1e-6 measured).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import build_model, fuse_quiet, run_both
from tests.fusion_core.decoder_text import PICK_CONSTANTS

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, HEADS, HALF, POSITIONS, LAYERS = 16, 2, 4, 24, 2
HEAD = 2 * HALF
POSITION_OPS = ("Expand", "Range", "Unsqueeze", "Concat", "Shape")


def _table() -> np.ndarray:
    """RoFormer's ``embed_positions`` weight: ``[sin | cos]`` of ``pos / 10000^(2i/2h)``."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(HALF) * 2 / HEAD))
    angles = np.arange(POSITIONS, dtype=np.float64)[:, None] * inv_freq
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def _layer(lines: list[str], layer: int) -> list[str]:
    """One layer: its own cut of the table, its query and key rotated by it."""
    p = f"l{layer}"
    lines += [
        f"{p}_sin, {p}_cos = Split <axis = -1> (t4, halves)",
        f"{p}_sa = Unsqueeze ({p}_sin, last)",
        f"{p}_sb = Unsqueeze ({p}_sin, last)",
        f"{p}_sp = Concat <axis = -1> ({p}_sa, {p}_sb)",
        f"{p}_sin2 = Reshape ({p}_sp, flat)",
        f"{p}_ca = Unsqueeze ({p}_cos, last)",
        f"{p}_cb = Unsqueeze ({p}_cos, last)",
        f"{p}_cp = Concat <axis = -1> ({p}_ca, {p}_cb)",
        f"{p}_cos2 = Reshape ({p}_cp, flat)",
    ]
    for which in ("q", "k"):
        x = f"{p}_{which}"
        lines += [
            f"{x}_proj = MatMul (h, w_{x})",
            f"{x}_heads = Reshape ({x}_proj, heads)",
            f"{x}_x = Transpose <perm = [0, 2, 1, 3]> ({x}_heads)",
            f"{x}_even = Slice ({x}_x, zero, end, last, two)",
            f"{x}_odd = Slice ({x}_x, one, end, last, two)",
            f"{x}_neg = Neg ({x}_odd)",
            f"{x}_ra = Unsqueeze ({x}_neg, last)",
            f"{x}_rb = Unsqueeze ({x}_even, last)",
            f"{x}_rp = Concat <axis = -1> ({x}_ra, {x}_rb)",
            f"{x}_shape = Shape ({x}_x)",
            f"{x}_rot = Reshape ({x}_rp, {x}_shape)",
            f"{x}_xc = Mul ({x}_x, {p}_cos2)",
            f"{x}_rs = Mul ({x}_rot, {p}_sin2)",
            f"{x} = Add ({x}_xc, {x}_rs)",
        ]
    return lines


def two_layers(shifted: bool = False, generic: bool = False) -> onnx.ModelProto:
    """Two layers' queries and keys (4 rotations) of one gathered table; ``shifted``
    gathers it at ``Range(0, S) + 1`` instead."""
    rng = np.random.default_rng(7)
    ids = "ids_0 = Range (zero_scalar, length, one_scalar)"
    lines = [
        "h_shape = Shape (h)",
        "length = Gather <axis = 0> (h_shape, one_scalar)",
        *([ids, "ids = Add (ids_0, one_scalar)"] if shifted else [ids.replace("ids_0", "ids")]),
        "g = Gather <axis = 0> (table, ids)",
        "t4 = Unsqueeze (g, axes_0_1)",
    ]
    for layer in range(LAYERS):
        _layer(lines, layer)
    outputs = [f"l{layer}_{w}" for layer in range(LAYERS) for w in ("q", "k")]
    inits = {f"w_{o}": rng.standard_normal((HIDDEN, HEADS * HEAD)) / 4 for o in outputs}
    inits |= {
        "heads": np.array([0, 0, HEADS, HEAD], np.int64),
        "table": _table(),
        "halves": np.array([HALF, HALF], np.int64),
        "flat": np.array([1, 1, -1, HEAD], np.int64),
        **PICK_CONSTANTS,
    }
    ir_version, opset = (10, 23) if generic else (8, 18)
    shown = ", ".join(f"float[B, {HEADS}, S, {HEAD}] {o}" for o in outputs)
    text = f"""<ir_version: {ir_version}, opset_import: ["" : {opset}]>
    g (float[B, S, {HIDDEN}] h) => ({shown}) {{
        {chr(10).join(lines)}
    }}"""
    return build_model(text, inits)


FEEDS = {"h": np.random.default_rng(8).standard_normal((2, 7, HIDDEN)).astype(np.float32)}


def _rotaries(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "RotaryEmbedding"]


def _constant(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    found = [t for t in model.graph.initializer if t.name == name]
    return onnx.numpy_helper.to_array(found[0]) if found else None


def _fused(shifted: bool, target: str):
    model = two_layers(shifted=shifted, generic=target == "generic")
    fused = fuse_quiet(model, target=target)
    assert fused.result.counts["rotary_embedding_interleaved"] == 4, fused.misses_about("rotary")
    assert len(_rotaries(fused.model)) == 4
    onnx.checker.check_model(fused.model, full_check=True)
    run_both(model, fused.model, feeds=FEEDS, **TOL)
    return fused


@pytest.mark.parametrize("target", ["onnxruntime", "generic"])
@pytest.mark.parametrize("shifted", [False, True], ids=["range", "shifted"])
def test_layers_read_one_cache_pair(shifted: bool, target: str) -> None:
    fused = _fused(shifted, target)
    caches = (2, 3) if target == "onnxruntime" else (1, 2)  # ONNX's: (x, cos, sin, ids)
    assert len({tuple(n.input[i] for i in caches) for n in _rotaries(fused.model)}) == 1


def test_positions_zero_to_s_are_the_ops_offset() -> None:
    fused = _fused(False, "onnxruntime")
    for node in _rotaries(fused.model):  # input 1: position ids, the one-element offset [0]
        offset = _constant(fused.model, node.input[1])
        assert offset is not None and offset.tolist() == [0], node.input[1]
    assert fused.ops_among(POSITION_OPS) == []  # was 4 x (Unsqueeze, Shape, Concat, Expand)


@pytest.mark.parametrize("target", ["onnxruntime", "generic"])
def test_ids_that_are_not_zero_to_s_stay_the_ops_ids(target: str) -> None:
    fused = _fused(True, target)
    ids = 1 if target == "onnxruntime" else 3
    for node in _rotaries(fused.model):
        assert _constant(fused.model, node.input[ids]) is None  # [B, S] ids computed
