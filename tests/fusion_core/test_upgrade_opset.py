"""``OptimizeConfig.upgrade_opset`` (fusion_core/prepasses/opset.py): the model is
converted with onnx's version converter before the pre-passes, so the generic target
can emit ops of the newer opset (HardSwish from 14, Swish from 24); a conversion onnx
cannot do is a ConfigError that says what to do, and the report says what was done.

Tolerance: rtol = atol = 1e-5 (the fused activations, see test_hardswish.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from autofusion.fusion_core import OptimizeConfig
from autofusion.fusion_core import testing as h
from autofusion.fusion_core.errors import ConfigError

TOL = dict(rtol=1e-5, atol=1e-5)

HARDSWISH_BODY = """
    c0 = Conv <pads = [1, 1, 1, 1]> (x, w)
    a = BatchNormalization (c0, bn_scale, bn_bias, bn_mean, bn_var)
    s = Add (a, three)
    {clip}
    p = Mul (a, c)
    y = Div (p, six)
"""


def hardswish_model(opset: int, seed: int = 0) -> onnx.ModelProto:
    """An opset-``opset`` Conv + BN + HardSwish written out (Clip bounds as attributes
    below opset 11, as inputs from 11)."""
    rng = np.random.default_rng(seed)
    clip = "c = Clip <min = 0.0, max = 6.0> (s)" if opset < 11 else "c = Clip (s, zero, six)"
    inits = {"w": rng.standard_normal((8, 4, 3, 3)) * 1.5, **h.bn_params(rng, 8)}
    inits |= {"three": np.asarray(3.0), "six": np.asarray(6.0)}
    if opset >= 11:
        inits["zero"] = np.asarray(0.0)
    text = f"""<ir_version: 7, opset_import: ["" : {opset}]>
    g (float[2, 4, 5, 5] x) => (float[2, 8, 5, 5] y) {{
    {HARDSWISH_BODY.replace("{clip}", clip)}
    }}"""
    return h.build_model(text, inits)


@pytest.mark.parametrize("opset", [10, 11, 12])
def test_generic_emits_hardswish_after_the_upgrade(opset):
    model = hardswish_model(opset)
    result = h.optimize_quiet(model, target="generic", upgrade_opset=14)
    fused = h.assert_fusion(
        model,
        result,
        counts={"conv_bn": 1, "hard_swish_div": 1},
        ops=["Conv", "HardSwish"],
        **TOL,
    )
    assert {o.domain: o.version for o in fused.opset_import}[""] == 14
    assert result.prepasses[0] == f"upgrade_opset: {opset} -> 14"
    assert not h.misses(result, "hard_swish")


def test_without_the_upgrade_the_reason_names_it():
    model = hardswish_model(11)
    result = h.optimize_quiet(model, target="generic")
    assert result.counts == {"conv_bn": 1, "hard_swish_div": 1}
    assert h.op_sequence(result.to_proto()) == ["Conv", "HardSigmoid", "Mul"]
    assert h.misses(result, "hard_swish") == [
        "rewriter 'hard_swish': ONNX HardSwish needs opset 14; the model imports opset 11 "
        "(--upgrade-opset 14 converts it)"
    ]
    assert not any(p.startswith("upgrade_opset") for p in result.prepasses)


def test_onnxruntime_target_after_the_upgrade():
    """onnxruntime runs HardSwish as HardSigmoid + Mul: the same pair at opset 14."""
    model = hardswish_model(11)
    result = h.optimize_quiet(model, target="onnxruntime", upgrade_opset=14)
    h.assert_fusion(
        model,
        result,
        counts={"conv_bn": 1, "hard_swish_div": 1},
        ops=["Conv", "HardSigmoid", "Mul"],
        **TOL,
    )


def test_swish_pattern_after_an_upgrade_to_24():
    model = h.build_model(
        """<ir_version: 7, opset_import: ["" : 13]>
        g (float[2, 8] x) => (float[2, 8] y) {
            s = Sigmoid (x)
            y = Mul (x, s)
        }"""
    )
    pattern = {
        "name": "mine.silu_swish",
        "targets": ["generic"],
        "nodes": [
            {"id": "sig", "op": "Sigmoid", "inputs": {0: "$x"}},
            {"id": "out", "op": "Mul", "inputs": {1: "sig"}},
        ],
        "rewriter": {"name": "silu", "params": {"swish": True}},
    }
    result = h.optimize_quiet(
        model,
        target="generic",
        upgrade_opset=24,
        patterns=["mine.silu_swish"],
        extra_patterns=[pattern],
    )
    h.assert_fusion(model, result, counts={"mine.silu_swish": 1}, ops=["Swish"], **TOL)
    assert result.prepasses[0] == "upgrade_opset: 13 -> 24"


def test_a_model_at_or_above_the_opset_is_left_as_it_is():
    model = hardswish_model(14)
    result = h.optimize_quiet(model, target="generic", upgrade_opset=12)
    assert {o.domain: o.version for o in result.to_proto().opset_import}[""] == 14
    assert result.prepasses[0] == "upgrade_opset: the model imports opset 14, left as it is"
    assert h.op_sequence(result.to_proto()) == ["Conv", "HardSwish"]


def test_a_conversion_onnx_cannot_do_is_a_config_error():
    """onnxruntime's own LayerNormalization in the ONNX domain below opset 17: the
    converter has no adapter for it."""
    model = onnx.parser.parse_model(
        """<ir_version: 7, opset_import: ["" : 11]>
        g (float[2, 4, 6] x, float[6] s, float[6] b) => (float[2, 4, 6] y) {
            y = LayerNormalization (x, s, b)
        }"""
    )
    with pytest.raises(ConfigError) as info:
        h.optimize_quiet(model, upgrade_opset=17)
    message = str(info.value)
    assert message.startswith("cannot convert this model to opset 17: ")
    assert "LayerNormalization" in message
    assert message.endswith("; run without --upgrade-opset")


def test_an_opset_onnx_does_not_know_is_a_config_error():
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(ConfigError, match=f"knows opsets up to {newest}; run without"):
        h.optimize_quiet(hardswish_model(11), upgrade_opset=newest + 1)


def test_the_field_is_validated_and_round_trips_as_json():
    with pytest.raises(ValidationError):
        OptimizeConfig(upgrade_opset=0)
    config = OptimizeConfig(upgrade_opset=14)
    assert OptimizeConfig.model_validate_json(config.model_dump_json()).upgrade_opset == 14
    assert OptimizeConfig().upgrade_opset is None
