"""One pattern whose search raises costs only that pattern (fusion_core/patterns/_matcher.py,
fusion_core/pipeline/rounds.py).

Before, an exception while matching any one pattern (a bug of ours in a probe or a
constraint, on a graph nobody tried) was "matching and rewriting raised": the pass gave
the model back unfused, every other pattern's fusions lost with it. Now the matcher
finds the others' candidates, the pattern is a rejected step (``step: match``) left out
of the later rounds, and the rest fuses as before. The model is a generated chain of
blocks the built-in SiLU pattern fuses and blocks only a test pattern matches (Relu then
Neg), whose search raises; the pattern that raises may also be the built-in one.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import jsonschema
import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.patterns import Match, Matcher, PatternSpec
from autofusion.fusion_core.pipeline import optimize
from autofusion.fusion_core.report import build_report, report_schema
from autofusion.fusion_core.rewriters import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    builtin_rewriters,
)
from autofusion.fusion_core.testing import build_model, run_both
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = {"rtol": 1e-5, "atol": 1e-6}
BROKEN = "test.relu_neg"
BLOCKS = {
    "silu": "s{i} = Sigmoid (h{i})\n    h{o} = Mul (h{i}, s{i})",
    "relu_neg": "r{i} = Relu (h{i})\n    n{i} = Neg (r{i})\n    h{o} = Add (n{i}, h{i})",
}
PATTERN = {
    "name": BROKEN,
    "description": "Relu then Neg, a pattern whose search raises in this test",
    "priority": 90,
    "targets": ["generic", "onnxruntime"],
    "nodes": [
        {"id": "first", "op": "Relu", "inputs": {"0": "$x"}},
        {"id": "neg", "op": "Neg", "inputs": {"0": "first"}},
    ],
    "rewriter": {"name": "negated_relu"},
}


class _NegatedRelu(Rewriter):
    """-relu(x) as min(-x, 0): the same values, and no Relu then Neg left to match."""

    name = "negated_relu"

    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite:
        zero = ctx.initializer("zero", np.zeros((), dtype=np.float32))
        neg = ir.Node("", "Neg", [match.nodes["first"].inputs[0]])
        low = ir.Node("", "Min", [neg.outputs[0], zero])
        return Rewrite([neg, low], [(match.nodes["neg"].outputs[0], low.outputs[0])])


def _chain(kinds: list[str]):
    body = "\n    ".join(BLOCKS[k].format(i=i, o=i + 1) for i, k in enumerate(kinds))
    return build_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[n, 8] h0) => (float[n, 8] h{len(kinds)}) {{
        {body}
    }}
    """)


@contextmanager
def _search_raises(name: str):
    """Pattern ``name``'s search raises when the matcher plans it (a context, not a
    fixture: each generated example gets its own)."""
    plan = Matcher._plan

    def raising(self, pattern: PatternSpec, index):
        if pattern.name == name:
            raise KeyError(f"a probe read a value {pattern.name} never binds")
        return plan(self, pattern, index)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Matcher, "_plan", raising)
        yield


def _optimize(model, **options):
    registry = builtin_rewriters()
    registry.register(_NegatedRelu())
    config = OptimizeConfig(
        target="onnxruntime", target_profile="cpu-roofline", extra_patterns=[PATTERN], **options
    )
    return optimize(model, config, registry=registry)


KINDS = st.lists(st.sampled_from(sorted(BLOCKS)), min_size=2, max_size=6).filter(
    lambda kinds: "silu" in kinds
)


@SPELLINGS
@given(kinds=KINDS, progressive=st.booleans())
def test_a_pattern_whose_search_raises_costs_only_itself(kinds, progressive) -> None:
    model = _chain(kinds)
    with _search_raises(BROKEN):
        result = _optimize(model, progressive=progressive)

    assert result.counts == {"silu": kinds.count("silu")}, (kinds, result.rejected)
    rejected = [(r.step, r.name) for r in result.rejected]
    assert rejected == [("match", BROKEN)], rejected
    assert "KeyError" in result.rejected[0].failed and "never binds" in result.rejected[0].failed
    assert result.check is not None and result.check.passed
    run_both(model, result.to_proto(), **TOL)


def test_the_other_patterns_still_fuse_when_a_builtin_pattern_raises() -> None:
    model = _chain(["silu", "relu_neg", "silu", "relu_neg"])
    with _search_raises("silu"):
        result = _optimize(model)

    assert result.counts == {BROKEN: 2}, result.rejected
    assert [(r.step, r.name) for r in result.rejected] == [("match", "silu")]
    report = build_report(result)
    jsonschema.validate(json.loads(json.dumps(report)), report_schema())  # the contract
    assert [r["step"] for r in report["rejected"]] == ["match"]
    run_both(model, result.to_proto(), **TOL)
