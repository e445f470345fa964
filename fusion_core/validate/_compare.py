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
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.ir import PROTOBUF_LIMIT_BYTES
from autofusion.fusion_core.validate._dims import (
    CANDIDATES,
    InputDims,
    candidate_dims,
    input_dims,
    second_length_dims,
)
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
    external_folder,
    measure_floors,
    perturbed,
)
from autofusion.fusion_core.validate._floor_fp16 import float16_floor, float16_parts, in_float32
from autofusion.fusion_core.validate._inputs import FloatDistribution, random_inputs
from autofusion.fusion_core.validate._stats import (
    HISTOGRAM_EDGES,
    ErrorStats,
    Tolerance,
    default_tolerance,
)

__all__ = [
    "FAILURE_WORDS",
    "CheckResult",
    "ModelFile",
    "OutputCheck",
    "ProfileCheck",
    "compare_models",
    "describe_failure",
    "make_session",
]


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs_diff: float
    max_rel_diff: float
    rtol: float
    atol: float
    passed: bool
    detail: str = ""
    dtype: str = ""
    elements: int = 0  # compared, over all samples
    mismatches: int = 0  # elements outside the tolerance
    mean_abs_diff: float = 0.0
    cosine_similarity: float | None = None
    # Counts of |error| per decade bin; CheckResult.histogram_edges are the lower edges.
    histogram: list[int] = field(default_factory=list)
    tolerance_source: str = ""  # "configured", "override", "default for float16", ...

    @classmethod
    def from_stats(cls, name: str, dtype: str, stats: ErrorStats, detail: str = "") -> OutputCheck:
        tol = stats.tolerance
        return cls(
            name=name,
            max_abs_diff=stats.max_abs,
            max_rel_diff=stats.max_rel,
            rtol=tol.rtol,
            atol=tol.atol,
            passed=stats.passed,
            detail=detail or stats.detail(),
            dtype=dtype,
            elements=stats.elements,
            mismatches=stats.mismatches,
            mean_abs_diff=stats.mean_abs,
            cosine_similarity=stats.cosine_similarity,
            histogram=list(stats.histogram),
            tolerance_source=tol.source,
        )


@dataclass
class ProfileCheck:
    """One shape profile: the dims it used (every symbolic dim, defaults included)."""

    dims: dict[str, int]
    samples: int
    seeds: list[int]  # one per sample; empty for caller-supplied feeds
    passed: bool = False
    outputs: list[OutputCheck] = field(default_factory=list)
    error: str | None = None
    # Why the check added this profile, for one it added ("" for those asked for)
    added: str = ""


# The profile the check adds after each one whose sequence it chose (validate/_dims.py,
# second_length_dims): a fusion wrong at lengths 16 hides (a lost cut of padded rows)
SECOND_LENGTH_WHY = (
    "a second sequence length: a model that pads the sequence to a multiple of a chunk "
    "computes the same at 16 for every chunk dividing 16, a wrong fusion of it too"
)
SECOND_LENGTH_SAMPLES = 1  # enough to see a wrong shape or value; each sample costs a run


# Why a check that did not pass failed (CheckResult.failure):
ORIGINAL_CANNOT_RUN = "original_cannot_run"  # the inputs are wrong for the model, not the fusion
FUSED_CANNOT_RUN = "fused_cannot_run"
CANNOT_LOAD = "cannot_load"  # onnxruntime refuses the fused graph
INVALID_GRAPH = "invalid_graph"  # the fused graph breaks onnx's rules or the interface
MISMATCH = "mismatch"
# Each failure in the words every consumer uses (CLI, worker, CI client): "does not
# match" only where outputs were compared and differ.
FAILURE_WORDS = {
    ORIGINAL_CANNOT_RUN: "the check could not run",
    CANNOT_LOAD: "the fused graph is invalid: onnxruntime cannot load it",
    INVALID_GRAPH: "the fused graph is invalid",
    FUSED_CANNOT_RUN: "the fused model fails to run",
    MISMATCH: "the fused model does not match the original",
}


def describe_failure(check: CheckResult) -> str:
    """One sentence on why ``check`` failed, in its failure kind's words."""
    words = FAILURE_WORDS.get(check.failure or "", "the check failed")
    if check.failure == MISMATCH:
        worst = max(check.outputs, key=lambda o: o.max_abs_diff, default=None)
        detail = f"output {worst.name!r}: {worst.detail}" if worst and worst.detail else None
        detail = detail or _exact_detail(check)
        return f"{words} ({detail})" if detail else words
    if check.failure == ORIGINAL_CANNOT_RUN:
        return check.error or words
    error = check.error or ""
    for prefix in ("onnxruntime cannot load the fused model: ", "the fused model fails to run: "):
        error = error.removeprefix(prefix)
    return f"{words}: {error}" if error else words


