"""The report's JSON Schema, described as pydantic models (the schema is generated).

``build_report`` writes plain dicts; these models only describe them. Sections owned
by other layers (``check``, ``profile``) name the keys the renderings read and allow
more, so those layers can grow without a new report version.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Report", "report_schema"]

_SHA256 = "^[0-9a-f]{64}$"
_OPEN = ConfigDict(extra="allow")
_CLOSED = ConfigDict(extra="forbid")


class Digests(BaseModel):
    model_config = _CLOSED
    model_sha256: str | None = Field(pattern=_SHA256, description="sha256 of the input file")
    output_sha256: str | None = Field(pattern=_SHA256, description="sha256 of the fused file")


class Provenance(BaseModel):
    model_config = _OPEN
    original_nodes: list[str] = Field(
        description="Nodes of the input graph (after pre-passes) this fusion covers, "
        "following the nodes earlier fusions created back to the ones they replaced"
    )
    from_fusions: list[int] = Field(
        description="Indices (in 'applied') of earlier fusions whose nodes this one replaced"
    )
    superseded_by: list[int] = Field(
        description="Indices of later fusions that replaced some of this one's new nodes"
    )


class MeasuredGain(BaseModel):
    model_config = _OPEN
    before_us: float | None = Field(description="Time of the nodes the region replaced, µs/run")
    after_us: float | None = Field(description="Time of the fused node(s), µs/run")
    saved_us: float | None = Field(description="before_us - after_us")
    ratio: float | None = Field(description="after_us / before_us: below 1 is faster")


class PredictedGain(BaseModel):
    model_config = _OPEN
    before_us: float | None = Field(description="Roofline time of the replaced nodes, µs/run")
    after_us: float | None = Field(description="Roofline time of the fused kernel(s), µs/run")
    saved_us: float = Field(description="Predicted time saved, µs/run (launches only from hints)")
    ratio: float | None = Field(description="after_us / before_us: below 1 is faster")
    speedup: float | None = Field(description="before / after; from cost hints without shapes")
    estimated_from: Literal["shapes", "hints", "none"]
    launches_saved: int
    bytes_saved: int | None
    flops_delta: int | None = Field(description="FLOPs added (> 0) or removed (< 0)")
    kernel_factor: float = Field(
        1.0, description="The target profile's kernel factor that priced the fused kernel"
    )
    kernel_factor_key: str | None = Field(
        None,
        description="Its key in the profile's kernel_factors (name[+group][+mode], the "
        "most specific the profile has; docs/cost.md); null: no factor",
    )


class SwitchOutcome(BaseModel):
    model_config = _OPEN
    when: str = Field(description="The condition, e.g. \"dim('$x', -1) > 1024\"")
    action: Literal["disable", "enable"]
    patterns: list[str]
    fired: bool
    per_profile: list[bool | str] = Field(
        description="Per shape profile: the condition's value, or why it was undecided"
    )


class Fusion(BaseModel):
    model_config = _OPEN
    index: int = Field(description="Position in 'applied', in the order fusions were applied")
    pattern: str
    replaced_nodes: list[str]
    new_nodes: list[str]
    new_ops: list[str] = Field(description="Op types of the new nodes, domain::op when custom")
    round: int
    rewriter: str | None = Field(default=None, description="The rewriter that made it")
    provenance: Provenance
    predicted_gain: PredictedGain | None = Field(
        description="The cost model's prediction on the config's target profile (docs/cost.md)"
    )
    measured_gain: MeasuredGain | None = Field(
        description="From the profile's 'regions' entry for a new node; null without one"
    )


class NearMiss(BaseModel):
    model_config = _OPEN
    pattern: str
    nodes: list[str]
    reason: str = Field(description="Why it did not fuse, naming the value or the numbers")
    kind: Literal["constraint", "escape", "rewriter", "selection", "rollback", "bug"] = Field(
        default="constraint",
        description="Who said no: a constraint of the pattern, a value needed outside the "
        "fusion (escape), the rewriter, the selection (cost model, limits, measured "
        "selection), progressive validation's rollback, or a bug (the rewrite raised or "
        "broke the graph and was taken back: see 'rejected')",
    )


class SubgraphNodes(BaseModel):
    """The nodes inside If, Loop and Scan bodies (every level), counted apart from the
    main graph's: a body runs once per iteration, or not at all (an If's other branch)."""

    model_config = _CLOSED
    before: int
    after: int
    by_op_before: dict[str, int]
    by_op_after: dict[str, int]


class Nodes(BaseModel):
    """The main graph's nodes by op type, before and after; the bodies' apart."""

    model_config = _CLOSED
    before: int = Field(description="Nodes of the main graph before (bodies not counted)")
    after: int = Field(description="Nodes of the main graph after (bodies not counted)")
    by_op_before: dict[str, int]
    by_op_after: dict[str, int]
    subgraphs: SubgraphNodes | None = Field(
        default=None,
        description="The nodes inside If, Loop and Scan bodies, before and after; null when "
        "neither model has a body (reports before this field counted bodies in before/after)",
    )


class OutputCheck(BaseModel):
    model_config = _OPEN
    name: str
    passed: bool


class OutputFloor(BaseModel):
    model_config = _OPEN
    name: str
    floor_abs: float | None = Field(
        description="Max |perturbed original - original| over the check's samples (float16 "
        "floor: |original computed in float32 - original|)"
    )
    floor_mean: float | None = Field(
        description="Mean |perturbed original - original| (float16: as floor_abs)"
    )
    rtol: float
    atol: float | None = Field(description="The element-wise atol the fused model was held to")
    mean_limit: float | None = Field(description="The most the fused model's mean error may be")


class ExactOutput(BaseModel):
    model_config = _OPEN
    name: str
    max_abs_diff: float | None
    mean_abs_diff: float | None
    rtol: float
    atol: float
    passed: bool
    detail: str = Field(default="", description="Why it failed, in words; empty when it passed")


class ExactCheck(BaseModel):
    """``NoiseFloor.exact``: both models again with MatMulNBits at accuracy_level 0."""

    model_config = _OPEN
    nodes: dict[str, int] = Field(
        description="The MatMulNBits set to the level, per model ('original', 'fused')"
    )
    accuracy_level: int = Field(description="0: A not quantized, fp32 sums")
    passed: bool | None = Field(
        description="The level-0 comparison's verdict; null when it was not run (the floor's "
        "comparison failed already) or could not run (error)"
    )
    max_abs_diff: float | None
    outputs: list[ExactOutput] = Field(
        description="Per output, held to its tolerance before the floor (configured, or its own)"
    )
    error: str | None = Field(description="Why it could not run (the floor's verdict stands)")
    reason: str = Field(description="What was run, or why not, in words")
    seconds: float = Field(description="Both level-0 sessions' load and runs")


class NoiseFloor(BaseModel):
    """``CheckResult.noise_floor``: the original's own noise (quantized activations, float16)."""

    model_config = _OPEN
    kind: Literal["quantized activations", "float16"] = Field(
        default="quantized activations",
        description="What makes the original's own noise: ops that quantize activations at "
        "run time (the floor: the original under a one-ulp move of those activations), or "
        "float16 (the floor: the original against the same graph computed in float32)",
    )
    quantizers: dict[str, int] = Field(
        description="The ops that quantize an activation at run time, by kind, with counts "
        "('MatMulNBits accuracy_level 4', 'DynamicQuantizeLinear', ...); empty for float16"
    )
    float16: dict[str, int] = Field(
        default_factory=dict,
        description="What of the main graph is float16, counted ('float16 initializers', "
        "'Casts to float16', 'float16 outputs', ...); empty for quantized activations",
    )
    perturbation: float | None = Field(
        description="How far each activation those ops read was moved, relative to its size; "
        "null for float16 (nothing moved)"
    )
    multiple: float = Field(description="The tolerance goes up to this many times the floor")
    outputs: list[OutputFloor] = Field(
        description="Per float output without a tolerance of its own: the floor and the "
        "tolerance used"
    )
    error: str | None = Field(
        description="Why the floor could not be measured (the tolerance before it was used)"
    )
    reason: str = Field(description="What the floor is and how it was used, in words")
    exact: ExactCheck | None = Field(
        default=None,
        description="Where the original has MatMulNBits at accuracy_level 4: both models "
        "compared again with those at level 0 at the tolerance before the floor; the check "
        "passes only if both comparisons pass. Null for the other quantizers",
    )


