"""``pad_into_conv`` (pattern pad_conv): a zero Pad of the spatial axes becomes Conv pads."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    build_model,
    optimize_quiet,
)

HEADERS = {
    10: '<ir_version: 5, opset_import: ["" : 10]>',
    13: '<ir_version: 7, opset_import: ["" : 13]>',
    18: '<ir_version: 8, opset_import: ["" : 18]>',
}


def pad_conv(opset, pad_args, *, pad_attrs="", conv_pads=(0, 0, 0, 0), channels=3, inits=None):
    """x[1,3,6,6] -> Pad(x, ``pad_args``) -> Conv (3x3, ``conv_pads``) -> y."""
    rng = np.random.default_rng(opset)
    arrays = {"w": rng.standard_normal((2, channels, 3, 3)), "cb": rng.standard_normal(2)}
    attrs = f"<{pad_attrs}>" if pad_attrs else ""
    text = f"""{HEADERS[opset]}
    g (float[1, 3, 6, 6] x) => (float[1, 2, H, W] y) {{
        p = Pad {attrs} ({pad_args})
        y = Conv <pads = {list(conv_pads)}> (p, w, cb)
    }}"""
    return build_model(text, arrays | (inits or {}))


def ints(*values):
    return np.array(values, dtype=np.int64)


def conv_pads_of(fused: onnx.ModelProto) -> list[int]:
    (conv,) = fused.graph.node
    (pads,) = [a for a in conv.attribute if a.name == "pads"]
    return list(pads.ints)


CASES = {
    "opset13-pads": (13, "x, pads", {"pads": ints(0, 0, 1, 2, 0, 0, 2, 1)}, "", [1, 2, 2, 1]),
    "opset13-zero-value": (
        13,
        "x, pads, zero",
        {"pads": ints(0, 0, 1, 1, 0, 0, 1, 1), "zero": np.float32(0)},
        "",
        [1, 1, 1, 1],
    ),
    "opset18-pads-axes": (
        18,
        "x, pads, , axes",
        {"pads": ints(1, 2, 2, 1), "axes": ints(2, 3)},
        "",
        [1, 2, 2, 1],
    ),
    "opset18-negative-axes": (
        18,
        "x, pads, , axes",
        {"pads": ints(2, 0, 0, 1), "axes": ints(-1, -2)},
        "",
        [0, 2, 1, 0],
    ),
    "opset18-one-axis": (
        18,
        "x, pads, , axes",
        {"pads": ints(1, 1), "axes": ints(3)},
        "",
        [0, 1, 0, 1],
    ),
    "opset10-attribute": (10, "x", {}, "pads = [0, 0, 1, 0, 0, 0, 0, 2]", [1, 0, 0, 2]),
}


@pytest.mark.parametrize(
    ("opset", "pad_args", "inits", "pad_attrs", "spatial"), CASES.values(), ids=CASES.keys()
)
@pytest.mark.parametrize("conv_pads", [(0, 0, 0, 0), (1, 0, 1, 2)], ids=["conv0", "conv-pads"])
def test_pad_becomes_conv_pads(opset, pad_args, inits, pad_attrs, spatial, conv_pads):
    model = pad_conv(opset, pad_args, pad_attrs=pad_attrs, conv_pads=conv_pads, inits=inits)
    result = optimize_quiet(model)
    fused = assert_fusion(model, result, counts={"pad_conv": 1}, ops=["Conv"], rtol=1e-5, atol=1e-5)
    assert conv_pads_of(fused) == [c + p for c, p in zip(conv_pads, spatial, strict=True)]


# ---------------------------------------------------------------------------------------
# Negative cases.

NEGATIVE = {
    "channel-axis": (
        dict(
            opset=13,
            pad_args="x, pads",
            inits={"pads": ints(0, 1, 1, 1, 0, 0, 1, 1)},
            channels=4,  # the Conv reads the padded channels
        ),
        "pads the batch or channel axis",
    ),
    "channel-axis-via-axes": (
        dict(
            opset=18,
            pad_args="x, pads, , axes",
            inits={"pads": ints(1, 0), "axes": ints(1)},
            channels=4,
        ),
        "pads the batch or channel axis",
    ),
    "nonzero-value": (
        dict(
            opset=13,
            pad_args="x, pads, one",
            inits={"pads": ints(0, 0, 1, 1, 0, 0, 1, 1), "one": np.float32(1)},
        ),
        "does not pad with a constant 0",
    ),
    "reflect-mode": (
        dict(
            opset=13,
            pad_args="x, pads",
            pad_attrs='mode = "reflect"',
            inits={"pads": ints(0, 0, 1, 1, 0, 0, 1, 1)},
        ),
        "pad.mode",
    ),
    "negative-pads": (
        dict(opset=13, pad_args="x, pads", inits={"pads": ints(0, 0, -1, 0, 0, 0, 0, 0)}),
        "negative pads",
    ),
}


@pytest.mark.parametrize(("case", "reason"), NEGATIVE.values(), ids=NEGATIVE.keys())
def test_no_fusion_and_the_reason(case, reason):
    model = pad_conv(**case)
    result = optimize_quiet(model)
    assert result.counts == {}
    assert_no_fusion(
        model, result, pattern="pad_conv", reason=reason, ops=["Pad", "Conv"], rtol=1e-5, atol=1e-5
    )
