"""The rounds of fusion as a pass: everything it did comes back in its result."""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core import OptimizeConfig, testing
from autofusion.fusion_core.catalog import builtin_patterns
from autofusion.fusion_core.ir import model_from_proto
from autofusion.fusion_core.pipeline import RewriteRounds, RoundsResult
from autofusion.fusion_core.rewriters import builtin_rewriters


def test_the_rounds_rewrite_in_place_and_return_what_they_did() -> None:
    model = model_from_proto(testing.conv_bn_relu())
    patterns = builtin_patterns(builtin_rewriters())
    skip = {("no_such_pattern", frozenset({"n"})): "a caller's skip"}
    result = RewriteRounds(patterns, OptimizeConfig(), skip=skip, skip_kind="selection")(model)
    assert isinstance(result, RoundsResult) and isinstance(result, ir.passes.PassResult)
    assert result.model is model and result.modified
    assert result.applied and result.rounds >= 1 and not result.structure
    assert "BatchNormalization" not in [n.op_type for n in model.graph]
    # the caller's skip is reported, and left as it was given
    assert skip == {("no_such_pattern", frozenset({"n"})): "a caller's skip"}
    skipped = [m for m in result.near_misses if m.pattern == "no_such_pattern"]
    assert [(m.reason, m.kind) for m in skipped] == [("a caller's skip", "selection")]


def test_nothing_to_fuse_is_not_a_modification() -> None:
    model = model_from_proto(testing.conv_bn_relu())
    result = RewriteRounds([], OptimizeConfig())(model)
    assert not result.modified and result.applied == [] and result.rounds == 1