class Check(BaseModel):
    """``CheckResult.to_dict()``: the onnxruntime comparison of original and fused model."""

    model_config = _OPEN
    passed: bool
    samples: int
    seed: int
    outputs: list[OutputCheck]
    max_abs_diff: float | None = None
    error: str | None = None
    failure: (
        Literal[
            "original_cannot_run", "fused_cannot_run", "cannot_load", "invalid_graph", "mismatch"
        ]
        | None
    ) = Field(
        default=None,
        description="Why it did not pass: the check could not run (the original cannot run "
        "on the generated inputs: give shapes or inputs; says nothing of the fusion), the "
        "fused model fails to run, the fused graph is invalid (onnxruntime cannot load it: "
        "cannot_load; it breaks onnx's rules or the model's interface: invalid_graph), or "
        "the outputs differ (mismatch, the only 'does not match')",
    )
    reason: str | None = Field(
        default=None,
        description="Why it did not pass, in one sentence in its failure kind's words "
        "(what the CLI, the worker and the CI client print); null when it passed",
    )
    dynamic_dims: list[str] = Field(
        default_factory=list,
        description="The inputs' dynamic dims by name (an unnamed one as 'input[axis]'), "
        "the names --shape takes",
    )
    noise_floor: NoiseFloor | None = Field(
        default=None,
        description="Set when the original quantizes activations at run time (MatMulNBits "
        "at accuracy_level 4, DynamicQuantizeLinear, DynamicQuantizeMatMul, "
        "DynamicQuantizeLSTM): the original's own outputs under a one-ulp move of those "
        "activations; else when it computes in float16: the original against the same graph "
        "computed in float32; and the tolerance that made; null for other models",
    )


