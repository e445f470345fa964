"""``merge_siblings`` merges weights without reading them (issue 29): the merged weight
and bias are ``ir.LazyTensor``s over the sources' tensors, read (concatenated) only when
something asks, such as a save, which streams them one at a time.

What is checked: after the rewrite no weight was read from the data file and the merged
values hold lazy tensors; a read leaves no source mapped; the saved model's initializers
are byte-identical (rtol = atol = 0) to those of the same model with every merged tensor
read into memory first (what the rewriter held before) and to ``np.concatenate`` of the
sources; and, in a child process, optimizing a ~120 MB model does not grow the resident
memory by the merged bytes, nor does saving it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize
from autofusion.fusion_core.ir import RangeMappedTensor, save_model

MERGES = {"qkv_bias_merge", "qkv_merge", "kv_merge"}
DTYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}


def decoder_like(
    folder: Path,
    *,
    hidden: int = 32,
    kv_width: int = 16,
    layers: int = 2,
    dtype: str = "float32",
    bias_shape: tuple[int, ...] | None = (),
    seed: int = 0,
    one_file: bool = False,
) -> Path:
    """Per layer ``l``: Q/K/V projections of ``h`` (K and V ``kv_width`` wide) with bias
    Adds of ``bias_shape`` (``()``: as wide as the projection; None: no biases), and a
    gate/up pair; the next ``h`` adds them back together. Saved with every tensor in
    ``m.data``, or ``one_file``."""
    rng = np.random.default_rng(seed)
    elem = DTYPES[dtype]
    inits, nodes = [], []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        array = (rng.standard_normal(shape) * 0.25).astype(dtype)
        inits.append(numpy_helper.from_array(array, name))
        return name

    def node(op: str, inputs: list[str], out: str) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out))
        return out

    h = "h0"
    for layer in range(layers):
        p = f"l{layer}"
        proj = {}
        for role, width in (("q", hidden), ("k", kv_width), ("v", kv_width)):
            out = node(
                "MatMul", [h, weight(f"{p}.attn.{role}.weight", (hidden, width))], f"{p}.{role}"
            )
            if bias_shape is not None:
                shape = bias_shape or (width,)
                out = node("Add", [out, weight(f"{p}.attn.{role}.bias", shape)], f"{p}.{role}_b")
            proj[role] = out
        kv = node("Mul", [proj["k"], proj["v"]], f"{p}.kv")
        widened = node("MatMul", [kv, weight(f"{p}.attn.o.weight", (kv_width, hidden))], f"{p}.o")
        attn = node("Add", [proj["q"], widened], f"{p}.attn")
        gate = node("MatMul", [attn, weight(f"{p}.mlp.gate.weight", (hidden, hidden))], f"{p}.g")
        up = node("MatMul", [attn, weight(f"{p}.mlp.up.weight", (hidden, hidden))], f"{p}.u")
        h = node("Mul", [gate, up], f"h{layer + 1}")
    graph = helper.make_graph(
        nodes,
        "decoder_like",
        [helper.make_tensor_value_info("h0", elem, [1, 4, hidden])],
        [helper.make_tensor_value_info(h, elem, [1, 4, hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    path = folder / "m.onnx"
    if one_file:
        onnx.save(model, path)
    else:
        onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    return path


def fuse(path: Path):
    """The merges on the model at ``path``: given as a file, its weights stay in it (a model
    given in memory is copied with its weights)."""
    config = OptimizeConfig(
        target="generic",
        patterns=sorted(MERGES),
        target_profile="cpu-roofline",  # prices the merges as gains (test_cost_defaults.py)
        check=CheckOptions(enabled=False),
    )
    return optimize(path, config)


def merged_values(model: ir.Model) -> dict[str, ir.Value]:
    """The merged weights and biases (not the Split's sizes)."""
    return {
        n: v
        for n, v in model.graph.initializers.items()
        if ".merged_weight" in n or ".merged_bias" in n
    }


def saved_initializers(path: Path) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in onnx.load(path).graph.initializer}


@pytest.fixture
def loads(monkeypatch) -> list[RangeMappedTensor]:
    """Every data-file tensor mapped (read) while the test runs, in order."""
    mapped: list[RangeMappedTensor] = []
    load = RangeMappedTensor._load

    def spy(self: RangeMappedTensor) -> None:
        mapped.append(self)
        load(self)

    monkeypatch.setattr(RangeMappedTensor, "_load", spy)
    return mapped


def test_the_rewrite_reads_no_weight_and_a_read_unmaps_the_sources(tmp_path, loads):
    result = fuse(decoder_like(tmp_path))
    assert result.counts == {"qkv_bias_merge": 2, "kv_merge": 2}
    merged = merged_values(result.model)
    assert sorted(merged) == [
        f"l{i}.{part}" for i in range(2)
        for part in ("attn.merged_bias", "attn.merged_weight", "mlp.merged_weight")
    ]  # fmt: skip
    weights_read = [t.name for t in loads if t.name and "weight" in t.name]
    assert weights_read == [], "the merges read weights they only need the shapes of"
    for value in merged.values():
        assert isinstance(value.const_value, ir.LazyTensor)
    tensor = merged["l0.attn.merged_weight"].const_value
    assert (tensor.dtype, list(tensor.shape)) == (ir.DataType.FLOAT, [32, 64])
    loads.clear()
    assert tensor.numpy().shape == (32, 64)
    sources = sorted(t.name for t in loads)
    assert sources == [f"l0.attn.{r}.weight" for r in "kqv"]
    assert all(t.raw is None for t in loads), "a source stayed mapped after the read"


