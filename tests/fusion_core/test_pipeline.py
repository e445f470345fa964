"""optimize(): rounds, pattern selection, refusals and the numerical check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import onnx_ir as ir
import pytest

from autofusion.fusion_core import CheckOptions, ConfigError, OptimizeConfig, optimize
from autofusion.fusion_core.rewriters import builtin_rewriters
from autofusion.fusion_core.rewriters.fold_batchnorm import FoldBatchNorm
from autofusion.fusion_core.rewriters.fuse_activation import FuseActivation

RNG = np.random.default_rng(3)


def _conv_bn_act(act: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1,3,8,8] x) => (float[1,4,8,8] y) {\n"
        " c = Conv<pads = [1, 1, 1, 1]>(x, w, b)\n"
        " n = BatchNormalization<epsilon = 0.001>(c, gamma, beta, mean, var)\n"
        f" y = {act}(n)\n}}"
    )
    arrays = {
        "w": RNG.normal(0, 0.3, (4, 3, 3, 3)),
        "b": RNG.normal(0, 0.1, 4),
        "gamma": RNG.uniform(0.5, 1.5, 4),
        "beta": RNG.normal(0, 0.1, 4),
        "mean": RNG.normal(0, 0.1, 4),
        "var": RNG.uniform(0.5, 2.0, 4),
    }
    model.graph.initializer.extend(
        nh.from_array(a.astype(np.float32), n) for n, a in arrays.items()
    )
    return model


def test_fusions_compose_across_rounds() -> None:
    # No single pattern covers Conv+BN+Sigmoid: conv_bn folds in round 1, then
    # conv_activation takes the Sigmoid in round 2.
    result = optimize(_conv_bn_act("Sigmoid"), OptimizeConfig(target="onnxruntime"))
    assert result.counts == {"conv_bn": 1, "conv_activation": 1}
    assert [f.round for f in result.applied] == [1, 2]
    assert [n.op_type for n in result.to_proto().graph.node] == ["FusedConv"]
    assert result.rounds == 3  # the last round finds nothing left to do
    assert result.check is not None and result.check.passed
    onnx.checker.check_model(result.to_proto(), full_check=True)


def test_max_rounds_stops_the_loop() -> None:
    config = OptimizeConfig(target="onnxruntime", max_rounds=1)
    result = optimize(_conv_bn_act("Sigmoid"), config)
    assert result.counts == {"conv_bn": 1}
    assert result.ops_after["Sigmoid"] == 1


def test_provenance_follows_fusions_through_rounds() -> None:
    result = optimize(_conv_bn_act("Sigmoid"), OptimizeConfig(target="onnxruntime"))
    (node,) = result.to_proto().graph.node
    props = {p.key: p.value for p in node.metadata_props}
    assert props["autofusion.pattern"] == "conv_activation"
    replaced = props["autofusion.replaced_nodes"]
    for original in ("Conv", "BatchNormalization", "Sigmoid"):
        assert f"<{original}>" in replaced or original in replaced
    assert '"c"' in props["autofusion.replaced_values"]  # the conv output that BN read


def test_patterns_and_exclude_select_what_runs() -> None:
    only = optimize(_conv_bn_act("Relu"), OptimizeConfig(patterns=["conv_bn"]))
    assert only.patterns_used == ["conv_bn"]
    assert only.counts == {"conv_bn": 1}
    without = optimize(_conv_bn_act("Relu"), OptimizeConfig(exclude=["conv_bn_relu", "conv_bn"]))
    assert without.counts == {}


def test_patterns_for_other_targets_are_not_used() -> None:
    result = optimize(_conv_bn_act("Relu"), OptimizeConfig(target="generic"))
    assert "conv_activation" not in result.patterns_used
    assert result.ops_after["Relu"] == 1


@pytest.mark.parametrize("field", ["patterns", "exclude"])
def test_unknown_pattern_name_is_a_config_error(field: str) -> None:
    with pytest.raises(ConfigError, match="no_such_pattern"):
        optimize(_conv_bn_act("Relu"), OptimizeConfig(**{field: ["no_such_pattern"]}))


class _WrongEpsilonFold(FoldBatchNorm):
    """A deliberately broken fold: it ignores the BN's epsilon (uses 1.0)."""

    def rewrite(self, match, params, ctx):  # type: ignore[override]
        bn = match.node(params.batchnorm_node)
        bn.attributes["epsilon"] = ir.AttrFloat32("epsilon", 1.0)
        return super().rewrite(match, params, ctx)