class SessionLatency(BaseModel):
    model_config = _OPEN
    label: str = Field(description="The session: 'original' or 'fused'")
    median_ms: float | None
    p90_ms: float | None


class PairedRatio(BaseModel):
    model_config = _OPEN
    median: float = Field(description="Median of fused / original per interleaved iteration")
    low: float = Field(description="Lower end of the confidence interval of that median")
    high: float = Field(description="Upper end of the confidence interval")
    confidence: float = Field(description="The interval's coverage (at least 0.95 from 6 runs)")
    runs: int = Field(description="Paired runs (iterations)")
    verdict: Literal["faster", "no measurable change", "slower"] = Field(
        description="faster: the whole interval below 1 and the median at least 1% below; "
        "slower: all of it above 1 and the median at least 1% above; no measurable change "
        "otherwise"
    )


class LatencyComparison(BaseModel):
    model_config = _OPEN
    level: str = Field(description="onnxruntime graph optimization level, e.g. ORT_ENABLE_ALL")
    ratio: float | None = Field(description="fused / original median: below 1 is faster")
    paired: PairedRatio | None = Field(
        default=None, description="The paired ratio, its interval and verdict"
    )
    sessions: list[SessionLatency]


class Speed(BaseModel):
    """The verdict consumers read (fusion_core.report.read_report)."""

    model_config = ConfigDict(extra="forbid")
    level: str | None = Field(description="The level measured: ORT_ENABLE_ALL when profiled there")
    ratio: float = Field(description="fused / original (paired median): below 1 is faster")
    speedup: float = Field(description="1 / ratio: above 1 is faster")
    low: float | None = Field(description="The interval of the ratio; null in old reports")
    high: float | None
    confidence: float | None
    runs: int | None = Field(description="Paired runs the ratio is the median of")
    verdict: Literal["faster", "no measurable change", "slower"] | None
    threads: int | None = Field(description="onnxruntime intra-op threads of the measurement")


