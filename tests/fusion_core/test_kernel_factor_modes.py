"""Kernel factors per mode of the fused kernel (docs/cost.md, "Kernel factors").

A target profile's ``kernel_factors`` key is ``name[+group][+mode]``; the cost model
takes the most specific key that the profile has, the groups being the optional groups
the match holds and the modes what the rewriter states its kernel runs in
(``RewriteEffect.modes``). The attention rewriter states ``cache`` when the block reads
a KV cache (``Concat(past, new)`` heads, GroupQueryAttention's past key and value): the
default ``cpu`` profile prices soft-capped attention at 6x its roofline at prefill and
4.3x reading a cache (the decode steps of a generation loop, under the 5x that the
pattern's hints promise: fusion_core/target_profiles/cpu.yaml), so Gemma-2's KV-cache
graph fuses its attention and a prefill-only graph does not, with a near miss naming the
key.

The soft-capped blocks are ``tests/fusion_core/rewriters/test_group_query_attention``'s
eager decoder attention (4 query heads sharing 2 KV heads of 8, rotary, a causal and
padding mask) with Gemma-2's ``c * tanh(s / c)`` spliced between the scale and the mask.
Numerical checks: rtol = atol = 1e-5 (GroupQueryAttention's soft-cap sums in another
order than the ops it replaces; about 1e-6 apart at these sizes).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from pydantic import ValidationError

from autofusion.fusion_core.cost import TargetProfile, fit_kernel_factors, load_target_profile
from autofusion.fusion_core.rewriters import KERNEL_MODES, RewriteEffect
from autofusion.fusion_core.testing import misses, optimize_quiet, run_both
from tests.fusion_core.rewriters.test_group_query_attention import (
    ORT,
    decoder_attention,
    feeds,
)

GQA = "com.microsoft::GroupQueryAttention"
CAP = 5.0  # small enough that tanh bends the scores of the test's weights
CAPPED = ("repeat_kv", "softcap", "mask")
TOL = dict(rtol=1e-5, atol=1e-5)
LOWEST = float(np.finfo(np.float32).min)  # eager attention's mask: finite, no NaN guard


def _profile(**factors: float) -> TargetProfile:
    fields = load_target_profile("cpu").model_dump()
    return TargetProfile.model_validate({**fields, "kernel_factors": factors})


def test_the_most_specific_key_prices_the_kernel() -> None:
    profile = _profile(
        **{
            "attention_block": 2.0,
            "attention_block+cache": 3.0,
            "attention": 4.0,
            "attention+cache": 5.0,
            "attention+softcap": 6.0,
            "attention+softcap+cache": 7.0,
        }
    )
    order = [
        ("attention+softcap+cache", 7.0),
        ("attention+softcap", 6.0),
        ("attention+cache", 5.0),
        ("attention", 4.0),
        ("attention_block+cache", 3.0),
        ("attention_block", 2.0),
    ]
    for key, factor in order:
        assert profile.priced_by("attention_block", "attention", CAPPED, ("cache",)) == key
        assert profile.kernel_factor("attention_block", "attention", CAPPED, ("cache",)) == factor
        profile = _profile(**{k: v for k, v in profile.kernel_factors.items() if k != key})
    assert profile.priced_by("attention_block", "attention", CAPPED, ("cache",)) is None
    assert profile.kernel_factor("attention_block", "attention", CAPPED, ("cache",)) == 1.0


def test_a_mode_key_never_prices_a_kernel_not_in_that_mode() -> None:
    profile = _profile(**{"attention+softcap+cache": 1.5, "attention+cache": 0.9})
    assert profile.priced_by("attention_block", "attention", CAPPED) is None
    assert profile.priced_by("attention_block", "attention", ("mask",), ("cache",)) == (
        "attention+cache"
    )
    assert profile.priced_by("attention_block", None, CAPPED, ("cache",)) is None


KEY_WORD = st.text("abcdefghijklmnopqrstuvwxyz_0123456789.-", min_size=1, max_size=8)


@given(
    name=KEY_WORD,
    group=KEY_WORD,
    mode=st.sampled_from(KERNEL_MODES),
    entries=st.sets(st.sampled_from(["name+group+mode", "name+group", "name"]), min_size=1),
)
def test_a_key_is_taken_only_when_no_more_specific_one_is_there(name, group, mode, entries):
    spelled = {
        "name+group+mode": f"{name}+{group}+{mode}",
        "name+group": f"{name}+{group}",
        "name": name,
    }
    profile = _profile(**{spelled[e]: 2.0 for e in entries})
    found = profile.priced_by("rewriter_x", name, (group,), (mode,))
    first = next(e for e in ("name+group+mode", "name+group", "name") if e in entries)
    assert found == spelled[first]


@pytest.mark.parametrize(
    "key", ["attention + softcap", "attention+", "+cache", "a+b+c+d", "attention+soft cap"]
)
def test_a_malformed_key_is_refused_with_its_grammar(key) -> None:
    with pytest.raises(ValidationError, match=r"name\[\+group\]\[\+mode\]"):
        _profile(**{key: 2.0})


def test_an_unknown_mode_is_a_bug_of_the_rewriter() -> None:
    with pytest.raises(ValueError, match="unknown kernel modes"):
        RewriteEffect(("a",), modes=("kv",))


def softcapped_attention(*, cache: bool) -> onnx.ModelProto:
    """The eager decoder attention with ``CAP * tanh(scores / CAP)`` before the mask."""
    model = decoder_attention(cache=cache, eager=True, lowest=LOWEST)
    graph = model.graph
    graph.initializer.append(numpy_helper.from_array(np.array(CAP, np.float32), "cap"))
    (add,) = [n for n in graph.node if n.output[0] == "biased"]
    add.input[0] = "capped"
    at = next(i for i, n in enumerate(graph.node) if n.output[0] == "scores") + 1
    capped = [
        helper.make_node("Div", ["scores", "cap"], ["cap_in"], name="cap_div"),
        helper.make_node("Tanh", ["cap_in"], ["cap_tanh"], name="cap_tanh"),
        helper.make_node("Mul", ["cap_tanh", "cap"], ["capped"], name="cap_mul"),
    ]
    for offset, node in enumerate(capped):
        graph.node.insert(at + offset, node)
    onnx.checker.check_model(model)
    return model


def _gains(result) -> list[dict]:
    return [f.predicted_gain for f in result.applied if f.pattern == "attention"]


def test_a_soft_capped_attention_reading_a_cache_fuses_on_the_default_profile() -> None:
    model = softcapped_attention(cache=True)
    result = optimize_quiet(model, target_profile="cpu", **ORT)
    assert result.counts.get("attention") == 1, result.near_misses
    (gain,) = _gains(result)
    assert gain["kernel_factor_key"] == "attention+softcap+cache"
    assert (
        gain["kernel_factor"]
        == load_target_profile("cpu").kernel_factors["attention+softcap+cache"]
    )
    fused = result.to_proto()
    (gqa,) = [n for n in fused.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["softcap"] == pytest.approx(CAP)
    assert list(gqa.input[3:5]) == ["past_key", "past_value"]
    for batch, seq, past in [(1, 1, 5), (2, 1, 7), (1, 4, 0)]:
        for mask in ("none", "left"):
            run_both(model, fused, feeds=feeds(batch, seq, past, mask), **TOL)


def test_a_soft_capped_prefill_stays_unfused_with_the_key_that_priced_it() -> None:
    result = optimize_quiet(softcapped_attention(cache=False), target_profile="cpu", **ORT)
    assert "attention" not in result.counts
    reasons = [r for r in misses(result, "attention") if "predicts a loss" in r]
    assert reasons, result.near_misses
    assert all("kernel_factors: attention+softcap;" in r for r in reasons), reasons
    assert all("6x its roofline" in r for r in reasons), reasons


def test_without_the_cap_both_graphs_fuse_on_the_default_profile() -> None:
    """The factors are the soft-cap's: the plain attention fuses with or without a cache,
    priced by no key."""
    for cache in (True, False):
        result = optimize_quiet(
            decoder_attention(cache=cache, eager=True, lowest=LOWEST), target_profile="cpu", **ORT
        )
        assert result.counts.get("attention") == 1, result.near_misses
        assert all(g["kernel_factor_key"] is None for g in _gains(result))


def _profiled(rewriter: str, key: str | None, factor: float, predicted, measured) -> dict:
    """A profiled report's fusion, priced with ``factor`` under ``key``."""
    return {
        "rewriter": rewriter,
        "provenance": {"from_fusions": []},
        "predicted_gain": {
            "before_us": predicted[0],
            "after_us": predicted[1],
            "kernel_factor": factor,
            "kernel_factor_key": key,
        },
        "measured_gain": {"before_us": measured[0], "after_us": measured[1]},
    }


def test_calibration_learns_per_key_that_priced_the_regions() -> None:
    """A region priced by ``attention+softcap+cache`` at 1.5 that measured twice its
    predicted ratio teaches that key 3.0, apart from the same rewriter's plain regions."""
    report = {
        "applied": [
            # predicted 0.5 with factor 1.5, measured 1.0: the key's factor is 2 * 1.5
            _profiled("attention_block", "attention+softcap+cache", 1.5, (10, 5), (20, 20)),
            # no key priced it: the rewriter's, measured as predicted
            _profiled("attention_block", None, 1.0, (10, 5), (20, 10)),
        ]
    }
    _, fitted = fit_kernel_factors([report])
    by_key = {f.key: f.factor for f in fitted}
    assert by_key == pytest.approx({"attention+softcap+cache": 3.0, "attention_block": 1.0})
    fields = load_target_profile("cpu").model_dump()
    learned = TargetProfile.model_validate({**fields, "kernel_factors": by_key})
    assert learned.priced_by("attention_block", "attention", CAPPED, ("cache",)) == (
        "attention+softcap+cache"
    )
