"""``kt_of_folded_heads`` on its own (test_folded_key_transpose.py's blocks): it writes
MiniMax-M3's K^T once and a second run changes nothing; alone it is exact (rtol = atol
= 0: the same elements moved); and what is not the key's swap stays, the model computing
what it did (rtol = atol = 1e-5, as the generator's: an attention may still fuse over
it). The negative cases turn the split back to ``[B, N, H, L]`` by a Transpose after it,
so the model runs at every size: a merge of the heads with the length (``[B, N * L,
H]``), a split back with the batch and the heads swapped (``[N, B, H, L]``) or the last
two sizes (``[B, N, L, H]``). Each would be another layout of the same elements, not the
swap; neither this rule nor ``kt_by_reshape`` may take it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import onnx
import onnx_ir as ir

from autofusion.fusion_core.canonical import canonical_form
from autofusion.fusion_core.testing import fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.canonical.test_folded_key_transpose import (
    MINIMAX,
    TOL,
    Folded,
    feeds,
    folded_block,
    shapes_run,
)

RULE = "kt_of_folded_heads"


SMALL = replace(MINIMAX, heads=4, kv_heads=2, size=8)


def _canonical_without_kt_by_reshape(model: onnx.ModelProto) -> tuple[dict, int]:
    """The rules that applied to ``model`` (after onnx's inference) with
    ``kt_by_reshape`` disabled, as in a graph whose inferred dims prove nothing for it,
    and how many applied on a second run."""
    work = ir.from_proto(onnx.shape_inference.infer_shapes(model, data_prop=True))
    counter = itertools.count()

    def fresh(hint: str) -> str:
        return f"{hint}__{next(counter)}"

    disabled = {"kt_by_reshape"}
    done = canonical_form(work.graph, fresh, disabled=disabled)
    return dict(done), sum(canonical_form(work.graph, fresh, disabled=disabled).values())


def test_the_rule_writes_the_key_transpose_once_and_again_changes_nothing() -> None:
    done, again = _canonical_without_kt_by_reshape(folded_block(SMALL))
    assert done.get(RULE) == 1, done
    assert again == 0, done


def test_the_rule_alone_is_exact() -> None:
    """With no pattern to fuse, the canonical form's one Transpose computes the three
    nodes' elements bit for bit, and stays (nothing to undo)."""
    model = folded_block(SMALL)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    kinds = [n.op_type for n in canonical.graph.node]
    names = " ".join(n.name for n in canonical.graph.node)
    # kt_by_reshape, on proven sizes too since cced33e, takes it first where it proves it
    assert "Softmax" in kinds and (RULE in names or "sequence_first" in names), kinds
    for shape in shapes_run(SMALL):
        run_both(model, canonical, feeds=feeds(SMALL, *shape), rtol=0, atol=0)


def _assert_stays(s: Folded) -> None:
    """Neither K^T rule rewrites the spelling (its split is still there), with or
    without ``kt_by_reshape``, and the model computes what it did (rtol = atol = 1e-5:
    an attention may still fuse over the Transpose after it, summing in another order)."""
    model = folded_block(s)
    done, _ = _canonical_without_kt_by_reshape(model)
    assert RULE not in done, done
    fused = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    kept = {o for node in fused.model.graph.node for o in node.output}
    assert "kt_split" in kept, f"{s}: {fused.ops}"
    for shape in shapes_run(s):
        run_both(model, fused.model, feeds=feeds(s, *shape), **TOL)


def test_a_merge_of_the_heads_with_the_length_stays() -> None:
    """``[B, N * L, H]``: the heads merged with the length, not the batch; the split's
    element count still matches, but its elements are not the key's swap."""
    _assert_stays(replace(SMALL, merge="other_axes"))


def test_a_split_back_with_the_batch_and_the_heads_swapped_stays() -> None:
    """``[N, B, H, L]`` (run at batches other than N): the elements of another layout."""
    _assert_stays(replace(SMALL, split="lead_swapped"))


def test_a_split_back_with_the_last_two_sizes_swapped_stays() -> None:
    """``[B, N, L, H]`` of ``[B * N, H, L]`` rows (L is never H at the shapes run)."""
    _assert_stays(replace(SMALL, split="tail_swapped"))