class OpTypeTime(BaseModel):
    model_config = _OPEN
    op_type: str
    total_us: float = Field(description="Summed kernel time over the profiled runs")


class NodeProfile(BaseModel):
    model_config = _OPEN
    runs: int = Field(description="Profiled runs the totals cover")
    op_types: list[OpTypeTime]


class NodeProfiles(BaseModel):
    model_config = _OPEN
    original: NodeProfile | None = None
    fused: NodeProfile | None = None


class RegionTime(BaseModel):
    model_config = _OPEN
    pattern: str
    fused_nodes: list[str] = Field(description="The fused node(s) in the fused model")
    replaced_nodes: list[str] = Field(description="The original nodes they replaced")
    before_us: float | None = Field(description="Summed time of the replaced nodes, µs/run")
    after_us: float | None = Field(description="Time of the fused node(s), µs/run")


class Profile(BaseModel):
    """``ProfileReport.to_dict()`` (``fusion_core.profiling``): onnxruntime timings.

    Keys the renderings read are described; all are optional and others are allowed.
    """

    model_config = _OPEN
    latency: list[LatencyComparison] | None = Field(
        default=None, description="Per optimization level: median and p90 ms per session"
    )
    nodes: NodeProfiles | None = Field(
        default=None, description="onnxruntime profiler times per op type, original and fused"
    )
    regions: list[RegionTime] | None = Field(
        default=None, description="Time per fused region, before and after"
    )


class CombinedVerdict(BaseModel):
    """The verdict store's measurements of one region signature on this machine class,
    combined (inverse-variance on the log ratio, their disagreement widening it)."""

    model_config = _OPEN
    ratio: PairedRatio = Field(description="The combined ratio, its interval and verdict")
    measurements: int = Field(description="Measurements combined")
    agree: bool = Field(description="Every measurement had the same verdict")
    confident: bool = Field(description="Decisive: a decision was taken from it without timing")
    jobs: list[str] = Field(description="The service's jobs that measured them (local: none)")


class MeasuredGroup(BaseModel):
    model_config = _OPEN
    group: str = Field(description="The pattern and the ops its fusions emit")
    pattern: str
    fusions: int = Field(description="Fusions in the group, measured together")
    kept: bool
    source: Literal["store", "measured", "not measured"] | None = Field(
        default=None,
        description="Where the decision came from: the verdict store (a confident combined "
        "verdict of earlier measurements), measured in this run, or not measured (the "
        "budget did not reach it); absent from older reports",
    )
    cached: bool = Field(description="Decided without timing: source is store")
    signature: str | None = Field(
        default=None, description="The group's region signature (sha256; docs/measured.md)"
    )
    ratio: PairedRatio | None = Field(
        description="The model with the group / without it, paired (combined, from the "
        "store); null when not measured"
    )
    combined: CombinedVerdict | None = Field(
        default=None, description="Source store: the combined verdict decided on"
    )
    reason: str


class MeasurementStore(BaseModel):
    """What the verdict store gave and took (fusion_core/pipeline/measured/_store.py)."""

    model_config = _OPEN
    read: int = Field(description="Valid verdicts read (the verdicts files and the local store)")
    skipped: int = Field(description="Invalid verdicts left out")
    unreadable: int = Field(default=0, description="Verdicts files that could not be read")
    matched: int = Field(description="Groups decided from the store")
    measured: int = Field(description="Groups timed in this run")
    written: int = Field(description="Verdicts added to the local store")
    problems: list[str] = Field(
        default_factory=list, description="What could not be read or written (the first 20)"
    )


