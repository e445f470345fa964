"""A measured group's prediction names the kernel-factor key that priced it, so that
``calibrate --from-verdicts`` fits that key and not the rewriter's (issue 24's factors by
mode: the soft-capped attention with a cache is priced apart from the plain one)."""

from __future__ import annotations

from autofusion.fusion_core.pipeline.measured import group_fusions
from autofusion.fusion_core.pipeline.result import AppliedFusion


def _fusion(name: str, key: str | None, factor: float | None) -> AppliedFusion:
    gain = {"before_us": 10.0, "after_us": 4.0, "saved_us": 6.0}
    gain |= {"kernel_factor_key": key, "kernel_factor": factor}
    return AppliedFusion(
        "attention", (name,), (f"{name}_fused",), ("GroupQueryAttention",), 1,
        rewriter="attention_block", predicted_gain=gain,
    )  # fmt: skip


def test_a_group_priced_by_one_key_names_it_and_its_factor() -> None:
    fusions = [_fusion(f"layer{i}", "attention+softcap+cache", 4.3) for i in range(3)]
    (group,) = group_fusions(fusions)
    predicted = group.predicted()
    assert predicted["kernel_factor_key"] == "attention+softcap+cache"
    assert predicted["kernel_factor"] == 4.3
    assert predicted["before_us"] == 30.0 and predicted["rewriter"] == "attention_block"


def test_a_group_priced_by_several_keys_names_none() -> None:
    fusions = [_fusion("a", "attention+softcap", 6.0), _fusion("b", "attention", 1.0)]
    (group,) = group_fusions(fusions)
    predicted = group.predicted()
    assert "kernel_factor_key" not in predicted and "kernel_factor" not in predicted
    assert predicted["fusions"] == 2


def test_a_key_priced_by_different_factors_keeps_the_key_only() -> None:
    fusions = [_fusion("a", "attention", 1.0), _fusion("b", "attention", 2.0)]
    predicted = group_fusions(fusions)[0].predicted()
    assert predicted["kernel_factor_key"] == "attention" and "kernel_factor" not in predicted
    unpriced = group_fusions([_fusion("c", None, None)])[0].predicted()
    assert "kernel_factor_key" not in unpriced
