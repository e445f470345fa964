"""The survey's dynamo KV export (bench/corpus ``_llm_torch.export``, ``batch``) keeps the
batch a dim when it exports from an example of two rows (``unseen_families.EXAMPLE_BATCH``):
every batched example input (ids, mask, position ids, past states) must have that many
rows, since the position ids' dim 0 is the same batch Dim; one row of positions beside
two rows of ids failed every family's KV export (torch.export's "True != False" or
"L['attention_mask'].size()[0] = 2 is not equal to L['input_ids'].size()[0] = 1").
A graph exported for any number of new tokens is checked against the model at another
batch and count (``_check_any_length``): torch.onnx's strict retry can fix a scan's chunk
count without a guard (Falcon-H1, Zamba2), a graph that runs up to 4 new tokens only.
One small export (Llama at the survey's sizes, a few seconds); it needs the corpus extra
(torch, transformers, onnxruntime), so the corpus tier runs it.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import _kv_states as kv  # noqa: E402 (torch first: importorskip)
import _llm_families as fam  # noqa: E402 (torch first: importorskip)
import _llm_torch  # noqa: E402 (torch first: importorskip)

PAST, ROWS = 4, 3  # a batch neither the example's 2 nor 1


def test_a_kv_export_from_two_rows_keeps_the_batch_a_dim(tmp_path):
    path = tmp_path / "llama_dynamo_kv.onnx"
    _llm_torch.export("llama", "dynamo_kv", path, batch=2)
    graph = onnx.load(str(path)).graph
    batch_dims = {arg.name: arg.type.tensor_type.shape.dim[0] for arg in graph.input}
    fixed = {name: dim.dim_value for name, dim in batch_dims.items() if not dim.dim_param}
    assert not fixed, f"inputs whose batch the export fixed: {fixed}"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {}
    for arg in session.get_inputs():
        if arg.name.startswith("past_key_values."):
            shape = [ROWS, arg.shape[1], PAST, arg.shape[3]]
            feed[arg.name] = np.zeros(shape, np.float32)
    tokens = next(arg.shape[1] for arg in session.get_inputs() if arg.name == "input_ids")
    new = tokens if isinstance(tokens, int) else 2  # a free count: above torch's 0 and 1
    feed["input_ids"] = np.full((ROWS, new), 5, np.int64)
    feed["attention_mask"] = np.ones((ROWS, PAST + new), np.int64)
    feed["position_ids"] = np.tile(np.arange(PAST, PAST + new), (ROWS, 1))
    logits = session.run(["logits"], feed)[0]
    assert logits.shape[0] == ROWS


class _Program:
    """Stands in for torch.onnx's program: the wrapper's own outputs, shifted by ``bias``."""

    def __init__(self, wrapper, bias: float) -> None:
        self.wrapper, self.bias, self.released = wrapper, bias, False

    def __call__(self, ids, mask, positions, pasts):
        with torch.no_grad():
            logits, *states = self.wrapper(ids, mask, positions, [t.clone() for t in pasts])
        return (logits + self.bias, *states)

    def release(self) -> None:
        self.released = True


@pytest.mark.parametrize(("bias", "passes"), [(0.0, True), (5e-5, True), (3e-4, False)])
def test_the_any_length_graph_is_checked_against_the_model_beyond_the_example(bias, passes):
    model = fam.build("llama")
    states = kv.layout(model, fam.prompt())
    wrapper = _llm_torch.DecodeWithCache(model, states).train(False)
    program = _Program(wrapper, bias)  # KV_CHECK_ATOL is 1e-4
    if passes:
        _llm_torch._check_any_length(program, wrapper, states, batch=2)
    else:
        with pytest.raises(ValueError, match="logits differ by 0.0003"):
            _llm_torch._check_any_length(program, wrapper, states, batch=2)
    assert program.released