class Measurement(BaseModel):
    """Measured selection: each group of fusions timed with and without, on this machine."""

    model_config = _OPEN
    level: str = Field(description="onnxruntime level measured at (the deployment's)")
    threads: int = Field(description="Intra-op threads measured with")
    budget_s: float = Field(description="Seconds of timed runs allowed")
    seconds: float = Field(description="Seconds measured selection took in all")
    groups: list[MeasuredGroup]
    final: PairedRatio | None = Field(
        description="The kept model against the original; null when nothing could run"
    )
    fallback: str | None = Field(
        description="Why no fusion was kept although groups were faster alone, if so"
    )
    error: str | None = Field(description="Why nothing could be measured, if so")
    store: MeasurementStore | None = Field(
        default=None, description="The verdict store's counts; absent from older reports"
    )
    cache: dict[str, int] | None = Field(
        default=None, description="Older reports: the decision cache's hits and misses"
    )


class Size(BaseModel):
    """The model's bytes on disk, as shipped: its file and its external-data files."""

    model_config = _CLOSED
    before_bytes: int | None = Field(
        description="The input: its file plus every external-data file it references, "
        "each counted once, whole; null when the input was not a file"
    )
    after_bytes: int = Field(description="The fused model, likewise (see after_measured_from)")
    ratio: float | None = Field(description="after_bytes / before_bytes: below 1 is smaller")
    before_external_data_bytes: int | None = Field(description="Of before_bytes, external data")
    after_external_data_bytes: int = Field(description="Of after_bytes, external data")
    before_files: int | None = Field(description="Files the input is made of")
    after_files: int = Field(description="Files the fused model is made of")
    after_measured_from: Literal["file", "serialized"] = Field(
        description="file: the fused model's files as written; serialized: no file holds it "
        "(its check failed without keep_failed, or none was given), so it was serialized "
        "the way it would be written and measured there"
    )


class Memory(BaseModel):
    """Peak memory of running each model in onnxruntime, original and fused."""

    model_config = _CLOSED
    measure: str = Field(description="What before_bytes and after_bytes are, in words")
    before_bytes: int | None = Field(
        description="The original's process peak resident memory (VmHWM) over creating one "
        "onnxruntime session and a few runs, in a fresh process, less that process's "
        "resident memory before the session; null when not measured"
    )
    after_bytes: int | None = Field(description="The fused model's, measured alike")
    ratio: float | None = Field(description="after_bytes / before_bytes: below 1 is less")
    resident_before_bytes: int | None = Field(
        description="What stays resident after the runs (a serving process holds it), original"
    )
    resident_after_bytes: int | None = Field(description="Likewise, fused")
    allocator_peak_before_bytes: int | None = Field(
        description="onnxruntime's CPU allocator peak in the profiler's trace, original "
        "(fusion_core.profiling.MemoryStats); null without a profile or allocator statistics"
    )
    allocator_peak_after_bytes: int | None = Field(description="Likewise, fused")
    allocator_measure: str = Field(description="What the allocator peaks are, in words")
    errors: list[str] = Field(description="Why a model's memory could not be measured")


class PhaseMemory(BaseModel):
    model_config = _CLOSED
    peak_rss_bytes: int | None = Field(
        description="The process's peak resident memory up to the end of this phase"
    )
    rss_bytes: int | None = Field(description="Its resident memory at the end of the phase")


