"""External data everywhere a tensor can live (issue 15, item 6): ``save_model`` writes a
model whose every tensor is inside the file or in the data file it names beside it,
and ``load_model`` checks every external-data location, function bodies included.

The tensors sit in a ``Constant`` node's attribute in a model-local function's body, in
a ``Constant`` inside an ``If`` branch, and as a main-graph ``Constant``: onnx-ir moves
only initializers in and out of external data, so these used to keep ``location: w.bin``
and the saved model did not load anywhere but beside the original's data file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from autofusion.fusion_core.errors import UnsafeModelError
from autofusion.fusion_core.ir import load_model, save_model

MODEL = """\
<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
g (float[4] x, bool c) => (float[4] y) {
    a = local.AddW (x)
    b = If (c) <
        then_branch = t () => (float[4] tb) {
            tw = Constant <value = float[4] {0, 0, 0, 0}> ()
            tb = Add (a, tw)
        },
        else_branch = e () => (float[4] eb) { eb = Identity (a) }
    >
    k = Constant <value = float[4] {0, 0, 0, 0}> ()
    y = Add (b, k)
}
<domain: "local", opset_import: ["" : 17]>
AddW (x) => (y) {
    w = Constant <value = float[4] {0, 0, 0, 0}> ()
    y = Add (x, w)
}
"""
WEIGHTS = {
    "function": np.array([1, 2, 3, 4], np.float32),
    "branch": np.array([10, 20, 30, 40], np.float32),
    "main": np.array([100, 200, 300, 400], np.float32),
}


def _constants(model: onnx.ModelProto) -> dict[str, onnx.AttributeProto]:
    """The ``value`` attribute of each Constant node, by where it sits."""
    function_node = model.functions[0].node[0]
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    branch_node = next(a.g for a in if_node.attribute if a.name == "then_branch").node[0]
    main_node = next(n for n in model.graph.node if n.op_type == "Constant")
    return {
        "function": function_node.attribute[0],
        "branch": branch_node.attribute[0],
        "main": main_node.attribute[0],
    }


def write_model_with_external_constants(folder: Path, location: str = "w.bin") -> Path:
    """``model.onnx`` whose three Constant tensors live in ``folder/w.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    model = onnx.parser.parse_model(MODEL)
    offset = 0
    with open(folder / "w.bin", "wb") as data:
        for where, attr in _constants(model).items():
            tensor = numpy_helper.from_array(WEIGHTS[where], name=f"{where}_w")
            raw = tensor.raw_data
            data.write(raw)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", offset), ("length", len(raw))):
                tensor.external_data.append(onnx.StringStringEntryProto(key=key, value=str(value)))
            offset += len(raw)
            attr.t.CopyFrom(tensor)
    path = folder / "model.onnx"
    onnx.save(model, path)
    return path


def expected(x: np.ndarray, c: bool) -> np.ndarray:
    a = x + WEIGHTS["function"]
    return (a + WEIGHTS["branch"] if c else a) + WEIGHTS["main"]


def run(path: Path, c: bool) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.array([0.5, 1.5, 2.5, 3.5], np.float32)
    (y,) = session.run(None, {"x": x, "c": np.array(c)})
    np.testing.assert_allclose(y, expected(x, c), rtol=0, atol=0)
    return y


def test_a_saved_model_keeps_no_reference_to_the_original_data_file(tmp_path):
    source = write_model_with_external_constants(tmp_path / "input")
    run(source, True)  # the hand-made model itself is valid beside its w.bin

    saved = tmp_path / "output" / "fused.onnx"
    written = save_model(load_model(source), saved)

    assert written == [saved]
    proto = onnx.load(saved, load_external_data=False)
    for where, attr in _constants(proto).items():
        assert not uses_external_data(attr.t), f"the {where} Constant still refers to w.bin"
        np.testing.assert_array_equal(numpy_helper.to_array(attr.t), WEIGHTS[where])
    # The downloaded model loads and runs on its own: no w.bin beside it.
    assert sorted(p.name for p in saved.parent.iterdir()) == ["fused.onnx"]
    onnx.checker.check_model(onnx.load(saved), full_check=True)
    run(saved, True)
    run(saved, False)


def test_an_unsafe_location_in_a_function_body_is_refused(tmp_path):
    (tmp_path / "secret").write_bytes(b"\0" * 64)
    source = write_model_with_external_constants(tmp_path / "input")
    model = onnx.load(source, load_external_data=False)
    entries = _constants(model)["function"].t.external_data
    next(e for e in entries if e.key == "location").value = "../secret"
    onnx.save(model, source)  # only the function body's Constant points outside
    with pytest.raises(UnsafeModelError, match="outside the model's folder"):
        load_model(source)


def test_a_function_body_tensor_attribute_list_is_rewritten_too(tmp_path):
    """``tensors`` (a list) attributes are tensors as well, wherever they sit."""
    folder = tmp_path / "input"
    folder.mkdir()
    values = np.arange(4, dtype=np.float32)
    tensor = numpy_helper.from_array(values, name="listed")
    (folder / "w.bin").write_bytes(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.append(onnx.StringStringEntryProto(key="location", value="w.bin"))
    node = helper.make_node("Relu", ["x"], ["y"], domain="")
    node.attribute.append(helper.make_attribute("blobs", [tensor]))
    function = helper.make_function(
        "local", "F", ["x"], ["y"], [node], [helper.make_opsetid("", 17)]
    )
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y"], domain="local")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(
        graph,
        functions=[function],
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
    )
    onnx.save(model, folder / "model.onnx")

    saved = tmp_path / "output" / "fused.onnx"
    save_model(load_model(folder / "model.onnx"), saved)

    attr = onnx.load(saved, load_external_data=False).functions[0].node[0].attribute[0]
    assert not any(uses_external_data(t) for t in attr.tensors)
    np.testing.assert_array_equal(numpy_helper.to_array(attr.tensors[0]), values)
