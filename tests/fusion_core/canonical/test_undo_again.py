"""The canonical form and its undo, run again on their own output.

Progressive validation starts each stage from the last stage's output, so a model that
went through ``canonical_form`` and ``undo_unused`` once goes through them again. The
undos name what they put back after the node they rewrite (``<node>_factor``,
``<node>_one``, ``<node>_indices``, ``<node>_axes``); the second pass found those names
taken ("Initializer ... is already registered"), the run was rejected and nothing fused
(the fallback kept 0 of BLT's fusions). Generated with the attention and blend spellings
of ``test_attention_spellings`` and ``test_blend_masks``: the undos of the scales, the
repeats by Gather, one KV head and the blended masks all run there. The outputs must be
the original's: rtol = atol = 1e-5, as those tests.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings

from autofusion.fusion_core.canonical import canonical_form, undo_unused
from autofusion.fusion_core.testing import run_both
from tests.fusion_core.canonical.test_attention_spellings import (
    Spelling,
    attention_block,
    spellings,
)
from tests.fusion_core.canonical.test_attention_spellings import feeds as attention_feeds
from tests.fusion_core.canonical.test_blend_masks import Blend, blend_block, blends
from tests.fusion_core.canonical.test_blend_masks import feeds as blend_feeds
from tests.fusion_core.spelling_settings import EXAMPLES

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
SETTINGS = settings(  # half the shared budget, its own health checks
    max_examples=max(5, EXAMPLES // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _twice(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` after two runs of the canonical form and its undo, the second on the
    first's output (no fusion between, so each undoes all it can)."""
    for _ in range(2):  # each a run of its own, as the pipeline's stages are
        work = ir.from_proto(onnx.shape_inference.infer_shapes(model, data_prop=True))
        canonical_form(work.graph, _fresh_names(work.graph))
        undo_unused(work.graph)
        model = ir.to_proto(work)
    return model


def _fresh_names(graph: ir.Graph):
    """New names as the pipeline makes them (``RewriteContext.fresh_name``): a hint,
    suffixed where the graph has the name."""
    used = {n.name for n in graph} | set(graph.initializers)
    used |= {v.name for n in graph for v in n.outputs} | {v.name for v in graph.inputs}

    def fresh(hint: str) -> str:
        name, k = hint, 1
        while name in used:
            name, k = f"{hint}_{k}", k + 1
        used.add(name)
        return name

    return fresh


@SETTINGS
@given(spellings())
def test_an_attention_block_goes_through_the_form_and_its_undo_twice(s: Spelling) -> None:
    model = attention_block(s)
    again = _twice(model)
    shapes = [(1, 3, 2), (2, 1, 5)] if s.cache else [(1, 3, 0), (2, 4, 0)]
    for batch, seq, past in shapes:
        run_both(model, again, feeds=attention_feeds(s, batch, seq, past, padded=True), **TOL)


@SETTINGS
@given(blends())
def test_a_blended_mask_goes_through_the_form_and_its_undo_twice(b: Blend) -> None:
    model = blend_block(b)
    again = _twice(model)
    seq = 5 if b.sliced else b.seq
    run_both(model, again, feeds=blend_feeds(b, 2, seq, padded=True), **TOL)