def materialized(model: ir.Model) -> None:
    """Every lazy merged tensor read into memory, as the rewriter held them before."""
    for value in merged_values(model).values():
        tensor = value.const_value
        value.const_value = ir.Tensor(tensor.numpy(), dtype=tensor.dtype)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=st.sampled_from(sorted(DTYPES)),
    kv_width=st.sampled_from([8, 16, 32]),
    bias_shape=st.sampled_from([(), (1,), None]),
    external_data=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_saved_model_is_byte_identical(
    tmp_path_factory, dtype, kv_width, bias_shape, external_data, seed
):
    folder = tmp_path_factory.mktemp("lazy")
    source = decoder_like(folder, dtype=dtype, kv_width=kv_width, bias_shape=bias_shape, seed=seed)
    original = {
        t.name: numpy_helper.to_array(t, base_dir=str(folder))
        for t in onnx.load(source).graph.initializer
    }
    lazy = fuse(source).model
    assert merged_values(lazy)
    save_model(lazy, folder / "lazy.onnx", external_data=external_data)
    eager = fuse(source).model
    materialized(eager)
    save_model(eager, folder / "eager.onnx", external_data=external_data)
    got, want = saved_initializers(folder / "lazy.onnx"), saved_initializers(folder / "eager.onnx")
    assert sorted(got) == sorted(want)
    for name, tensor in got.items():
        a = numpy_helper.to_array(tensor, base_dir=str(folder))
        b = numpy_helper.to_array(want[name], base_dir=str(folder))
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    saved = {n: numpy_helper.to_array(t, base_dir=str(folder)) for n, t in got.items()}
    for block, roles in (("attn", "qkv"), ("mlp", ("gate", "up"))):
        parts = [original[f"l1.{block}.{r}.weight"] for r in roles]
        expected = np.concatenate(parts, axis=1)
        np.testing.assert_array_equal(saved[f"l1.{block}.merged_weight"], expected, strict=True)
    if bias_shape is not None:  # each bias as wide as its projection, then side by side
        widths = (32, kv_width, kv_width)
        parts = [
            np.broadcast_to(original[f"l1.attn.{r}.bias"].reshape(-1), (w,))
            for r, w in zip("qkv", widths, strict=True)
        ]
        np.testing.assert_array_equal(
            saved["l1.attn.merged_bias"], np.concatenate(parts), strict=True
        )


def test_weights_of_a_one_file_model_merge_lazily_too(tmp_path):
    """In one file the big weights are ``ir.LazyTensor``s over the file (fusion_core/
    onefile): the merged weight reads them, byte for byte."""
    source = decoder_like(tmp_path, hidden=256, kv_width=128, layers=1, one_file=True)
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(source).graph.initializer}
    merged = merged_values(fuse(source).model)["l0.mlp.merged_weight"].const_value
    assert isinstance(merged, ir.LazyTensor)
    parts = [original[f"l0.mlp.{r}.weight"] for r in ("gate", "up")]
    expected = np.concatenate(parts, axis=1)
    assert merged.tobytes() == expected.tobytes()  # rtol = atol = 0


CHILD = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_merge_siblings_lazy import decoder_like, fuse, merged_values
from autofusion.fusion_core.ir import save_model

def status(key):
    return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) * 1024

warm = Path({folder!r}) / "warm"
warm.mkdir()
fuse(decoder_like(warm))  # imports and first-call caches, not measured
open("/proc/self/clear_refs", "w").write("5")  # VmHWM: the peak from here on
before = status("VmRSS")
result = fuse(Path({path!r}))
after = status("VmRSS")
merged = merged_values(result.model)
lazy = all(type(v.const_value).__name__ == "LazyTensor" for v in merged.values())
merged_bytes = sum(v.const_value.nbytes for v in merged.values())
save_model(result.model, Path({folder!r}) / "out.onnx", external_data=True)
print(json.dumps(dict(before=before, after=after, peak=status("VmHWM"), lazy=lazy,
                      merged_bytes=merged_bytes, counts=result.counts)))
"""


def test_a_100mb_model_is_fused_and_saved_without_holding_the_merged_weights(tmp_path):
    # 6 layers of 1024-wide projections: 120 MiB of merged weights, each merge 8-12 MiB
    path = decoder_like(tmp_path, hidden=1024, kv_width=1024, layers=6, bias_shape=None)
    script = CHILD.format(tests=str(Path(__file__).parent), folder=str(tmp_path), path=str(path))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["counts"] == {"qkv_merge": 6, "kv_merge": 6}
    assert got["lazy"] is True
    assert got["merged_bytes"] == 6 * (3 + 2) * 1024 * 1024 * 4
    # before: every merged byte held in a new array, and the sources read as well
    assert got["after"] - got["before"] < got["merged_bytes"] // 4, got
    # the save holds one merge and its sources at a time, not all of them
    assert got["peak"] - got["before"] < got["merged_bytes"] // 2, got
    fused = saved_initializers(tmp_path / "out.onnx")
    assert {n for n in fused if ".merged_weight" in n} == {
        f"l{i}.{b}.merged_weight" for i in range(6) for b in ("attn", "mlp")
    }