def test_check_catches_a_wrong_rewrite() -> None:
    registry = builtin_rewriters()
    registry.register(_WrongEpsilonFold())
    config = OptimizeConfig(
        patterns=["conv_bn"], check=CheckOptions(rtol=1e-4, atol=1e-5), strict=True
    )  # strict: the failure itself, no fallback (tests/fusion_core/test_fallback.py)
    result = optimize(_conv_bn_act("Relu"), config, registry=registry)
    assert result.counts == {"conv_bn": 1}
    assert result.check is not None
    assert not result.check.passed and result.fallback is None
    (output,) = result.check.outputs
    assert output.name == "y" and not output.passed
    assert output.max_abs_diff > 1e-3
    assert "exceeds atol" in output.detail


class _Refusing(FoldBatchNorm):
    def rewrite(self, match, params, ctx):  # type: ignore[override]
        return "refused for the test"


def test_rewriter_refusal_is_reported_as_near_miss_and_not_retried() -> None:
    registry = builtin_rewriters()
    registry.register(_Refusing())
    result = optimize(_conv_bn_act("Relu"), OptimizeConfig(patterns=["conv_bn"]), registry=registry)
    assert result.counts == {}
    reasons = [m.reason for m in result.near_misses if m.pattern == "conv_bn"]
    assert reasons == ["rewriter 'fold_batchnorm': refused for the test"]
    assert result.rounds == 2


class _RefusingActivation(FuseActivation):
    def rewrite(self, match, params, ctx):  # type: ignore[override]
        return "no fused kernel today"


def test_refused_candidate_does_not_hide_an_overlapping_one() -> None:
    # conv_bn_relu (priority 35) wins the overlap with conv_bn (20) but its rewriter
    # refuses; the next round must still fold the BN with conv_bn.
    registry = builtin_rewriters()
    registry.register(_RefusingActivation())
    result = optimize(_conv_bn_act("Relu"), OptimizeConfig(), registry=registry)
    assert result.counts == {"conv_bn": 1}
    assert [n.op_type for n in result.to_proto().graph.node] == ["Conv", "Relu"]
    assert result.check is not None and result.check.passed


def test_pad_folds_before_the_conv_becomes_a_fused_conv() -> None:
    # pad_conv keeps the Conv a Conv, so it runs first; a FusedConv could not take it.
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1,3,6,6] x) => (float[1,4,8,8] y) {\n"
        " pads = Constant<value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}>()\n"
        " p = Pad(x, pads)\n"
        " c = Conv<pads = [1, 1, 1, 1]>(p, w, b)\n"
        " n = BatchNormalization<epsilon = 0.001>(c, gamma, beta, mean, var)\n"
        " y = Relu(n)\n}"
    )
    model.graph.initializer.extend(_conv_bn_act("Relu").graph.initializer)
    result = optimize(model, OptimizeConfig(target="onnxruntime"))
    assert result.counts == {"pad_conv": 1, "conv_bn_relu": 1}
    assert [n.op_type for n in result.to_proto().graph.node] == ["FusedConv"]
    assert result.check is not None and result.check.passed


def test_near_misses_say_who_said_no() -> None:
    """The default prices the Q/K/V merge as a loss (selection); the rollback and
    measured kinds are asserted in test_validate and test_measured."""
    from autofusion.fusion_core.patterns import NEAR_MISS_KINDS

    bert = Path(__file__).resolve().parents[1] / "data" / "transformers" / "bert_eager_dynamo.onnx"
    result = optimize(bert, OptimizeConfig(target="onnxruntime", check={"enabled": False}))
    kinds = {m.kind for m in result.near_misses}
    assert kinds <= set(NEAR_MISS_KINDS)
    selection = [m for m in result.near_misses if m.kind == "selection"]
    assert selection and all("predicts a loss" in m.reason for m in selection)
    with pytest.raises(ValueError, match="near miss kind"):
        type(selection[0])("p", ("n",), "why", kind="nope")


def test_field_errors_name_the_field_and_drop_pydantics_prefix() -> None:
    from pydantic import ValidationError

    from autofusion.fusion_core.errors import describe_fields, field_errors

    with pytest.raises(ValidationError) as caught:
        OptimizeConfig(max_rounds=0, check={"rtol": "x"})
    pairs = field_errors(caught.value, prefix=("config",))
    assert {f for f, _ in pairs} == {"config.max_rounds", "config.check.rtol"}
    assert not any(m.startswith("Value error, ") for _, m in pairs)
    assert describe_fields(pairs).count("; ") == 1
