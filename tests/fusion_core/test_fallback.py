"""A failed check falls back (fusion_core/pipeline/fallback.py): the largest set of fusions
that passes is kept and the dropped ones are named; ``strict`` keeps the failure.

The wrong fusion is a registered rewriter that computes something else (valid ops, wrong
values), as a rewriter bug would; the model also holds a SiLU the built-ins fuse.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.pipeline import optimize
from autofusion.fusion_core.rewriters import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    builtin_rewriters,
)
from autofusion.fusion_core.testing import build_model, run_both
from autofusion.fusion_core.validate import MISMATCH, describe_failure
from tests.fusion_core.test_transactions import MODEL, TOL, _relu_neg

WRONG = _relu_neg("forgets_neg")  # Relu then Neg, rewritten as Relu alone


class _ForgetsNeg(Rewriter):
    name = "forgets_neg"

    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite:
        relu = ir.Node("", "Relu", [match.nodes["relu"].inputs[0]])
        return Rewrite([relu], [(match.nodes["neg"].outputs[0], relu.outputs[0])])


def _optimize(model: onnx.ModelProto, **config):
    registry = builtin_rewriters()
    registry.register(_ForgetsNeg())
    options = OptimizeConfig(
        target="onnxruntime", target_profile="cpu-roofline", extra_patterns=[WRONG], **config
    )
    return optimize(model, options, registry=registry)


@pytest.mark.parametrize("progressive", [False, True])
def test_a_failed_check_keeps_the_fusions_that_pass_and_names_the_dropped(progressive) -> None:
    model = build_model(MODEL)
    result = _optimize(model, progressive=progressive)

    assert result.check is not None and result.check.passed, result.check
    assert result.counts == {"silu": 1}, result.counts
    if progressive:  # it rolled the fusion back itself: nothing failed to fall back from
        assert result.fallback is None
        dropped = result.rollbacks
    else:
        fallback = result.fallback
        assert fallback is not None and fallback["failure"] == MISMATCH
        assert fallback["reason"].startswith("the fused model does not match the original")
        assert (fallback["kept"], fallback["unchanged"], fallback["fusions_tried"]) == (1, False, 2)
        dropped = fallback["dropped"]
    assert [d["pattern"] for d in dropped] == ["test.forgets_neg"], dropped
    assert "output 'y'" in dropped[0]["error"]
    run_both(model, result.to_proto(), **TOL)


def test_strict_keeps_the_failure() -> None:
    result = _optimize(build_model(MODEL), strict=True)

    assert result.fallback is None
    assert not result.check.passed and result.check.failure == MISMATCH
    assert describe_failure(result.check).startswith("the fused model does not match")
    assert result.counts == {"silu": 1, "test.forgets_neg": 1}


def test_without_a_fusion_that_passes_the_model_comes_back_as_it_was(monkeypatch) -> None:
    from autofusion.fusion_core.pipeline import fallback

    def nothing_passes(model, config, **kwargs):  # as if a pre-pass changed the values
        failed = _optimize(build_model(MODEL), strict=True)
        return failed

    monkeypatch.setattr(fallback, "progressive_as_configured", nothing_passes)
    model = build_model(MODEL)
    result = _optimize(model)

    assert result.fallback["unchanged"] and result.fallback["kept"] == 0
    assert "with the fusions that passed alone" in result.fallback["reason"]
    assert result.check.passed and result.applied == []
    fused = result.to_proto()
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node]
    run_both(model, fused, rtol=0, atol=0)