class OptimizeMemory(BaseModel):
    """The optimizing process's own memory (fusion_core/pipeline/memory.py)."""

    model_config = _CLOSED
    measure: str = Field(description="What the figures are, in words")
    peak_rss_bytes: int | None = Field(
        description="The optimizing process's peak resident memory over the run (Linux: "
        "VmHWM; else ru_maxrss): in the service, the job's sandbox; null: not measurable"
    )
    model_bytes: int | None = Field(description="The input: its file and external data")
    ratio: float | None = Field(description="peak_rss_bytes / model_bytes")
    before_bytes: int | None = Field(description="The process's resident memory before the run")
    by_phase: dict[str, PhaseMemory] = Field(
        description="Per phase, in the order they ran (load, prepasses, fuse, check, "
        "saving, profiling; measure, progressive, fallback in those modes): the peak is a "
        "high-water mark, so the phase whose figure jumps is the one that raised it"
    )
    predicted_peak_bytes: int | None = Field(
        description="The peak predicted before the run from model_bytes and the config "
        "(fusion_core.predict_memory)"
    )
    prediction: str | None = Field(description="How it was predicted, in words")


class Rollback(BaseModel):
    model_config = _OPEN
    pattern: str
    nodes: list[str]
    error: str = Field(description="Why the fusion was rolled back (the failed check)")


class Rejected(BaseModel):
    model_config = _OPEN
    step: Literal["rewrite", "canonical", "pre-pass", "match", "rounds"] = Field(
        description="What was taken back: a rewrite, a canonical-form rule, a pre-pass, one "
        "pattern's search (that pattern is left out, the others still fuse), or the rounds "
        "of matching and rewriting as a whole (the model then comes unfused)"
    )
    name: str = Field(description="The pattern, canonical-form rule or pre-pass")
    nodes: list[str] = Field(description="The matched nodes, or the nodes the step wrote")
    failed: str = Field(description="What failed: the op, attribute, type or cycle, or the "
        "exception the step raised")  # fmt: skip
    kind: Literal["bug"] = "bug"
    reproducer: str | None = Field(
        default=None,
        description="The matched region as an ONNX file of its own, by its name in "
        "reproducers.zip (beside the report; a job's artifact); null: none could be cut",
    )


class FallbackBudget(BaseModel):
    model_config = _OPEN
    seconds: float = Field(description="What the fallback could spend: a multiple of the "
        "failed run's time, with a floor")  # fmt: skip
    spent: float
    runs: int = Field(description="Fusion passes with their check that it started")
    exhausted: bool = Field(description="It ran out: the largest verified sets were kept, "
        "the rest not tried")  # fmt: skip


class Fallback(BaseModel):
    model_config = _OPEN
    failure: str | None = Field(description="The failed check's kind (check.failure)")
    reason: str = Field(description="Why the check failed, in its kind's words")
    fusions_tried: int
    kept: int = Field(description="Fusions in the model written (0 with unchanged)")
    dropped: list[Rollback] = Field(description="The fusions taken out, each with its error")
    unchanged: bool = Field(description="No set of fusions passed: the model as it came")
    budget: FallbackBudget | None = Field(
        default=None,
        description="The bound on the fallback's re-runs; null: none ran (progressive mode)",
    )


class LeftAlone(BaseModel):
    model_config = _OPEN
    what: str = Field(description="The kind of part: 'domain X', 'quantized ops', ...")
    nodes: int
    reason: str


class UnfoldedValue(BaseModel):
    model_config = _OPEN
    name: str = Field(description="The node that would have been folded")
    op_type: str
    bytes: int | None = Field(description="What its value would have held; null: unknown")
    reason: Literal["fold_budget", "tensor_limit"] = Field(
        description="fold_budget: past the growth budget; tensor_limit: more elements "
        "than fold_output_size_limit"
    )


class Folding(BaseModel):
    model_config = _OPEN
    budget_bytes: int = Field(
        description="What folding could add: fold_growth_ratio x the input's constant "
        "bytes + fold_growth_floor_bytes"
    )
    grown_bytes: int = Field(
        description="Net bytes of constants folding added (negative: it shrank them)"
    )
    unfolded_count: int = Field(description="Values left as the nodes that make them")
    unfolded_bytes: int = Field(description="Bytes those values would have held")
    reasons: dict[str, int] = Field(description="How many were left for each reason")
    unfolded: list[UnfoldedValue] = Field(description="The first few of them, in graph order")


