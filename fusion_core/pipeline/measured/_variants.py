"""The models measured selection compares, each built from the original with one pass.

Every variant is ``optimize_once`` on the original with some fusions skipped (by
pattern and node names) or some patterns excluded: the proposal, the proposal without
one group, the model with the kept groups, and the original as it came. The config is
the caller's, in measured mode, so each pass proposes the way the proposal did.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.ir import load_model
from autofusion.fusion_core.patterns import NearMiss
from autofusion.fusion_core.pipeline.measured._groups import Decision, SkipMap, group_fusions
from autofusion.fusion_core.pipeline.once import optimize_once
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.rewriters import RewriterRegistry

__all__ = ["PASSES", "Variants", "as_proto"]

PASSES = 3  # builds (or measuring passes) until what reappears settles


@dataclass(frozen=True)
class Variants:
    """How to build a variant: the original, the caller's config, patterns and inputs."""

    original: onnx.ModelProto
    config: OptimizeConfig
    feeds: Sequence[Mapping[str, np.ndarray]] | None
    registry: RewriterRegistry | None
    patterns: Sequence[CompiledPattern] | None

    @property
    def unchecked(self) -> OptimizeConfig:
        """The config without its check: what is only timed is not checked."""
        check = self.config.check.model_copy(update={"enabled": False})
        return self.config.model_copy(update={"check": check})

    def build(
        self,
        config: OptimizeConfig,
        skip: SkipMap,
        feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    ) -> Result:
        return optimize_once(
            self.original,
            config,
            registry=self.registry,
            patterns=self.patterns,
            skip=skip,
            skip_kind="selection",
            feeds=feeds,
        )

    def proposal(self) -> Result:
        return self.build(self.unchecked, {})

    def without(self, skip: SkipMap) -> onnx.ModelProto:
        """The proposal without the fusions ``skip`` names, unchecked."""
        return self.build(self.unchecked, skip).to_proto()

    def unchanged(self) -> Result:
        """The original as it came: no pattern at all (leaving every group out would let
        others fuse instead), no constant folding, no shape rewrites, no opset upgrade;
        checked as the caller asked."""
        update = {
            "patterns": [],
            "fold_constants": False,
            "shape_inference": False,
            "upgrade_opset": None,
        }
        return self.build(self.config.model_copy(update=update), {}, self.feeds)

    def decided(self, decisions: Mapping[str, Decision], *, checked: bool) -> Result:
        """The model without the groups decided against, each left-out fusion a near miss
        with its reason; ``checked``: checked as the caller asked, on their inputs.

        A pattern none of whose groups is kept is excluded outright: a skipped fusion can
        rename what a later round matches, so skipping by node names could let it back in
        elsewhere. A dropped group of a pattern that also has a kept group is skipped by
        its nodes, and the model built again if it reappears."""
        config, feeds = (self.config, self.feeds) if checked else (self.unchecked, None)
        kept_patterns = {d.group.pattern for d in decisions.values() if d.kept}
        dropped = [d for d in decisions.values() if not d.kept]
        excluded = {d.group.pattern for d in dropped} - kept_patterns
        config = config.model_copy(update={"exclude": sorted(set(config.exclude) | excluded)})
        reasons = {d.group.key: d.reason for d in dropped if d.group.pattern in kept_patterns}
        skip: SkipMap = {}
        for decision in dropped:
            if decision.group.key in reasons:
                skip.update(decision.group.skip(decision.reason))
        for _ in range(PASSES):
            result = self.build(config, skip, feeds)
            again = {}
            for group in group_fusions(result.applied):
                if group.key in reasons:
                    again.update(group.skip(reasons[group.key]))
            if not again:
                break
            skip.update(again)
        result.near_misses += [
            NearMiss(f.pattern, f.replaced_nodes, d.reason, "selection")
            for d in dropped
            if d.group.pattern in excluded
            for f in d.group.fusions
        ]
        return result


def as_proto(model: ir.Model | onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """The original as a proto, its external data read in (every variant is built from it)."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model)  # refuses hostile external-data paths
        ir.external_data.load_to_model(model)
    return ir.to_proto(model)
