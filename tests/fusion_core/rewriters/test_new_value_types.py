"""Every value a rewrite creates has a type and a shape (``rewriters/_new_types.py``,
called by ``apply_rewrite`` for every rewriter), and the shapes written are right.

Why: a later layer's proof and label fallback read the values an earlier rewrite left
(the rows to keep, the guard of empty rows, the lengths, the Reshape back to the merged
heads); a value with neither names no size. Each fused model here (decoder attention
blocks drawn over their spellings: GroupQueryAttention with and without a cache, eager
and SDPA, dynamo's, a sliding window, a finite mask, MultiHeadAttention; and a
two-layer decoder with RMS norms, rotary and SwiGLU) is checked for:

* every output of a node carrying a rewrite's provenance, in the main graph, has a
  dtype and a rank in the saved model (saved with ``value_info: all``: the CPU profiles'
  written form leaves intermediate shapes out, ``pipeline/written.py``);
* on onnxruntime, at two lengths, each such value has that rank, each number dimension
  its size, each dimension named by the graph's inputs (``past + seq`` summed) that
  size, and each other name one size across all the values it labels (labels that do not
  lie).

Example budget: ``AUTOFUSION_SPELLING_EXAMPLES`` (spelling_settings.py).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core import provenance
from autofusion.fusion_core.testing import optimize_quiet
from tests.fusion_core.rewriters.test_group_query_attention import ORT, decoder_attention, feeds
from tests.fusion_core.spelling_settings import SPELLINGS

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import _big_models

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

LOWEST = float(np.finfo(np.float32).min)
# decoder_attention's spellings: cache, eager, dynamo, window, finite mask, no grouping,
# not causal
BLOCKS = st.fixed_dictionaries(
    {
        "cache": st.booleans(),
        "eager": st.booleans(),
        "dynamo": st.booleans(),
        "window": st.sampled_from([None, 3]),
        "lowest": st.sampled_from([-np.inf, LOWEST]),
        "kv_heads": st.sampled_from([2, 4]),
        "causal": st.booleans(),  # not causal: MultiHeadAttention (attention_block's)
    }
)


def made_values(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto | None]:
    """Each output of a main-graph node a rewrite made, with what the model says of it."""
    infos = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    made = {}
    for node in model.graph.node:
        if provenance.PATTERN in provenance.metadata(node):
            made.update({out: infos.get(out) for out in node.output if out})
    return made


def untyped(made: dict[str, onnx.ValueInfoProto | None]) -> list[str]:
    """The values with no dtype or no rank."""
    return [
        name
        for name, info in made.items()
        if info is None
        or not info.type.tensor_type.elem_type
        or not info.type.tensor_type.HasField("shape")
    ]


def actual_shapes(model: onnx.ModelProto, names: list[str], inputs: dict) -> dict[str, tuple]:
    """Each named value's shape as onnxruntime computes it on ``inputs``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    infos = {v.name: v for v in probe.graph.value_info}
    kept = {o.name for o in probe.graph.output}
    for name in names:
        if name not in kept:
            elem = infos[name].type.tensor_type.elem_type
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, ["CPUExecutionProvider"])
    outputs = session.run(names, inputs)
    return {name: tuple(out.shape) for name, out in zip(names, outputs, strict=True)}


def _named_sizes(model: onnx.ModelProto, inputs: dict) -> dict[str, int]:
    """The size each dimension name of the graph's inputs has in ``inputs``."""
    sizes = {}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(dims, inputs[value.name].shape, strict=True):
            if dim.dim_param:
                sizes[dim.dim_param] = size
    return sizes


def wrong_shapes(model: onnx.ModelProto, made: dict, inputs: dict) -> list[str]:
    """Where a written shape says other than onnxruntime's run on ``inputs``."""
    actual = actual_shapes(model, list(made), inputs)
    named, seen, wrong = _named_sizes(model, inputs), {}, []
    for name, info in made.items():
        dims, shape = info.type.tensor_type.shape.dim, actual[name]
        if len(dims) != len(shape):
            wrong.append(f"{name}: rank {len(dims)}, runs with {shape}")
            continue
        for dim, size in zip(dims, shape, strict=True):
            param = dim.dim_param
            terms = [t.strip() for t in param.split("+")] if param else []
            if dim.HasField("dim_value") and dim.dim_value != size:
                wrong.append(f"{name}: {dim.dim_value} where it runs with {size}")
            elif terms and all(t in named for t in terms):
                if sum(named[t] for t in terms) != size:
                    wrong.append(f"{name}: {param!r} where it runs with {size}")
            elif param and seen.setdefault(param, size) != size:
                wrong.append(f"{name}: {param!r} is {size} here, {seen[param]} elsewhere")
    return wrong


def check_values(model: onnx.ModelProto, inputs: list[dict]) -> None:
    """The two checks of the module docstring on the fused ``model``."""
    made = made_values(model)
    assert made, "no rewrite happened"
    assert not untyped(made), f"untyped values a rewrite made: {untyped(made)}"
    for each in inputs:
        assert not wrong_shapes(model, made, each), wrong_shapes(model, made, each)


@SPELLINGS
@given(spelling=BLOCKS)
def test_every_value_a_rewrite_makes_in_an_attention_block_has_its_shape(spelling) -> None:
    model = decoder_attention(**spelling)
    fused = optimize_quiet(model, **ORT, value_info="all").to_proto()
    cache, kv = spelling["cache"], spelling["kv_heads"]
    runs = [feeds(2, 3, 4, "left", cache=cache, kv=kv), feeds(1, 1, 6, "none", cache=cache, kv=kv)]
    check_values(fused, runs)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> tuple[onnx.ModelProto, _big_models.DecoderShape]:
    shape = replace(_big_models.shape_for_size(1 << 20), layers=2)
    made = _big_models.make_decoder(tmp_path_factory.mktemp("types"), shape, seed=3)
    return onnx.load(made["path"]), shape


def _decoder_inputs(vocab: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seq)
    mask = np.ones((batch, seq), np.int64)
    mask[-1, :1] = 0
    return {
        "input_ids": rng.integers(0, vocab, (batch, seq)),
        "attention_mask": mask,
        "position_ids": np.tile(np.arange(seq), (batch, 1)),
    }


def test_every_value_a_rewrite_makes_in_a_decoder_has_its_shape(decoder) -> None:
    model, shape = decoder
    fused = optimize_quiet(model, target="onnxruntime", value_info="all").to_proto()
    runs = [_decoder_inputs(shape.vocab, 2, 5), _decoder_inputs(shape.vocab, 1, 9)]
    check_values(fused, runs)