class Report(BaseModel):
    """What one ``optimize`` run did: the contract of ``report.json``."""

    model_config = ConfigDict(extra="forbid", title="autofusion report")
    report_version: Literal[2]
    tool: dict[str, str | None] = Field(description="Versions of autofusion and its runtimes")
    model: str | None = Field(description="The input model's name or path")
    output: str | None = Field(description="The fused model's name or path")
    digests: Digests
    size: Size | None = Field(
        default=None,
        description="Bytes on disk before and after; in every report since it was added "
        "(absent from older stored ones)",
    )
    config: dict[str, Any] | None = Field(description="OptimizeConfig, as JSON")
    registry_version: int | str | None = Field(description="Pattern registry snapshot")
    target: str
    patterns_used: list[str]
    prepasses: list[str]
    folding: Folding | None = Field(
        default=None,
        description="Constant folding's growth budget and the values it left unfolded, "
        "never computed; null when folding did not run (absent from older reports)",
    )
    rounds: int
    fusions: dict[str, int] = Field(description="Number of fusions per pattern")
    applied: list[Fusion]
    near_misses: list[NearMiss] = Field(description="Places that matched but did not fuse")
    nodes: Nodes
    timings_s: dict[str, float] = Field(description="Seconds per phase of optimize")
    check: Check | None = Field(description="Validation; null when the check was skipped")
    profile: Profile | None = Field(description="Profiling; null when not profiled")
    speed: Speed | None = Field(
        description="The speed verdict at the deployment level (from the profile, else from "
        "measured selection's final comparison); null when nothing was timed"
    )
    measurement: Measurement | None = Field(
        default=None, description="Measured selection (selection 'measured' or measure: true)"
    )
    memory: Memory | None = Field(
        default=None,
        description="Peak memory in onnxruntime before and after; null when not profiled",
    )
    optimize_memory: OptimizeMemory | None = Field(
        default=None,
        description="The optimizing process's own peak memory, by phase, against the model's "
        "size and the prediction; null when not measured (absent from older reports)",
    )
    rollbacks: list[Rollback] | None = Field(
        description="Fusions undone by progressive validation; null when it did not run"
    )
    rejected: list[Rejected] = Field(
        default_factory=list,
        description="Steps taken back as bugs of autofusion while the run went on (a "
        "rewrite, canonical rule or pre-pass that raised, emitted an op or attribute the "
        "model's opset lacks, wrote types that do not infer, or made a cycle); empty: none",
    )
    fallback: Fallback | None = Field(
        default=None,
        description="The check failed and the run fell back to the largest set of fusions "
        "that passes (or the model as it came); null when it did not (it passed, or strict)",
    )
    regions: dict[str, Any] | None = Field(
        description=(
            "When the check failed: each fused region's outputs against the original "
            "tensors of the same name (regions, first_drift: the culprit, error)"
        )
    )
    structure: list[str] = Field(
        description="What a rewrite broke (outputs, dangling reads, onnx.checker); empty: nothing"
    )
    selections: list[dict[str, Any]] = Field(
        description=(
            "Cost-based selection, one entry per round (strategy, objective_s, chosen and "
            "rejected candidates with their predicted gain and reason); empty with the "
            "default priority selection"
        )
    )
    switches: list[SwitchOutcome] = Field(
        default_factory=list,
        description="The config's dynamic switches and whether each fired (docs/cost.md)",
    )
    precision: dict[str, Any] | None = Field(
        description=(
            "fp16 range analysis (flags: overflow/underflow per region tensor, kept_fp32, "
            "fp32_nodes: the block list for a float16 conversion); null unless asked for"
        )
    )
    left_alone: list[LeftAlone] = Field(
        default_factory=list,
        description="Parts no rule rewrites (other domains, quantized ops, float16) and "
        "what was searched (If/Loop/Scan bodies), each with the reason",
    )


def report_schema() -> dict[str, Any]:
    """The report's JSON Schema (draft 2020-12)."""
    schema = Report.model_json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
