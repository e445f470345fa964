"""The check of a fused model against its original: outputs, structure, regions, fp16.

onnxruntime runs both on the same inputs (``fusion_core.validate.compare_models``);
the generic target must also pass onnx's checker. When the outputs differ, the fused
region that drifts first is named; with precision fp16 the range analysis of every fused
region is added.

Neither model is handed to onnxruntime as a serialized proto: the fused model is saved
once to a scratch folder, its weights streamed to a data file beside it (those still read
lazily from the original's data file included), and the original is its own file when
the caller gave one (``ModelFile``), or, for a file with big weights inside, a copy of it
with its weights in a data file written to the same folder (``validate.session_file``:
onnxruntime maps a data file but parses one file whole; the copy costs 1x the model on
disk for the length of the check). The two sessions run one after the other. A full
proto of either is made only for what needs one: onnx's checker (target generic), the
regions of a failed check and the fp16 range analysis.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.ir import (
    load_model,
    proto_with_weights,
    save_model,
)
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.validate import (
    CANNOT_LOAD,
    INVALID_GRAPH,
    ORIGINAL_CANNOT_RUN,
    FloatDistribution,
    ModelFile,
    check_fp16,
    checker_problems,
    compare_models,
    compare_regions,
    random_inputs,
    session_file,
)

__all__ = ["check_against_original", "original_proto"]

FUSED_FILE = "fused.onnx"  # in the check's scratch folder, its weights in fused.onnx.data
# where a copy of a one-file original goes in that folder (its own name, its weights beside)
ORIGINAL_DIR = "original"


def check_against_original(
    result: Result,
    original: onnx.ModelProto | ModelFile,
    config: OptimizeConfig,
    keep_fp32: set[str],
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> None:
    """Compare with the original (a proto, or the file the caller gave with its graph);
    on failure name the drifting region; fp16 ranges."""
    c = config.check
    distribution = FloatDistribution(
        c.input_distribution, mean=c.input_mean, std=c.input_std, low=c.input_low, high=c.input_high
    )
    with tempfile.TemporaryDirectory(prefix="autofusion-check-") as folder:
        fused_file = ModelFile(Path(folder) / FUSED_FILE)
        save_model(result.model, fused_file.path, external_data=True)
        source = _for_session(original, Path(folder))
        if config.target == "generic":
            result.structure += _new_checker_problems(_checked(source), str(fused_file.path))
        result.check = compare_models(
            source,
            fused_file,
            rtol=c.rtol,
            atol=c.atol,
            samples=c.samples,
            seed=c.seed,
            profiles=c.shape_profiles(),
            tolerances=c.tolerances,
            distribution=distribution,
            feeds=feeds,
        )
    protos = _Protos(result, original)
    if result.structure:  # an invalid graph, whatever the outputs say
        result.check.passed = False
        result.check.failure = INVALID_GRAPH
        result.check.error = "; ".join(result.structure)
    if result.check.failure in (ORIGINAL_CANNOT_RUN, CANNOT_LOAD):
        return  # nothing ran: no region or range can be compared either
    if feeds is None and (not result.check.passed or config.precision == "fp16"):
        # the sizes the check settled on (ones the original runs on), where it failed first
        failed = [p for p in result.check.profiles if not p.passed] or result.check.profiles
        dims = failed[0].dims if failed else c.shape_profiles()[0]
        graph = original.graph_proto() if isinstance(original, ModelFile) else original
        feeds = [
            random_inputs(graph, seed=c.seed + k, dims=dims, distribution=distribution)
            for k in range(c.samples)
        ]
    if feeds and result.applied and not result.check.passed:
        result.regions = compare_regions(
            protos.original(), protos.fused(), feeds, rtol=c.rtol, atol=c.atol
        )
    if feeds and result.applied and config.precision == "fp16":
        result.precision = check_fp16(protos.original(), protos.fused(), feeds, keep_fp32=keep_fp32)


def _for_session(
    original: onnx.ModelProto | ModelFile, folder: Path
) -> onnx.ModelProto | ModelFile:
    """What onnxruntime reads the original from: a proto as it is; a file, or its copy with
    a data file in the check's ``folder`` when it is one file with big weights
    (``validate.session_file``): the same graph and bytes, not parsed whole."""
    if not isinstance(original, ModelFile):
        return original
    source = session_file(original.path, folder / ORIGINAL_DIR)
    if source == original.path:
        return original
    return ModelFile(source, original.graph)


def original_proto(original: onnx.ModelProto | ModelFile) -> onnx.ModelProto:
    """The original as a proto with its weights: the proto itself, or its file read
    again (``load_model``'s checks, then every weight in the proto)."""
    if isinstance(original, ModelFile):
        return proto_with_weights(load_model(original.path))
    return original


class _Protos:
    """Both models as protos with their weights, each made the first time it is asked
    for: most checks need neither."""

    def __init__(self, result: Result, original: onnx.ModelProto | ModelFile) -> None:
        self._result, self._original = result, original
        self._protos: dict[str, onnx.ModelProto] = {}

    def original(self) -> onnx.ModelProto:
        if "original" not in self._protos:
            self._protos["original"] = original_proto(self._original)
        return self._protos["original"]

    def fused(self) -> onnx.ModelProto:
        if "fused" not in self._protos:
            self._protos["fused"] = proto_with_weights(self._result.model)
        return self._protos["fused"]


def _checked(source: onnx.ModelProto | ModelFile) -> onnx.ModelProto | str:
    """What onnx's checker reads of the original: its file (onnx reads it from the path
    with its data file beside it, past 2 GB too), or the proto it came as."""
    return str(source.path) if isinstance(source, ModelFile) else source


def _new_checker_problems(original: onnx.ModelProto | str, fused: str) -> list[str]:
    """onnx's checker on the fused model, at the strictest level the original passes:
    what the model already had (onnx's node test ``test_mvn`` fails the full check as
    shipped) is not the fusion's doing. Only the generic target must pass it in full:
    onnxruntime's own registrations (LayerNormalization below opset 17) fail it by
    design. Both are read from their files where they have one (``fused`` always: the
    check's copy with its data file), never as protos with their weights: a proto of a
    2 GB model cannot be serialized at all, and one of a smaller one costs its size."""
    for full_check in (True, False):
        if not checker_problems(original, full_check=full_check):
            return checker_problems(fused, full_check=full_check)
    return []
