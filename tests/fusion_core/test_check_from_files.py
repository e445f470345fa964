"""The check with the weights held once (issue 29): onnxruntime reads both models from
files, one session at a time, and the original is not read in at load
(fusion_core/pipeline/check.py, fusion_core/validate/_sessions.py, pipeline/once.py).

What it reports must not change: on a decoder with external data built by
bench/_big_models.py (a few MB, target onnxruntime) and on a small model in one file
(target generic, so onnx's checker runs too), the fused model and the whole check are
those of the same model given in memory (the proto path, as before), and the check's
numbers are the two models' outputs compared side by side, recomputed here from
serialized protos as the check used to make its sessions.
"""

from __future__ import annotations

import sys
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.ir import proto_with_weights
from autofusion.fusion_core.pipeline.once import original_of
from autofusion.fusion_core.testing import conv_bn_relu
from autofusion.fusion_core.validate import FloatDistribution, ModelFile, random_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _big_models

DECODER = _big_models.shape_for_size(3 << 20)  # hidden 64, its layers about 3 MB of weights
ON_ORT = OptimizeConfig(target="onnxruntime")
GENERIC = OptimizeConfig(target="generic")


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    info = _big_models.make_decoder(tmp_path_factory.mktemp("decoder"), DECODER, seed=5)
    assert info["data_bytes"] > 2 << 20  # the weights are in the data file
    return Path(info["path"])


@pytest.fixture(scope="module")
def one_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("conv") / "model.onnx"
    onnx.save(conv_bn_relu(), path)
    return path


def _cases(decoder: Path, one_file: Path, name: str) -> tuple[Path, OptimizeConfig]:
    return (decoder, ON_ORT) if name == "decoder" else (one_file, GENERIC)


@pytest.mark.parametrize("name", ["decoder", "one-file"])
def test_the_check_from_files_says_what_the_check_in_memory_says(decoder, one_file, name):
    path, config = _cases(decoder, one_file, name)
    from_file = optimize(path, config)
    in_memory = optimize(onnx.load(path), config)  # its external data read in
    assert from_file.applied and from_file.check.passed
    assert from_file.check.to_dict() == in_memory.check.to_dict()
    assert from_file.structure == in_memory.structure == []
    assert from_file.counts == in_memory.counts
    assert _plain(proto_with_weights(from_file.model)) == _plain(
        proto_with_weights(in_memory.model)
    )


def _plain(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the explicit ``data_location: DEFAULT`` that ``onnx.load`` writes
    on the tensors it read in (the same as leaving the field out)."""
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.DEFAULT:
            tensor.ClearField("data_location")
    return model


@pytest.mark.parametrize("name", ["decoder", "one-file"])
def test_the_checks_numbers_are_the_outputs_compared_side_by_side(decoder, one_file, name):
    path, config = _cases(decoder, one_file, name)
    result = optimize(path, config)
    c = config.check
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sessions = [  # the check's sessions as they were: serialized protos, both alive
        ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for m in (onnx.load(path), proto_with_weights(result.model))
    ]
    distribution = FloatDistribution(c.input_distribution, mean=c.input_mean, std=c.input_std)
    graph = onnx.load(path, load_external_data=False)
    for profile in result.check.profiles:
        worst: dict[str, float] = {}
        for seed in profile.seeds:
            feed = random_inputs(graph, seed=seed, dims=profile.dims, distribution=distribution)
            want, got = (s.run(None, feed) for s in sessions)
            for out, w, g in zip(sessions[0].get_outputs(), want, got, strict=True):
                diff = np.abs(w.astype(np.float64) - g.astype(np.float64)).max()
                worst[out.name] = max(worst.get(out.name, 0.0), float(diff))
        reported = {o.name: o.max_abs_diff for o in profile.outputs}
        assert set(reported) == set(worst)
        for key, value in worst.items():  # the same float64 arithmetic: exactly equal
            np.testing.assert_allclose(reported[key], value, rtol=0, atol=0, err_msg=key)


def test_the_check_hands_onnxruntime_paths_one_session_at_a_time(decoder, monkeypatch):
    made: list[dict] = []
    live: list[weakref.ref] = []

    class Spy(ort.InferenceSession):
        def __init__(self, path_or_bytes, *args, **kwargs):
            alive = sum(ref() is not None for ref in live)
            given = path_or_bytes if isinstance(path_or_bytes, str) else None
            data = Path(given).with_name(Path(given).name + ".data") if given else None
            made.append({"path": given, "alive": alive, "data": bool(data and data.is_file())})
            super().__init__(path_or_bytes, *args, **kwargs)
            live.append(weakref.ref(self))

    monkeypatch.setattr(ort, "InferenceSession", Spy)
    result = optimize(decoder, ON_ORT)
    assert result.check.passed
    original, fused = made  # two sessions, each from a file, never from bytes
    assert original == {"path": str(decoder), "alive": 0, "data": True}
    assert fused["alive"] == 0  # the original's session was released first
    assert fused["data"] and Path(fused["path"]).name == "fused.onnx"
    assert Path(fused["path"]).parent != decoder.parent
    assert not Path(fused["path"]).parent.exists()  # the scratch folder is gone


def test_the_original_is_not_read_in_when_it_is_a_file(decoder):
    original = original_of(decoder)
    assert isinstance(original, ModelFile) and original.path == decoder
    on_disk = onnx.load(decoder, load_external_data=False).graph.initializer
    kept = {t.name: t for t in original.graph.graph.initializer}
    assert set(kept) == {t.name for t in on_disk}
    for tensor in on_disk:  # every type and shape, no byte of any weight
        assert (kept[tensor.name].data_type, kept[tensor.name].dims) == (
            tensor.data_type,
            tensor.dims,
        )
    assert not any(t.raw_data or t.float_data or t.int64_data for t in kept.values())
    assert original.graph.ByteSize() < DECODER.weight_bytes // 10  # the graph alone
    # and the run with the check leaves the weights no fusion touched where they lie
    result = optimize(decoder, ON_ORT)
    lazy = [
        v.name
        for v in result.model.graph.initializers.values()
        if isinstance(v.const_value, ir.ExternalTensor)
    ]
    assert "lm_head.weight" in lazy and "layers.0.mlp.down_proj" in lazy
