"""Weights in a data file map only their own bytes (``fusion_core.ir.RangeMappedTensor``).

onnx-ir maps the whole data file for each tensor it reads; a job that held a few dozen
weights of a 2 GiB file at once needed more address space than the service's sandbox
allows (RLIMIT_AS: it failed as out of memory at 4 GiB resident). The test reads 40
weights of a data file padded to 256 MiB (a sparse file: no disk) under an address-space
limit of what the interpreter has plus 1 GiB: 40 whole-file mappings would need 10 GiB.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autofusion.fusion_core.ir import RangeMappedTensor, load_model

LAYERS = 40


def chain(folder: Path, *, pad_to: int = 256 << 20) -> Path:
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"w{i}")
        for i in range(LAYERS)
    ]
    weights.append(numpy_helper.from_array(np.array([1, 2, 3], np.int8), "small"))
    nodes = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(LAYERS)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info(f"h{LAYERS}", TensorProto.FLOAT, [1, 64])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    with open(folder / "m.data", "ab") as data:
        data.truncate(pad_to)
    return path


def test_each_weight_reads_its_own_bytes_exactly(tmp_path) -> None:
    path = chain(tmp_path)
    expected = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    model = load_model(path)
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        assert type(tensor) is RangeMappedTensor
        np.testing.assert_array_equal(tensor.numpy(), expected[name])
        assert tensor.tobytes() == expected[name].tobytes()
        assert len(tensor.raw) < tensor.nbytes + (64 << 10)  # its range, not the file
        tensor.release()
        assert tensor.raw is None
        np.testing.assert_array_equal(tensor.numpy(), expected[name])  # mapped again


def test_forty_weights_held_at_once_fit_a_small_address_space(tmp_path) -> None:
    path = chain(tmp_path)
    script = textwrap.dedent(
        f"""
        import resource
        from autofusion.fusion_core.ir import load_model
        size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), size + (1 << 30)))
        model = load_model({str(path)!r})
        held = [v.const_value.numpy() for v in model.graph.initializers.values()]
        print(len(held), float(sum(a.sum() for a in held)))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == str(LAYERS + 1)


@pytest.mark.parametrize("offset_pad", [0, 1, 4095, 4097])
def test_offsets_off_the_page_boundary(tmp_path, offset_pad) -> None:
    """A tensor that starts anywhere in the file (onnx writes them aligned; other tools do
    not): the mapping starts at the page below it."""
    values = np.arange(1000, dtype=np.float32)
    (tmp_path / "d.bin").write_bytes(bytes(offset_pad) + values.tobytes())
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1000])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "d.bin"), ("offset", str(offset_pad)), ("length", "4000")):
        tensor.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000])],
        [tensor],
    )
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    loaded = load_model(tmp_path / "m.onnx").graph.initializers["w"].const_value
    np.testing.assert_array_equal(loaded.numpy(), values)
    assert loaded.tobytes() == values.tobytes()
