"""The report's node counts: the main graph's are the headline (``nodes.before/after``,
``by_op_*``), the If/Loop/Scan bodies' are counted apart (``nodes.subgraphs``), and every
rendering and the one reader say so. A rewriter that emits an If (the empty-rows guard)
must not read as a model that grew, nor a branch that never runs as the model's nodes."""

from __future__ import annotations

from collections import Counter

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.report import (
    build_report,
    format_markdown,
    format_summary,
    read_report,
    render_html,
)
from autofusion.fusion_core.testing import conv_bn_relu
from tests.fusion_core.test_report import validate

# Ops no pattern fuses alone, and none of conv_bn_relu's main graph.
BRANCH_OPS = ("Neg", "Abs", "Sigmoid", "Exp", "Tanh")
SHAPE = [1, 3, 8, 8]


def _branch(name: str, ops: list[str], inner: onnx.GraphProto | None = None) -> onnx.GraphProto:
    """A body reading the outer ``x``: a chain of ``ops``, or ``inner``'s If first."""
    nodes, current = [], "x"
    if inner is not None:
        nodes.append(
            helper.make_node(
                "If",
                ["cond"],
                [f"{name}_inner"],
                then_branch=inner,
                else_branch=inner,
                name=f"{name}_if",
            )
        )
        current = f"{name}_inner"
    for index, op in enumerate(ops):
        out = f"{name}_{index}"
        nodes.append(helper.make_node(op, [current], [out], name=out))
        current = out
    out = helper.make_tensor_value_info(current, TensorProto.FLOAT, SHAPE)
    return helper.make_graph(nodes, name, [], [out])


def _with_if(then_ops: list[str], else_ops: list[str], nested: list[str]) -> onnx.ModelProto:
    """conv_bn_relu (which fuses) beside an If on a bool input whose branches read x;
    ``nested``: an If of these ops inside the then branch."""
    model = conv_bn_relu()
    graph = model.graph
    inner = _branch("nested", nested) if nested else None
    graph.node.append(
        helper.make_node(
            "If",
            ["cond"],
            ["z"],
            then_branch=_branch("then", then_ops, inner),
            else_branch=_branch("else", else_ops),
            name="choose",
        )
    )
    graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, SHAPE))
    onnx.checker.check_model(model, full_check=True)
    return model


def _report(model: onnx.ModelProto, folder) -> dict:
    model_path, fused_path = folder / "model.onnx", folder / "fused.onnx"
    onnx.save(model, model_path)
    result = optimize(model_path, OptimizeConfig(target="onnxruntime"))
    save_model(result.model, fused_path)
    return build_report(result, model=str(model_path), output=str(fused_path))


_OPS = st.lists(st.sampled_from(BRANCH_OPS), min_size=1, max_size=4)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(then_ops=_OPS, else_ops=_OPS, nested=st.one_of(st.just([]), _OPS))
def test_the_main_graph_is_the_headline_and_the_bodies_are_counted_apart(
    tmp_path, then_ops, else_ops, nested
):
    report = _report(_with_if(then_ops, else_ops, nested), tmp_path)
    validate(report)
    nodes = report["nodes"]
    # conv, bn, relu and the If; fused: FusedConv and the If
    assert (nodes["before"], nodes["after"]) == (4, 2)
    assert nodes["by_op_before"] == {"BatchNormalization": 1, "Conv": 1, "If": 1, "Relu": 1}
    assert nodes["by_op_after"] == {"com.microsoft::FusedConv": 1, "If": 1}
    bodies = Counter(then_ops) + Counter(else_ops) + Counter(nested * 2)  # nested: two branches
    bodies += Counter({"If": 1}) if nested else Counter()
    total = sum(bodies.values())
    assert nodes["subgraphs"] == {
        "before": total,
        "after": total,
        "by_op_before": dict(sorted(bodies.items())),
        "by_op_after": dict(sorted(bodies.items())),
    }
    facts = read_report(report)
    assert (facts.nodes_before, facts.nodes_after) == (4, 2)
    assert facts.subgraph_nodes == f"{total} -> {total} in If/Loop/Scan bodies"


@pytest.fixture(scope="module")
def with_if(tmp_path_factory) -> dict:
    return _report(_with_if(["Neg", "Abs"], ["Exp"], []), tmp_path_factory.mktemp("if"))


def test_every_rendering_shows_the_bodies_apart_from_the_headline(with_if):
    summary = format_summary(with_if)
    assert "nodes: 4 -> 2\n" in summary
    assert "nodes in If/Loop/Scan bodies: 3 -> 3\n" in summary
    table = summary[summary.index("nodes: 4 -> 2") : summary.index("nodes in If/Loop/Scan")]
    assert "Neg" not in table  # a body's op is not in the main graph's table
    markdown = format_markdown(with_if)
    assert "**Nodes:** 4 -> 2 (and 3 -> 3 in If/Loop/Scan bodies)" in markdown
    html = render_html(with_if)
    assert '<span id="nodes-before">4</span> → <span id="nodes-after">2</span>' in html
    assert "(and 3 -&gt; 3 in If/Loop/Scan bodies)" in html


def test_a_model_without_bodies_has_no_subgraph_counts(tmp_path):
    report = _report(conv_bn_relu(), tmp_path)
    validate(report)
    assert report["nodes"]["subgraphs"] is None
    assert (report["nodes"]["before"], report["nodes"]["after"]) == (3, 1)
    assert read_report(report).subgraph_nodes is None
    assert "If/Loop/Scan" not in format_summary(report) + format_markdown(report)
    assert 'id="subgraph-nodes"' not in render_html(report)


def test_a_stored_report_from_before_the_split_still_reads(with_if):
    old = {**with_if, "nodes": {k: v for k, v in with_if["nodes"].items() if k != "subgraphs"}}
    facts = read_report(old)
    assert (facts.nodes_before, facts.nodes_after, facts.subgraph_nodes) == (4, 2, None)
    assert "nodes: 4 -> 2" in format_summary(old)
