"""Run the original and the fused model side by side in onnxruntime and compare.

onnxruntime's own graph optimizations are disabled for both sessions, so the check
measures our rewrite and not onnxruntime's. The check is Monte Carlo: ``samples``
seeded random samples (``random_inputs``) per shape profile, or the caller's feeds.
Every output is compared element by element with
``|fused - original| <= atol + rtol * |original|`` (numpy's ``allclose`` rule) against
its own tolerance: the one given for it by name in ``tolerances``, else the default for
its dtype (``default_tolerance``: float32/float64 the configured rtol/atol, float16 and
bfloat16 looser, integers and bool exact). Statistics (``_stats``) are kept per profile
and over all profiles; the verdict passes when every output passes in every profile.

The two sessions run one after the other, never side by side: the original on every
sample first (its outputs kept: a few tensors), its session released, then the fused
model on the same samples. A session holds its own copy of the weights (onnxruntime packs
MatMul weights), so at most one copy is alive. A model may be given as a file
(``ModelFile``): onnxruntime then reads it and its external data where they lie, with no
serialized copy of the weights in memory. A model that quantizes activations at run time
gets a noise floor (``_floor.py``) and, with MatMulNBits at accuracy_level 4, a second
comparison at level 0 (``_exact.py``); a model that computes in float16 gets its own
(``_floor_fp16.py``).

The parts, each in its module: the plan of profiles, seeds and tolerances (``_plans.py``),
the original's runs (``_reference.py``), the sessions (``_sessions.py``), and what the
check found, in the words every consumer uses (``_result.py``). This module runs the
fused model against them and concludes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from autofusion.fusion_core.validate._dims import input_dims
from autofusion.fusion_core.validate._exact import (
    EXACT_LEVEL,
    ExactCheck,
    at_level,
    nbits_at_int8,
    nbits_count,
    run_exact,
)
from autofusion.fusion_core.validate._floor import (
    NoiseFloor,
    activation_quantizers,
    measure_floors,
    perturbed,
)
from autofusion.fusion_core.validate._floor_fp16 import float16_floor, float16_parts, in_float32
from autofusion.fusion_core.validate._inputs import FloatDistribution, random_inputs
from autofusion.fusion_core.validate._plans import (
    Plan,
    checked_tolerances,
    make_plans,
    tolerance_for,
)
from autofusion.fusion_core.validate._reference import Expected, Ran, run_original
from autofusion.fusion_core.validate._result import (
    CANNOT_LOAD,
    FUSED_CANNOT_RUN,
    MISMATCH,
    CheckResult,
    OutputCheck,
    first_line,
)
from autofusion.fusion_core.validate._sessions import (
    ModelFile,
    ModelSource,
    edited_session,
    make_session,
)
from autofusion.fusion_core.validate._stats import ErrorStats, Tolerance

__all__ = ["compare_models"]


def compare_models(
    original: ModelSource,
    fused: ModelSource,
    *,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    samples: int = 2,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    profiles: Sequence[Mapping[str, int]] | None = None,
    tolerances: Mapping[str, Mapping[str, float]] | None = None,
    distribution: FloatDistribution | None = None,
    int_high: int = 2,
) -> CheckResult:
    """Compare every output of ``fused`` against ``original`` (each a proto or a file).

    ``profiles`` lists values for symbolic dims, one dict per shape profile; without it
    ``dims`` is the single profile. Sample ``j`` of profile ``p`` is drawn with seed
    ``seed + p * samples + j``. ``feeds`` replaces the generated samples (one profile).
    ``tolerances`` maps an output name to ``{"rtol": .., "atol": ..}`` (either may be
    left out: it then comes from the dtype default). A name that is not an output, or
    a dim that is not a symbolic dim of an input, raises ConfigError; onnxruntime
    failures are reported in ``error``.
    """
    graph = original.graph_proto() if isinstance(original, ModelFile) else original
    overrides = checked_tolerances(tolerances or {}, [o.name for o in graph.graph.output])
    plans = make_plans(graph, samples, seed, dims, profiles, feeds)
    result = CheckResult(passed=False, samples=plans[0].samples, seed=seed)
    result.dynamic_dims = input_dims(graph).names
    generate = functools.partial(random_inputs, graph, int_high=int_high, distribution=distribution)
    expected = run_original(original, plans, generate, result)
    if expected is None:
        return result
    dtypes = expected.dtypes
    tols = {n: tolerance_for(dtype, rtol, atol, overrides.get(n)) for n, dtype in dtypes.items()}
    configured = tols  # the level-0 comparison's (validate/_exact.py)
    if expected.pending is None:  # before the fused session: one session at a time
        tols = _noise_floor(original, graph, expected, tols, result)
    candidate = _open_fused(fused, result)
    if candidate is None:
        return result
    if expected.pending is not None:
        raise expected.pending  # an input the generator cannot make: the caller's to fix
    new_stats = result.noise_floor.stats if result.noise_floor else _plain_stats
    overall = {n: new_stats(n, tol) for n, tol in tols.items()}
    for plan, ran in zip(plans, expected.plans, strict=True):
        _compare_profile(plan, ran, candidate, expected, tols, overall, len(plans) > 1, result)
    del candidate  # one session at a time: the level-0 ones follow
    _exact_check(original, fused, graph, expected, configured, result)
    return _conclude(result, dtypes, overall)


def _compare_profile(
    plan: Plan,
    ran: Ran,
    candidate: ort.InferenceSession,
    expected: Expected,
    tols: dict[str, Tolerance],
    overall: dict[str, ErrorStats],
    several: bool,
    result: CheckResult,
) -> None:
    """One profile's fused runs against the original's, into ``result``: the profile's
    check and, the first time one fails, the check's error, named by its profile when
    there are several. A profile the original could not run at is noted, not compared."""
    if ran.skipped is not None:
        if ran.skipped:
            result.skipped.append(f"{plan.check.dims}: {ran.skipped}")
        return
    new_stats = result.noise_floor.stats if result.noise_floor else _plain_stats
    stats = {n: new_stats(n, tol) for n, tol in tols.items()}
    error, failure = _compare_runs(candidate, expected.names, ran, [stats, overall])
    check, dtypes = plan.check, expected.dtypes
    check.error = error
    check.outputs = [OutputCheck.from_stats(n, dtypes[n], stats[n]) for n in dtypes]
    check.passed = error is None and all(o.passed for o in check.outputs)
    if error and result.error is None:
        where = f" (profile {len(result.profiles)}: {check.dims})" if several else ""
        result.error, result.failure = f"{error}{where}", failure
    result.profiles.append(check)


def _conclude(
    result: CheckResult, dtypes: dict[str, str], overall: dict[str, ErrorStats]
) -> CheckResult:
    """Every output over all profiles, and the verdict."""
    result.outputs = [
        OutputCheck.from_stats(n, dtypes[n], overall[n], _overall_detail(n, overall[n], result))
        for n in dtypes
    ]
    exact = result.noise_floor.exact if result.noise_floor else None
    result.passed = (
        result.error is None
        and all(p.passed for p in result.profiles)
        and (exact is None or exact.passed is not False)
    )
    if not result.passed and result.failure is None:
        result.failure = MISMATCH
    return result


def _plain_stats(name: str, tol: Tolerance) -> ErrorStats:
    return ErrorStats(tol)


def _noise_floor(
    original: ModelSource,
    graph: onnx.ModelProto,
    expected: Expected,
    tols: dict[str, Tolerance],
    result: CheckResult,
) -> dict[str, Tolerance]:
    """``tols`` widened to the noise floor when the original quantizes activations at
    run time (``validate/_floor.py``) or else computes in float16 (``_floor_fp16.py``),
    the floor in ``result.noise_floor``; else as given."""
    kinds, activations = activation_quantizers(graph)
    if kinds:
        floor, edit = NoiseFloor(kinds), functools.partial(perturbed, activations=activations)
    elif parts := float16_parts(graph):
        floor, edit = float16_floor(parts), in_float32
    else:
        return tols
    result.noise_floor = floor
    runs = [pair for ran in expected.plans for pair in zip(ran.feeds, ran.outputs, strict=True)]
    try:
        floors = measure_floors(lambda: edited_session(original, edit), expected.names, runs)
    except Exception as exc:  # onnxruntime raises many types: the configured check then
        floor.error = f"the noise floor could not be measured: {first_line(str(exc))}"
        floor.reason = floor.error + "; outputs compared with the tolerance before it"
        return tols
    return floor.widen(tols, floors)


def _exact_check(
    original: ModelSource,
    fused: ModelSource,
    graph: onnx.ModelProto,
    expected: Expected,
    tols: dict[str, Tolerance],
    result: CheckResult,
) -> None:
    """Where the original has MatMulNBits at accuracy_level 4, both models again at
    level 0 on the same feeds, held to ``tols`` (``validate/_exact.py``): into
    ``result.noise_floor.exact``. Not run when the comparison with the floor failed."""
    floor = result.noise_floor
    if floor is None or not nbits_at_int8(graph):
        return
    fused_graph = fused.graph_proto() if isinstance(fused, ModelFile) else fused
    nodes = {"original": nbits_count(graph), "fused": nbits_count(fused_graph)}
    exact = floor.exact = ExactCheck(nodes)
    if result.error is not None or not all(p.passed for p in result.profiles):
        exact.reason = "not run: the comparison with the noise floor failed already"
        return
    feeds = [feed for ran in expected.plans for feed in ran.feeds]
    start = time.perf_counter()
    try:
        run_exact(
            lambda: edited_session(original, at_level),
            lambda: edited_session(fused, at_level),
            expected.names,
            feeds,
            tols,
            exact,
        )
    except Exception as exc:  # onnxruntime raises many types: the floor's verdict then
        exact.error = f"the level-0 comparison could not run: {first_line(str(exc))}"
    exact.seconds = time.perf_counter() - start
    exact.reason = exact.error or (
        f"both models ran again with every MatMulNBits at accuracy_level {EXACT_LEVEL} (A not "
        "quantized, fp32 sums) and were compared with the tolerance before the floor"
    )


def _open_fused(fused: ModelSource, result: CheckResult) -> ort.InferenceSession | None:
    """The fused model's session, or None with the reason in ``result``."""
    try:
        return make_session(fused)
    except Exception as exc:
        result.error = f"onnxruntime cannot load the fused model: {first_line(str(exc))}"
        result.failure = CANNOT_LOAD
        return None


def _compare_runs(
    candidate: ort.InferenceSession,
    names: list[str],
    ran: Ran,
    into: list[dict[str, ErrorStats]],
) -> tuple[str | None, str | None]:
    """The fused model on each feed the original ran, adding each output to the stats
    ``into``; the onnxruntime failure that stopped either and whose it was (a ``failure``
    kind), if any: the first in feed order, as when the two ran side by side."""
    for feed, expected in zip(ran.feeds, ran.outputs, strict=True):
        try:
            actual = candidate.run(names, dict(feed))
        except Exception as exc:
            return f"the fused model fails to run: {first_line(str(exc))}", FUSED_CANNOT_RUN
        for name, want, got in zip(names, expected, actual, strict=True):
            for stats in into:
                stats[name].update(np.asarray(want), np.asarray(got))
    return ran.error, ran.failure


def _overall_detail(name: str, stats: ErrorStats, result: CheckResult) -> str:
    detail = stats.detail()
    failing = [
        index
        for index, profile in enumerate(result.profiles)
        if any(o.name == name and not o.passed for o in profile.outputs)
    ]
    if detail and len(result.profiles) > 1 and failing:
        detail += f" (fails in profile(s) {failing})"
    return detail