@dataclass
class CheckResult:
    passed: bool
    samples: int  # per profile
    seed: int
    outputs: list[OutputCheck] = field(default_factory=list)  # over all profiles
    error: str | None = None
    # None when passed; else ORIGINAL_CANNOT_RUN, FUSED_CANNOT_RUN, CANNOT_LOAD,
    # INVALID_GRAPH or MISMATCH (FAILURE_WORDS)
    failure: str | None = None
    # The dynamic dims of the inputs (free names: "batch", "x[2]" for an unnamed one)
    dynamic_dims: list[str] = field(default_factory=list)
    profiles: list[ProfileCheck] = field(default_factory=list)
    histogram_edges: list[float] = field(default_factory=lambda: list(HISTOGRAM_EDGES))
    # Set when the original quantizes activations at run time (validate/_floor.py) or
    # computes in float16 (_floor_fp16.py): the measured floor and the tolerance each
    # output was compared with; None otherwise
    noise_floor: NoiseFloor | None = None
    # Profiles the check added and left out since the original cannot run at their sizes
    # (a model that runs only at some lengths): their dims and why, not a failure
    skipped: list[str] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float:
        return max((o.max_abs_diff for o in self.outputs), default=0.0)

    @property
    def max_rel_diff(self) -> float:
        return max((o.max_rel_diff for o in self.outputs), default=0.0)

    def to_dict(self) -> dict:
        """JSON-ready: plain types only, infinities and NaNs as None."""
        extra = {"max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff}
        extra["reason"] = None if self.passed else describe_failure(self)
        return _jsonable(asdict(self) | extra)


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@dataclass(frozen=True)
class ModelFile:
    """A model on disk, handed to onnxruntime by its path: its external data is read
    where it lies, never as a serialized copy in memory. ``graph`` is the model without
    its weights' bytes (``fusion_core.ir.weightless_proto``), for what reads only the
    graph (the inputs to generate, the outputs to compare); None: read from the file.

    onnxruntime follows the file's external-data locations: give only a file this
    process wrote or one ``fusion_core.ir.load_model`` accepted.
    """

    path: Path
    graph: onnx.ModelProto | None = field(default=None, compare=False, repr=False)

    def graph_proto(self) -> onnx.ModelProto:
        if self.graph is not None:
            return self.graph
        return onnx.load(str(self.path), load_external_data=False)


ModelSource = onnx.ModelProto | ModelFile


def make_session(
    model: ModelSource | str | os.PathLike,
    *,
    optimized: bool = False,
    threads: int = 1,
    data_folder: str | None = None,
) -> ort.InferenceSession:
    """A CPU session of ``model``: a proto (serialized, or saved to a scratch folder past
    2 GB) or a file, read from where it lies. ``data_folder``: where a proto's external
    data lies (a graph read from a file without its weights)."""
    options = ort.SessionOptions()
    if data_folder is not None:
        options.add_session_config_entry(_DATA_FOLDER_KEY, data_folder)
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if optimized
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if isinstance(model, (str, os.PathLike, ModelFile)):
        path = model.path if isinstance(model, ModelFile) else model
        return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    if model.ByteSize() <= PROTOBUF_LIMIT_BYTES:
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    # Over 2 GB a model cannot be one protobuf: hand onnxruntime a file with its
    # weights beside it, in a folder that lives as long as the session.
    folder = tempfile.TemporaryDirectory(prefix="autofusion-")
    path = Path(folder.name) / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data strips the tensors it writes out
    onnx.save_model(copy, path, save_as_external_data=True, location="model.onnx.data")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    session._autofusion_folder = folder  # keeps the weights alive
    return session


# onnxruntime's session option: where the external data of a model given as bytes lies
_DATA_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


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
    overrides = _check_tolerances(tolerances or {}, [o.name for o in graph.graph.output])
    plans = _plans(graph, samples, seed, dims, profiles, feeds)
    result = CheckResult(passed=False, samples=plans[0].samples, seed=seed)
    result.dynamic_dims = input_dims(graph).names
    generate = functools.partial(random_inputs, graph, int_high=int_high, distribution=distribution)
    expected = _run_original(original, plans, generate, result)
    if expected is None:
        return result
    dtypes = expected.dtypes
    tols = {n: _tolerance(dtype, rtol, atol, overrides.get(n)) for n, dtype in dtypes.items()}
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
    plan: _Plan,
    ran: _Ran,
    candidate: ort.InferenceSession,
    expected: _Expected,
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


def _exact_detail(check: CheckResult) -> str:
    """Why the level-0 comparison failed, where it did (``validate/_exact.py``)."""
    exact = check.noise_floor.exact if check.noise_floor else None
    failed = [o for o in exact.outputs if not o.passed] if exact else []
    if not failed:
        return ""
    worst = max(failed, key=lambda o: o.max_abs_diff)
    return (
        f"with MatMulNBits at accuracy_level {exact.accuracy_level}, A not quantized: "
        f"output {worst.name!r}: {worst.detail}"
    )


def _plain_stats(name: str, tol: Tolerance) -> ErrorStats:
    return ErrorStats(tol)


def _noise_floor(
    original: ModelSource,
    graph: onnx.ModelProto,
    expected: _Expected,
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
        floors = measure_floors(lambda: _edited_session(original, edit), expected.names, runs)
    except Exception as exc:  # onnxruntime raises many types: the configured check then
        floor.error = f"the noise floor could not be measured: {_first_line(str(exc))}"
        floor.reason = floor.error + "; outputs compared with the tolerance before it"
        return tols
    return floor.widen(tols, floors)


def _edited_session(
    source: ModelSource, edit: Callable[[onnx.ModelProto], AbstractContextManager]
) -> ort.InferenceSession:
    """A session of ``source`` with its graph edited by ``edit`` (a context manager that
    puts the graph back): a proto edited in place, or a file's graph read without its
    weights, which onnxruntime then reads from beside the file (nothing copied or written)."""
    if not isinstance(source, ModelFile):
        with edit(source):
            return make_session(source)
    graph = onnx.load(str(source.path), load_external_data=False)
    with edit(graph):
        return make_session(graph, data_folder=external_folder(source.path))


def _exact_check(
    original: ModelSource,
    fused: ModelSource,
    graph: onnx.ModelProto,
    expected: _Expected,
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
            lambda: _edited_session(original, at_level),
            lambda: _edited_session(fused, at_level),
            expected.names,
            feeds,
            tols,
            exact,
        )
    except Exception as exc:  # onnxruntime raises many types: the floor's verdict then
        exact.error = f"the level-0 comparison could not run: {_first_line(str(exc))}"
    exact.seconds = time.perf_counter() - start
    exact.reason = exact.error or (
        f"both models ran again with every MatMulNBits at accuracy_level {EXACT_LEVEL} (A not "
        "quantized, fp32 sums) and were compared with the tolerance before the floor"
    )


@dataclass
class _Ran:
    """What the original did on one plan: each feed it ran and its outputs, in order;
    the failure that stopped it, if any (the fused model runs the feeds before it)."""

    feeds: list[Mapping[str, np.ndarray]] = field(default_factory=list)
    outputs: list[list[np.ndarray]] = field(default_factory=list)
    error: str | None = None
    failure: str | None = None
    skipped: str | None = None  # a profile the check added, left out: why


@dataclass
class _Expected:
    """The original's outputs on every plan, kept while its session is released."""

    names: list[str]
    dtypes: dict[str, str]
    plans: list[_Ran] = field(default_factory=list)
    # An input the generator cannot make (ConfigError): raised once the fused model is
    # known to load, as when both sessions were made before either ran
    pending: ConfigError | None = None


def _run_original(
    original: ModelSource, plans: list[_Plan], generate: Callable[..., dict], result: CheckResult
) -> _Expected | None:
    """The original on every plan's feeds, its session released after; None when it
    cannot load (``result`` says why)."""
    try:
        reference = make_session(original)
    except Exception as exc:  # onnxruntime raises many types; report them all
        result.error = (
            f"onnxruntime cannot load the original model: {_first_line(str(exc))}; the check "
            "needs it (--no-check fuses without checking)"
        )
        result.failure = ORIGINAL_CANNOT_RUN  # says nothing about the fusion
        return None
    outs = reference.get_outputs()
    expected = _Expected([o.name for o in outs], {o.name: _dtype_name(o.type) for o in outs})
    try:
        for plan in plans:
            ran = _Ran()
            expected.plans.append(ran)
            if plan.follows is not None:
                _run_second_length(reference, expected, plan, generate, ran)
                continue
            if plan.feeds is None and (error := _runnable_dims(reference, plan, generate, ran)):
                ran.error, ran.failure = error, ORIGINAL_CANNOT_RUN  # nothing to compare
                continue
            rest = plan.seeds[len(ran.feeds) :]  # the first sample ran as the candidate's trial
            generated = (generate(seed=s, dims=plan.check.dims) for s in rest)
            _run_reference(reference, expected.names, plan.feeds or generated, ran)
    except ConfigError as exc:  # without its frames, which hold the session
        expected.pending = exc.with_traceback(None)
    return expected  # the session goes here: its weights with it


def _run_second_length(
    reference: ort.InferenceSession,
    expected: _Expected,
    plan: _Plan,
    generate: Callable[..., dict],
    ran: _Ran,
) -> None:
    """The original at the sizes the plan it follows settled on, its sequence changed:
    left out (``ran.skipped``) where that plan did not run or the original cannot run at
    these sizes (a model that runs at some lengths only), as a candidate that does not
    run is (``_runnable_dims``)."""
    follows, before = plan.follows, expected.plans[plan.index_of_follows]
    if follows is None or plan.info is None or before.error is not None:
        ran.skipped = ""  # the profile it varies failed: that says it all
        return
    plan.check.dims = second_length_dims(plan.info, follows.check.dims, plan.given) or {}
    generated = (generate(seed=s, dims=plan.check.dims) for s in plan.seeds)
    _run_reference(reference, expected.names, generated, ran)
    if ran.error is not None:
        ran.skipped = f"left out: {ran.error}"
        ran.feeds, ran.outputs, ran.error, ran.failure = [], [], None, None


def _run_reference(
    reference: ort.InferenceSession,
    names: list[str],
    feeds: Iterable[Mapping[str, np.ndarray]],
    ran: _Ran,
) -> None:
    """The original on each feed in order, until one fails (``ran`` says why)."""
    for feed in feeds:
        try:
            outputs = reference.run(names, dict(feed))
        except ConfigError:
            raise  # an input the generator cannot make: the caller's to fix, not a run failure
        except Exception as exc:
            ran.error = f"the original model cannot run on these inputs: {_first_line(str(exc))}"
            ran.failure = ORIGINAL_CANNOT_RUN
            return
        ran.feeds.append(feed)
        ran.outputs.append(outputs)


def _open_fused(fused: ModelSource, result: CheckResult) -> ort.InferenceSession | None:
    """The fused model's session, or None with the reason in ``result``."""
    try:
        return make_session(fused)
    except Exception as exc:
        result.error = f"onnxruntime cannot load the fused model: {_first_line(str(exc))}"
        result.failure = CANNOT_LOAD
        return None


def _compare_runs(
    candidate: ort.InferenceSession,
    names: list[str],
    ran: _Ran,
    into: list[dict[str, ErrorStats]],
) -> tuple[str | None, str | None]:
    """The fused model on each feed the original ran, adding each output to the stats
    ``into``; the onnxruntime failure that stopped either and whose it was (a ``failure``
    kind), if any: the first in feed order, as when the two ran side by side."""
    for feed, expected in zip(ran.feeds, ran.outputs, strict=True):
        try:
            actual = candidate.run(names, dict(feed))
        except Exception as exc:
            return f"the fused model fails to run: {_first_line(str(exc))}", FUSED_CANNOT_RUN
        for name, want, got in zip(names, expected, actual, strict=True):
            for stats in into:
                stats[name].update(np.asarray(want), np.asarray(got))
    return ran.error, ran.failure


def _runnable_dims(
    reference: ort.InferenceSession,
    plan: _Plan,
    generate: Callable[..., dict],
    ran: _Ran,
) -> str | None:
    """Settle ``plan``'s dims on the first candidate the original runs on (its run is
    the plan's first sample, kept in ``ran``); else say why.

    Sizes the user gave are kept; the others are tried in ``candidate_dims`` order, so a
    detector whose Resize needs a multiple of 32 is not judged on a 1x1 image.
    """
    tried: list[dict[str, int]] = []
    last_error = ""
    for k in range(CANDIDATES):
        dims = candidate_dims(plan.info, plan.given, k)
        if dims in tried:
            continue
        tried.append(dims)
        try:
            feed = generate(seed=plan.seeds[0], dims=dims)
            outputs = reference.run(None, feed)
        except ConfigError:
            raise  # an input the generator cannot make: the caller's to fix
        except Exception as exc:
            last_error = _first_line(str(exc))
            continue
        plan.check.dims = dims
        ran.feeds.append(feed)
        ran.outputs.append(outputs)
        return None
    free = [name for name in plan.info.names if name not in plan.given]
    hint = (
        f"give --shape NAME=VALUE for {', '.join(free)}"
        if free
        else "the sizes given with --shape do not suit it"
    )
    return (
        f"the original model cannot run on generated inputs (tried {tried}): {last_error}; "
        f"{hint}, or your own inputs with --inputs"
    )


def _first_line(text: str) -> str:
    text = text.strip().splitlines()[0] if text.strip() else text
    return text[:400]


@dataclass
class _Plan:
    given: dict[str, int]  # the sizes the caller gave
    seeds: list[int]
    feeds: list[Mapping[str, np.ndarray]] | None
    check: ProfileCheck  # its dims are every free name's size, once settled
    info: InputDims | None = None
    follows: _Plan | None = None  # a second length: the plan whose settled sizes it varies
    index_of_follows: int = -1

    @property
    def samples(self) -> int:
        return self.check.samples


def _plans(
    model: onnx.ModelProto,
    samples: int,
    seed: int,
    dims: Mapping[str, int] | None,
    profiles: Sequence[Mapping[str, int]] | None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None,
) -> list[_Plan]:
    if feeds:
        return [_Plan({}, [], list(feeds), ProfileCheck({}, len(feeds), []))]
    info = input_dims(model)
    asked = []
    for p, profile in enumerate(profiles or [dims or {}]):
        _check_profile(profile, info.names, p)
        used = candidate_dims(info, profile, 0)
        seeds = [seed + p * samples + j for j in range(samples)]
        asked.append(_Plan(dict(profile), seeds, None, ProfileCheck(used, samples, seeds), info))
    return _with_second_lengths(asked, seed + len(asked) * samples)


def _with_second_lengths(asked: list[_Plan], next_seed: int) -> list[_Plan]:
    """``asked``, each followed by its second sequence length where it has a sequence the
    caller left to the check (``second_length_dims``); their seeds from ``next_seed`` on."""
    plans: list[_Plan] = []
    for plan in asked:
        plans.append(plan)
        info = plan.info
        if info is None or second_length_dims(info, plan.check.dims, plan.given) is None:
            continue
        seeds = list(range(next_seed, next_seed + SECOND_LENGTH_SAMPLES))
        next_seed += SECOND_LENGTH_SAMPLES
        check = ProfileCheck({}, SECOND_LENGTH_SAMPLES, seeds, added=SECOND_LENGTH_WHY)
        extra = _Plan(dict(plan.given), seeds, None, check, info, plan, len(plans) - 1)
        plans.append(extra)
    return plans


def _check_profile(profile: Mapping[str, int], symbolic: list[str], index: int) -> None:
    unknown = sorted(set(profile) - set(symbolic))
    if unknown:
        raise ConfigError(
            f"shape profile {index} names {unknown}, which no model input has as a "
            f"symbolic dimension",
            hint=f"the model's symbolic dimensions are {symbolic or 'none'}",
        )
    bad = {k: v for k, v in profile.items() if not isinstance(v, (int, np.integer)) or v < 1}
    if bad:
        raise ConfigError(
            f"shape profile {index} gives {bad}: dimensions must be whole numbers >= 1",
            hint='e.g. {"batch": 1, "sequence": 16}',
        )


def _check_tolerances(
    tolerances: Mapping[str, Mapping[str, float]], outputs: list[str]
) -> dict[str, Mapping[str, float]]:
    for name, tol in tolerances.items():
        if name not in outputs:
            raise ConfigError(
                f"tolerances name output {name!r}, which the model does not have",
                hint=f"the model's outputs are {outputs}",
            )
        wrong = sorted(set(tol) - {"rtol", "atol"})
        negative = {k: v for k, v in tol.items() if k in ("rtol", "atol") and not v >= 0}
        if wrong or negative:
            raise ConfigError(
                f"tolerance for output {name!r} is {dict(tol)}",
                hint='give {"rtol": r, "atol": a} with r, a >= 0 (either may be left out)',
            )
    return dict(tolerances)


def _tolerance(
    dtype: str, rtol: float, atol: float, override: Mapping[str, float] | None
) -> Tolerance:
    default = default_tolerance(dtype, rtol, atol)
    if not override:
        return default
    return Tolerance(
        float(override.get("rtol", default.rtol)),
        float(override.get("atol", default.atol)),
        "override",
    )


_ORT_TYPE_NAMES = {"float": "float32", "double": "float64"}


def _dtype_name(ort_type: str) -> str:
    """'tensor(float16)' -> 'float16' (ONNX's 'float' and 'double' as numpy names)."""
    inner = ort_type.removeprefix("tensor(").removesuffix(")")
    return _ORT_TYPE_NAMES.get(inner, inner)


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
