"""One pass of the pipeline: ``optimize_once(model, config) -> Result``.

load -> pre-passes -> rounds of match, select and rewrite (``rounds.py``) -> clean up
-> the written form (``written.py``) -> size cap (``size_cap.py``) -> check (``check.py``)

This is the whole of a plain run, and what progressive validation and measured
selection build each of their variants with. Every step is a transaction
(``transaction.py``): a pre-pass or canonical rule that breaks the graph makes the pass
start again from the model as loaded, without that step, and say so in
``Result.rejected``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common

from autofusion.fusion_core.canonical import describe as describe_canonical
from autofusion.fusion_core.catalog import CompiledPattern, builtin_patterns, compile_all
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.errors import ConfigError, FusionError, PatternError
from autofusion.fusion_core.ir import (
    load_model,
    model_from_proto,
    proto_with_weights,
    weightless_proto,
)
from autofusion.fusion_core.pipeline.check import check_against_original
from autofusion.fusion_core.pipeline.left_alone import left_alone
from autofusion.fusion_core.pipeline.result import Rejection, Result
from autofusion.fusion_core.pipeline.rounds import RewriteRounds, subgraphs
from autofusion.fusion_core.pipeline.size_cap import check_output_size
from autofusion.fusion_core.pipeline.switches import resolve_switches
from autofusion.fusion_core.pipeline.transaction import (
    MAX_RETRIES,
    StepFailed,
    StepGuard,
    describe_exception,
)
from autofusion.fusion_core.pipeline.written import written_form
from autofusion.fusion_core.prepasses import (
    FoldRecord,
    PrepassOptions,
    constant_bytes,
    run_prepasses,
)
from autofusion.fusion_core.prepasses.opset import upgrade_opset
from autofusion.fusion_core.rewriters import RewriterRegistry, builtin_rewriters
from autofusion.fusion_core.targets import get_target
from autofusion.fusion_core.validate import ModelFile

__all__ = ["optimize_once", "original_of", "select_patterns", "unchanged"]


def optimize_once(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    *,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    skip: Mapping[tuple[str, frozenset[str]], str] | None = None,
    skip_kind: str = "rollback",
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> Result:
    """One pass of ``optimize`` (pre-passes, rounds of fusion, the check), neither
    measured nor in progressive stages, whatever ``config.mode`` says: what those
    modes build each variant with (in measured mode each pass proposes, keeping what
    the cost model prices as a loss: ``fusion_core.strategies.pricing``). ``on_phase``
    hears each phase as it starts: ``load``, ``prepasses``, ``fuse``, ``check``."""
    registry, phase = registry or builtin_rewriters(), on_phase or _no_phase
    rejected: list[Rejection] = []
    left_out: set[tuple[str, str]] = set()  # (step, name) a failed run leaves out
    skip = dict(skip or {})
    while True:
        try:
            result = _one_pass(
                model, config, registry, patterns, skip, skip_kind, feeds, phase, left_out
            )
        except StepFailed as failure:
            rejection = failure.rejection
            rejected.append(rejection)
            step = (rejection.step, rejection.name)
            if failure.fatal or step in left_out or len(rejected) > MAX_RETRIES:
                # nothing left to leave out: the model as it came, checked, never a crash
                result = unchanged(model, config, feeds)
                result.rejected = rejected
                return result
            if rejection.step == "rewrite":  # this fusion is left out of the next run
                key = (rejection.name, frozenset(rejection.nodes))
                skip[key] = f"rolled back as a bug: {rejection.failed}"
            else:
                left_out.add(step)
            continue
        result.rejected = rejected + result.rejected
        return result


def _one_pass(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    registry: RewriterRegistry,
    patterns: Sequence[CompiledPattern] | None,
    skip: Mapping[tuple[str, frozenset[str]], str],
    skip_kind: str,
    feeds: Sequence[Mapping[str, np.ndarray]] | None,
    phase: Callable[[str], None],
    left_out: set[tuple[str, str]],
) -> Result:
    timings: dict[str, float] = {}
    start = time.perf_counter()
    phase("load")
    original, work = _load(model, keep_original=config.check.enabled)
    timings["load"] = time.perf_counter() - start

    config, switched = resolve_switches(config, work)
    chosen = select_patterns(config, registry, patterns)
    result = Result(model=work, target=config.target, patterns_used=[p.name for p in chosen])
    result.switches = [s.to_dict() for s in switched]
    _measure_input(result, work)

    start = time.perf_counter()
    phase("prepasses")
    disabled = {name for step, name in left_out if step == "pre-pass"}
    work, result.prepasses, result.folding = _prepasses(work, config, disabled)
    result.model = work
    timings["prepasses"] = time.perf_counter() - start

    phase("fuse")
    result.left_alone = left_alone(work, len(subgraphs(work.graph)))  # before our contrib ops
    rules = frozenset(name for step, name in left_out if step == "canonical")
    rounds = RewriteRounds(chosen, config, skip=skip, skip_kind=skip_kind, disabled_rules=rules)
    try:
        fused = rounds(work)
    except (StepFailed, FusionError):
        raise
    except Exception as exc:  # outside any one step (matching, selection): no fusion at all
        failed = describe_exception("matching and rewriting", exc)
        raise StepFailed(Rejection("rounds", "rounds", (), failed), fatal=True) from exc
    timings["match"], timings["rewrite"] = fused.match_s, fused.rewrite_s
    result.applied, result.near_misses = fused.applied, fused.near_misses
    result.rounds, result.structure = fused.rounds, fused.structure
    result.selections = fused.selections
    result.rejected = fused.rejected
    result.prepasses += describe_canonical(fused.canonical)

    _cleanup_and_write(work, result, config, timings)
    check_output_size(result, config)  # before onnxruntime loads a model past the cap
    result.ops_after, result.subgraph_ops_after = _op_counts(work)

    if config.check.enabled and original is not None:
        start = time.perf_counter()
        phase("check")
        keep_fp32 = {p.name for p in chosen if p.spec.keep_fp32}
        check_against_original(result, original, config, keep_fp32, feeds)
        timings["check"] = time.perf_counter() - start
    result.timings = timings
    return result


def _cleanup_and_write(
    work: ir.Model, result: Result, config: OptimizeConfig, timings: dict[str, float]
) -> None:
    """The clean-up, then the written form the profile asks for (``written.py``): what
    is checked and timed from here on is the file the user gets."""
    _cleanup(work, timings)
    written = written_form(work, config)
    result.prepasses += written.lines
    result.inferred = written.inferred


def _cleanup(work: ir.Model, timings: dict[str, float]) -> None:
    """What the rewrites left unused goes; the nodes are sorted again."""
    start = time.perf_counter()
    try:
        common.RemoveUnusedNodesPass()(work)
        common.TopologicalSortPass()(work)
    except Exception as exc:  # every step was checked: this is a bug of ours, not the model's
        failed = describe_exception("the clean-up after the rounds", exc)
        raise StepFailed(Rejection("pre-pass", "cleanup", (), failed)) from exc
    timings["cleanup"] = time.perf_counter() - start


def _no_phase(_name: str) -> None:
    pass


def _prepasses(
    work: ir.Model, config: OptimizeConfig, disabled: set[str]
) -> tuple[ir.Model, list[str], FoldRecord | None]:
    """The opt-in opset upgrade (fusion_core/prepasses/opset.py), then the other
    pre-passes but ``disabled``, each checked as a step; what they did, in the report's
    words, and what constant folding was allowed and left (None: it did not run)."""
    work, upgrade = upgrade_opset(work, config.upgrade_opset)
    guard = StepGuard(work, config.target, "pre-pass")
    folding: list[FoldRecord] = []
    prepasses = run_prepasses(
        work, _prepass_options(config), disabled=disabled, guard=guard, folding=folding
    )
    if upgrade is not None:  # the report says what the upgrade did
        prepasses.insert(0, upgrade.describe())
    return work, prepasses, folding[-1] if folding else None


def _load(
    model: ir.Model | onnx.ModelProto | str | os.PathLike, *, keep_original: bool
) -> tuple[onnx.ModelProto | ModelFile | None, ir.Model]:
    """The original as the check takes it and an independent working copy.

    A file stays a file: the check hands onnxruntime the path (its external data read
    where it lies) and reads the graph from ``weightless_proto``, so the weights are not
    read in here and no proto of them is kept (the working copy's tensors stay lazy). A
    model in memory is kept as a proto with its weights, as before."""
    if isinstance(model, (str, os.PathLike)):
        loaded = load_model(model)  # refuses hostile external-data paths: onnxruntime may read it
        if not keep_original:  # no check: nothing to keep
            return None, loaded
        return ModelFile(Path(model), weightless_proto(loaded)), loaded
    if isinstance(model, onnx.ModelProto):
        return model, model_from_proto(model)
    original = proto_with_weights(model)  # a lazy tensor's bytes too: a proto has no folder
    return original, ir.serde.deserialize_model(original)


def original_of(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
) -> onnx.ModelProto | ModelFile:
    """The model as the caller gave it, as the check takes it (a proto with its weights,
    or its file): what every verdict is measured against (never a copy after the
    pre-passes)."""
    original, _ = _load(model, keep_original=True)
    assert original is not None
    return original


def unchanged(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> Result:
    """The model as it came, no pre-pass and no fusion, checked like any result: what
    a run hands back when not even the model without fusions passes its check."""
    original, work = _load(model, keep_original=True)
    result = Result(model=work, target=config.target, patterns_used=[])
    _measure_input(result, work)
    result.ops_after, result.subgraph_ops_after = _op_counts(work)
    if config.check.enabled and original is not None:
        check_against_original(result, original, config, set(), feeds)
    return result


def select_patterns(
    config: OptimizeConfig,
    registry: RewriterRegistry,
    patterns: Sequence[CompiledPattern] | None = None,
) -> list[CompiledPattern]:
    """The patterns this run uses: for the target, filtered by include/exclude."""
    available = list(patterns) if patterns is not None else builtin_patterns(registry)
    names = {p.name for p in available}
    for extra in compile_all(config.extra_patterns, registry):
        if extra.name in names:
            raise PatternError(
                f"pattern name {extra.name!r} is already taken",
                hint="give your pattern its own name, e.g. in a namespace: mycompany.conv_bn",
            )
        names.add(extra.name)
        available.append(extra)
    asked = set(config.patterns or []) | set(config.exclude)
    unknown = sorted(asked - names)
    if unknown:
        raise ConfigError(
            f"unknown pattern name(s) {unknown}",
            hint="`autofusion patterns list` shows the available patterns",
        )
    get_target(config.target)
    chosen = [
        p
        for p in available
        if config.target in p.spec.targets
        and (config.patterns is None or p.name in config.patterns)
        and p.name not in config.exclude
    ]
    return chosen


def _prepass_options(config: OptimizeConfig) -> PrepassOptions:
    return PrepassOptions(
        fold_constants=config.fold_constants,
        fold_input_size_limit=config.fold_input_size_limit,
        fold_output_size_limit=config.fold_output_size_limit,
        fold_growth_ratio=config.fold_growth_ratio,
        fold_growth_floor_bytes=config.fold_growth_floor_bytes,
        shape_inference=config.shape_inference,
    )


def _measure_input(result: Result, work: ir.Model) -> None:
    """What the report compares the result with: the input's op counts and constant bytes."""
    result.ops_before, result.subgraph_ops_before = _op_counts(work)
    result.input_bytes = constant_bytes(work)


def _op_counts(model: ir.Model) -> tuple[Counter, Counter]:
    """Op types of the main graph, and of the If/Loop/Scan bodies apart: a body's nodes
    are not the model's nodes (an If emitted with two branches runs one of them)."""
    main = Counter(_op_name(n) for n in model.graph)
    every = Counter(_op_name(n) for n in ir.traversal.RecursiveGraphIterator(model.graph))
    return main, every - main


def _op_name(node: ir.Node) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
