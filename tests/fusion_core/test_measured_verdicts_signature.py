"""The region signature: blind to names, sensitive to what the fused regions compute on.

Properties (hypothesis) on a BERT proposal, whose groups include fusions a later round
consumed (MultiHeadAttention packed into Attention) and fusions of several nodes (the
Q/K/V merge): renaming every node and tensor leaves every signature as it was; changing
a fused node's attribute or an input's dtype changes its group's signature.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core import OptimizeConfig
from autofusion.fusion_core.catalog import builtin_patterns
from autofusion.fusion_core.pipeline import optimize_once
from autofusion.fusion_core.pipeline.measured import (
    group_fusions,
    group_signature,
    pattern_hash,
    shape_class,
)
from autofusion.fusion_core.pipeline.result import Result

BERT = Path(__file__).resolve().parents[2] / "tests" / "data" / "transformers"
BERT = BERT / "bert_eager_torchscript.onnx"
DIMS = {"batch": 2, "sequence": 16}
HASHES = {p.name: pattern_hash(p.spec) for p in builtin_patterns()}
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def _proposal_proto():
    # what measured selection proposes: the fusions priced as a loss too
    config = OptimizeConfig(target="onnxruntime", selection="measured", check={"enabled": False})
    result = optimize_once(BERT, config)
    return ir.to_proto(result.model).SerializeToString(), tuple(result.applied)


def proposal() -> Result:
    """A fresh copy of the BERT proposal (its model is changed in place by the tests;
    parsed again each time: an ir model shares its initializers' protos)."""
    data, applied = _proposal_proto()
    model = ir.from_proto(onnx.load_from_string(data))
    return Result(model=model, target="onnxruntime", patterns_used=[], applied=list(applied))


def signatures(result: Result) -> dict[str, str]:
    return {
        g.key: group_signature(g, result, HASHES, DIMS).signature
        for g in group_fusions(result.applied)
    }


BEFORE = signatures(proposal())
NODES = tuple(n.name for n in ir.traversal.RecursiveGraphIterator(proposal().model.graph))


def _values(model: ir.Model) -> list[ir.Value]:
    seen: dict[int, ir.Value] = {}
    for value in [*model.graph.inputs, *model.graph.initializers.values()]:
        seen[id(value)] = value
    for node in model.graph:
        for value in [*node.inputs, *node.outputs]:
            if value is not None:
                seen[id(value)] = value
    return list(seen.values())


def test_there_is_something_to_sign() -> None:
    assert len(BEFORE) >= 5 and len(set(BEFORE.values())) == len(BEFORE)
    assert "attention -> com.microsoft::MultiHeadAttention" in BEFORE  # consumed later


VALUES = tuple(v.name for v in _values(proposal().model))


@SETTINGS
@given(st.permutations(NODES), st.permutations(VALUES), st.text(max_size=6))
def test_renaming_nodes_and_tensors_keeps_every_signature(nodes, values, prefix) -> None:
    result = proposal()
    renamed = dict(zip(NODES, (f"{prefix}{n}" for n in nodes), strict=True))
    for node in ir.traversal.RecursiveGraphIterator(result.model.graph):
        node.name = renamed[node.name]
    graph_values = _values(result.model)
    for k, value in enumerate(graph_values):  # first apart: two initializers never clash
        value.name = f"renaming {k}"
    for value, name in zip(graph_values, values, strict=True):
        value.name = f"{prefix}~{name}"

    def moved(names: tuple[str, ...]) -> tuple[str, ...]:
        # a name gone from the graph (consumed by a later round) is renamed alike
        return tuple(renamed.get(n, f"{prefix}{n}") for n in names)

    result.applied = [
        dataclasses.replace(f, new_nodes=moved(f.new_nodes), replaced_nodes=moved(f.replaced_nodes))
        for f in result.applied
    ]
    assert signatures(result) == BEFORE


FUSED = [n for n in NODES if n.startswith(("skip_layer_norm", "gelu", "attention_packed"))]
NORMS = [n for n in FUSED if n.startswith("skip_layer_norm")]


def _group_of(result: Result, name: str) -> str:
    return next(
        g.key for g in group_fusions(result.applied) if any(name in f.new_nodes for f in g.fusions)
    )


@SETTINGS
@given(st.sampled_from(NORMS), st.floats(1e-9, 1e-3))
def test_changing_an_attribute_changes_its_groups_signature(name, epsilon) -> None:
    result = proposal()
    node = next(n for n in result.model.graph if n.name == name)
    node.attributes["epsilon"] = ir.AttrFloat32("epsilon", epsilon)  # was 1e-12
    after = signatures(result)
    assert after[_group_of(result, name)] != BEFORE[_group_of(result, name)]


@SETTINGS
@given(st.sampled_from(FUSED), st.sampled_from([ir.DataType.FLOAT16, ir.DataType.DOUBLE]))
def test_changing_a_dtype_changes_its_groups_signature(name, dtype) -> None:
    result = proposal()
    node = next(n for n in result.model.graph if n.name == name)
    node.inputs[0].type = ir.TensorType(dtype)  # was float
    after = signatures(result)
    assert after[_group_of(result, name)] != BEFORE[_group_of(result, name)]


@pytest.mark.parametrize(
    ("size", "shown"),
    [(1, 1), (16, 16), (17, 16), (22, 16), (23, 32), (192, 256), (700, 512), (768, 1024)],
)
def test_shape_classes(size: int, shown: int) -> None:
    assert shape_class(size) == shown
