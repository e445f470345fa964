"""Dynamic switches (patterns turned off or on by the input shapes) and the stages of
progressive mode given in the config."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest
from pydantic import ValidationError

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, testing
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.patterns import compile_condition
from autofusion.fusion_core.patterns._formula import FormulaError
from autofusion.fusion_core.report import build_report


def conv_bn_relu(width: str | int = "width") -> onnx.ModelProto:
    """x[1, 3, 4, width] -> Conv -> BatchNormalization -> Relu; width may be symbolic."""
    return testing.conv_bn_relu(height=4, width=width)


WIDE = "dim('$x', -1) > 1024"


def _run(model: onnx.ModelProto, switches: list[dict], profiles: list[dict], **extra):
    config = OptimizeConfig(
        target="onnxruntime",
        switches=switches,
        check=CheckOptions(profiles=profiles, samples=1),
        **extra,
    )
    return optimize(model, config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dim('$x', -1)", "one comparison"),
        ("1 < dim('$x', 0) < 4", "one comparison"),
        ("dim('$x', -1) in 3", "one comparison"),
        ("__import__('os').system('true') > 0", "not allowed"),
        ("dim(conv.out0, 1) > 3", "is not a graph input"),
        ("dim('$x', 1) >", "is not a condition"),
    ],
)
def test_a_condition_outside_the_grammar_is_refused(text, message):
    with pytest.raises(FormulaError, match=message):
        compile_condition(text)


def test_the_config_rejects_a_bad_switch_with_the_reason():
    with pytest.raises(ValidationError, match="one comparison"):
        OptimizeConfig(switches=[{"when": "dim('$x', 0)", "disable": ["conv_bn_relu"]}])
    with pytest.raises(ValidationError, match="give one list"):
        OptimizeConfig(switches=[{"when": WIDE, "disable": ["a"], "enable": ["b"]}])
    with pytest.raises(ValidationError, match="give one list"):
        OptimizeConfig(switches=[{"when": WIDE}])


def test_a_disable_switch_fires_on_a_wide_input_only():
    switch = {"when": WIDE, "disable": ["conv_bn_relu"]}
    narrow = _run(conv_bn_relu(), [switch], [{"width": 512}])
    assert narrow.counts == {"conv_bn_relu": 1}
    assert narrow.switches == [
        {
            "when": WIDE,
            "action": "disable",
            "patterns": ["conv_bn_relu"],
            "fired": False,
            "per_profile": [False],
        }
    ]
    wide = _run(conv_bn_relu(), [switch], [{"width": 2048}])
    assert "conv_bn_relu" not in wide.counts
    assert "conv_bn_relu" not in wide.patterns_used
    assert wide.switches[0]["fired"] is True and wide.switches[0]["per_profile"] == [True]
    assert wide.check.passed  # what else fused still matches the original


def test_a_static_dimension_is_read_from_the_graph():
    result = _run(conv_bn_relu(2048), [{"when": WIDE, "disable": ["conv_bn_relu"]}], [])
    assert result.switches[0]["fired"] is True
    assert "conv_bn_relu" not in result.counts


def test_disable_fires_in_any_profile_enable_needs_every_profile():
    profiles = [{"width": 512}, {"width": 2048}]
    disable = _run(conv_bn_relu(), [{"when": WIDE, "disable": ["conv_bn_relu"]}], profiles)
    assert disable.switches[0]["per_profile"] == [False, True]
    assert disable.switches[0]["fired"] is True
    assert "conv_bn_relu" not in disable.counts

    enable = {"when": WIDE, "enable": ["conv_bn_relu"]}
    mixed = _run(conv_bn_relu(), [enable], profiles, exclude=["conv_bn_relu"])
    assert mixed.switches[0]["fired"] is False
    assert "conv_bn_relu" not in mixed.counts
    both_wide = [{"width": 2048}, {"width": 4096}]
    enabled = _run(conv_bn_relu(), [enable], both_wide, patterns=["conv_bn"])
    assert enabled.switches[0]["fired"] is True
    assert enabled.counts == {"conv_bn_relu": 1}  # added to the job's own pattern list


def test_an_undecidable_condition_does_not_fire_and_says_why():
    result = _run(conv_bn_relu(), [{"when": WIDE, "disable": ["conv_bn_relu"]}], [])
    (why,) = result.switches[0]["per_profile"]
    assert "symbolic ('width')" in why and "no shape profile names it" in why
    assert result.switches[0]["fired"] is False
    assert result.counts == {"conv_bn_relu": 1}
    missing = _run(conv_bn_relu(), [{"when": "dim('$y', 0) > 1", "disable": ["conv_bn"]}], [])
    assert "has no input 'y'" in missing.switches[0]["per_profile"][0]


def test_a_switch_naming_an_unknown_pattern_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown pattern"):
        _run(conv_bn_relu(2048), [{"when": WIDE, "disable": ["no_such_pattern"]}], [])


def test_switches_and_their_outcome_reach_the_report():
    result = _run(conv_bn_relu(2048), [{"when": WIDE, "disable": ["conv_bn_relu"]}], [])
    report = build_report(result)
    assert report["switches"] == result.switches and report["switches"][0]["fired"] is True


def test_progressive_mode_applies_switches_to_every_stage():
    switch = {"when": WIDE, "disable": ["conv_bn_relu"]}
    result = _run(conv_bn_relu(), [switch], [{"width": 2048}], progressive=True)
    assert result.switches[0]["fired"] is True
    assert "conv_bn_relu" not in result.counts and result.check.passed


def test_the_config_names_the_progressive_stages():
    model = conv_bn_relu(16)
    default = _run(model, [], [], progressive=True)  # folds ("*_bn") first, the rest after
    assert default.counts == {"conv_bn": 1, "conv_activation": 1}
    whole = _run(model, [], [], progressive=True, stages=[["conv_bn_relu"]])
    assert whole.counts == {"conv_bn_relu": 1}
    # One stage of BatchNormalization folds only: the Relu stays on its own.
    only_folds = _run(model, [], [], progressive=True, stages=[["conv_bn"]])
    assert only_folds.counts == {"conv_bn": 1}
    assert only_folds.check.passed
    # Two stages: the fold first, then the activation joins the folded Conv.
    staged = _run(model, [], [], progressive=True, stages=[["conv_bn"], ["conv_activation"]])
    assert staged.counts == {"conv_bn": 1, "conv_activation": 1}
    assert [a.round for a in staged.applied] == [1, 1]  # each in its own stage's first round
    assert staged.check.passed


def test_stages_must_not_be_empty():
    with pytest.raises(ValidationError):
        OptimizeConfig(progressive=True, stages=[])
