"""Constant folding's growth budget (fusion_core/prepasses/_fold_budget.py): a value that
would take what folding adds past the budget stays as its producer and is never computed,
the report says which and why, and folding within the budget is exactly as before.

The model is the issue's (``testing.constant_fills``: ConstantOfShape fills summed), at
20 of 512x1024 (2 MiB each) with a budget the test sets, and at the full 100 of
1024x2048 (800 MiB folded) with the defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnx_ir as ir
import onnxscript.optimizer._constant_folding as onnxscript_folding
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markupsafe import escape

from autofusion.fusion_core import OptimizeConfig, optimize, testing
from autofusion.fusion_core.config import FOLD_GROWTH_FLOOR_BYTES
from autofusion.fusion_core.prepasses import (
    FoldRecord,
    PrepassOptions,
    constant_bytes,
    run_prepasses,
)
from autofusion.fusion_core.report import (
    build_report,
    format_markdown,
    format_summary,
    render_html,
)
from autofusion.fusion_core.report import schema as schema_cli
from autofusion.fusion_core.validate import make_session, random_inputs

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_dynamo.onnx"
FILL = (512, 1024)  # float32: 2 MiB a fill
FILL_BYTES = 512 * 1024 * 4
UNLIMITED = {"fold_growth_ratio": 0.0, "fold_growth_floor_bytes": 1 << 62}
F32 = onnx.TensorProto.FLOAT


@pytest.fixture
def evaluated(monkeypatch) -> list[tuple[str, int]]:
    """(op type, bytes) of every value onnxscript's folder computes: what folding
    materialized, refused values included."""
    seen: list[tuple[str, int]] = []
    evaluator = onnxscript_folding._reference_evaluator
    original = evaluator.evaluate

    def evaluate(domain, op, version, *args, **kwargs):
        out = original(domain, op, version, *args, **kwargs)
        seen.append((op, out.nbytes if isinstance(out, np.ndarray) else 0))
        return out

    monkeypatch.setattr(evaluator, "evaluate", evaluate)
    return seen


def _budget(floor: int) -> dict:
    return {"fold_growth_ratio": 0.0, "fold_growth_floor_bytes": floor}


def _fills_left(model: ir.Model | onnx.ModelProto) -> int:
    graph = model.graph
    nodes = graph.node if isinstance(model, onnx.ModelProto) else graph
    return sum(1 for n in nodes if n.op_type == "ConstantOfShape")


def _prepassed(model: onnx.ModelProto, **options) -> tuple[ir.Model, FoldRecord]:
    work = ir.serde.deserialize_model(model)
    folding: list[FoldRecord] = []
    run_prepasses(work, PrepassOptions(**options), folding=folding)
    return work, folding[0]


# --- the model -----------------------------------------------------------------


def test_a_budget_leaves_the_fills_past_it_uncomputed(evaluated) -> None:
    model = testing.constant_fills(20, FILL)
    config = OptimizeConfig(**_budget(5 << 20))  # room for two fills of 2 MiB
    result = optimize(model, config)

    assert [op for op, _ in evaluated] == ["ConstantOfShape"] * 2  # the 18 others: never
    folding = result.folding
    assert folding is not None and folding.budget_bytes == 5 << 20
    assert folding.grown_bytes == 2 * (FILL_BYTES - 4)  # less each fill's 4-byte value
    assert [(u.name, u.op_type, u.bytes, u.reason) for u in folding.unfolded] == [
        (f"fill{i}", "ConstantOfShape", FILL_BYTES, "fold_budget") for i in range(2, 20)
    ]
    fused = result.to_proto()
    assert _fills_left(fused) == 18
    assert constant_bytes(result.model) - result.input_bytes <= 5 << 20
    onnx.checker.check_model(fused, full_check=True)
    # The same Sum over the same values, some now initializers: bit for bit.
    feed = random_inputs(model, seed=0)
    want = make_session(model).run(None, feed)
    got = make_session(fused).run(None, feed)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=0)


def test_the_default_budget_stops_the_full_attack_without_computing_it(evaluated) -> None:
    """100 fills of 1024x2048 (8 MiB each, 800 MiB in all) from a 12 KB model: the
    defaults compute and keep 4 of them (the 32 MiB floor), never the other 96."""
    model = testing.constant_fills(100)
    assert model.ByteSize() < 16_000
    result = optimize(model, OptimizeConfig(check={"enabled": False}))

    assert sum(size for _, size in evaluated) <= FOLD_GROWTH_FLOOR_BYTES
    assert [op for op, _ in evaluated] == ["ConstantOfShape"] * 4
    assert constant_bytes(result.model) <= FOLD_GROWTH_FLOOR_BYTES + result.input_bytes
    assert result.folding is not None and len(result.folding.unfolded) == 96
    assert _fills_left(result.model) == 96


def test_a_value_over_the_tensor_limit_is_never_computed(evaluated) -> None:
    """onnxscript computes a value and then drops it when it has more elements than
    fold_output_size_limit: 2.5 GB for a 191-byte model. It is refused before."""
    model = testing.constant_fills(1, (64, 64))
    work, folding = _prepassed(model, fold_output_size_limit=1000)

    assert evaluated == []
    assert [(u.name, u.bytes, u.reason) for u in folding.unfolded] == [
        ("fill0", 64 * 64 * 4, "tensor_limit")
    ]
    assert _fills_left(work) == 1


def test_progressive_stages_share_the_budget() -> None:
    """Each stage starts from the previous one's model: with a budget of its own, every
    stage would fold two more fills."""
    model = testing.constant_fills(12, FILL)
    result = optimize(model, OptimizeConfig(progressive=True, **_budget(5 << 20)))

    assert result.check is not None and result.check.passed
    assert _fills_left(result.model) == 10
    assert constant_bytes(result.model) - result.input_bytes <= 5 << 20
    assert result.folding is not None and len(result.folding.unfolded) == 10


# --- what the budget charges -----------------------------------------------------------


def _weight_model(extra_reader: bool) -> onnx.ModelProto:
    """y = x @ Transpose(w) (+ x @ w when ``extra_reader``), w 256x256 float32."""
    nodes = [
        oh.make_node("Transpose", ["w"], ["wt"], name="transpose"),
        oh.make_node("MatMul", ["x", "wt"], ["y"], name="matmul"),
    ]
    outputs = [oh.make_tensor_value_info("y", F32, [1, 256])]
    if extra_reader:
        nodes.append(oh.make_node("MatMul", ["x", "w"], ["z"], name="direct"))
        outputs.append(oh.make_tensor_value_info("z", F32, [1, 256]))
    w = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    graph = oh.make_graph(
        nodes,
        "w",
        [oh.make_tensor_value_info("x", F32, [1, 256])],
        outputs,
        [nh.from_array(w, "w")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("extra_reader", "folded"),
    [pytest.param(False, True, id="read-once"), pytest.param(True, False, id="read-twice")],
)
def test_growth_is_net_of_what_the_fold_frees(extra_reader: bool, folded: bool) -> None:
    """A weight transposed and read nowhere else leaves with its fold (growth 0: within
    a budget of 0); read elsewhere too, it stays, and the transpose would add 256 KiB."""
    work, folding = _prepassed(_weight_model(extra_reader), **_budget(0))

    assert ("Transpose" not in [n.op_type for n in work.graph]) is folded
    assert folding.grown_bytes == 0
    expected = [] if folded else [("transpose", 256 * 256 * 4, "fold_budget")]
    assert [(u.name, u.bytes, u.reason) for u in folding.unfolded] == expected


def test_what_onnxscript_keeps_by_its_own_rules_is_not_reported() -> None:
    """DequantizeLinear stays by onnxscript's rules (it keeps the quantization), not for
    the budget: the report must not blame the budget for it."""
    w = np.arange(-64, 64, dtype=np.int8).reshape(8, 16)
    graph = oh.make_graph(
        [
            oh.make_node("DequantizeLinear", ["w", "scale"], ["wf"], name="dq"),
            oh.make_node("MatMul", ["x", "wf"], ["y"], name="matmul"),
        ],
        "q",
        [oh.make_tensor_value_info("x", F32, [1, 8])],
        [oh.make_tensor_value_info("y", F32, [1, 16])],
        [nh.from_array(w, "w"), nh.from_array(np.array(0.05, np.float32), "scale")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    work, folding = _prepassed(model, **_budget(0))

    assert "DequantizeLinear" in [n.op_type for n in work.graph]
    assert folding.unfolded == ()


def _producer(kind: str, i: int, n: int) -> tuple[list[onnx.NodeProto], list[int]]:
    """Nodes computing ``p{i}``, a float32 constant of ``n`` elements (or n x n), from
    small constants: each op whose output size comes from its inputs' values."""

    def const(name: str, array: np.ndarray) -> onnx.NodeProto:
        return oh.make_node("Constant", [], [name], value=nh.from_array(array, name))

    out = f"p{i}"
    const_value = nh.from_array(np.array([3.0], np.float32), f"value{i}")
    if kind == "fill":
        return [
            const(f"s{i}", np.array([n, n])),
            oh.make_node("ConstantOfShape", [f"s{i}"], [out], name=out, value=const_value),
        ], [n, n]
    if kind == "expand":
        nodes = [const(f"v{i}", np.array([2.0], np.float32)), const(f"s{i}", np.array([n, n]))]
        return nodes + [oh.make_node("Expand", [f"v{i}", f"s{i}"], [out], name=out)], [n, n]
    if kind == "tile":
        nodes = [const(f"v{i}", np.ones((1, 1), np.float32)), const(f"r{i}", np.array([n, n]))]
        return nodes + [oh.make_node("Tile", [f"v{i}", f"r{i}"], [out], name=out)], [n, n]
    nodes = [
        const(f"a{i}", np.array(0.0, np.float32)),
        const(f"b{i}", np.array(float(n * n), np.float32)),
    ]
    nodes.append(const(f"d{i}", np.array(1.0, np.float32)))
    return nodes + [oh.make_node("Range", [f"a{i}", f"b{i}", f"d{i}"], [out], name=out)], [n * n]


def _producers_model(kinds: list[str], sides: list[int]) -> onnx.ModelProto:
    """Each producer's value times the graph input: none of them can fold further."""
    nodes, outputs = [], []
    for i, (kind, n) in enumerate(zip(kinds, sides, strict=True)):
        made, shape = _producer(kind, i, n)
        nodes += made + [oh.make_node("Mul", ["x", f"p{i}"], [f"y{i}"])]
        outputs.append(oh.make_tensor_value_info(f"y{i}", F32, shape))
    graph = oh.make_graph(nodes, "p", [oh.make_tensor_value_info("x", F32, [1])], outputs)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(
        st.tuples(st.sampled_from(["fill", "expand", "tile", "range"]), st.integers(1, 48)),
        min_size=1,
        max_size=10,
    ),
    budget=st.integers(0, 48 * 48 * 4 * 4),
)
def test_what_folding_adds_never_passes_the_budget(data: list, budget: int) -> None:
    """However many producers of whatever sizes: what folding adds stays within the
    budget, and when everything fits, everything folds."""
    kinds, sides = [k for k, _ in data], [n for _, n in data]
    model = _producers_model(kinds, sides)
    before = constant_bytes(ir.serde.deserialize_model(model))
    work, folding = _prepassed(model, **_budget(budget))

    added = constant_bytes(work) - before
    assert added <= budget
    assert folding.grown_bytes == added
    assert len(folding.unfolded) == sum(1 for n in work.graph if n.name.startswith("p"))
    if sum(n * n * 4 for n in sides) <= budget:
        assert folding.unfolded == ()


# --- within the budget: as before ------------------------------------------------------


def _resnet() -> onnx.ModelProto:
    return onnx.load(str(RESNET))


def _bn_behind_shape_expand() -> onnx.ModelProto:
    """The dynamo exporter's run-time bias: Expand(1, Shape(w)) folded into a constant."""
    return testing.build_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            one = Constant<value = float[1] {1.0}>()
            wshape = Shape<start = 0, end = 1>(w)
            ones = Expand(one, wshape)
            zero = ConstantOfShape<value = float[1] {0.0}>(wshape)
            c = Conv<pads = [1, 1, 1, 1]>(x, w, zero)
            y = BatchNormalization(c, ones, beta, mean, var)
        }""",
        {
            "w": np.random.default_rng(1).normal(size=(4, 3, 3, 3)),
            "beta": [0.1, -0.2, 0.3, 0.0],
            "mean": [0.0, 0.1, -0.1, 0.2],
            "var": [1.0, 0.5, 2.0, 1.5],
        },
    )


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_resnet, id="resnet50-dynamo"),
        pytest.param(_bn_behind_shape_expand, id="bn-shape-expand"),
    ],
)
def test_folding_within_the_budget_is_as_before(make) -> None:
    """The defaults against no budget at all: the same graph, the same constants, the
    same outputs bit for bit."""
    model = make()
    limited, folding = _prepassed(model)
    unlimited, _ = _prepassed(model, **UNLIMITED)

    assert folding.unfolded == ()
    assert [n.op_type for n in limited.graph] == [n.op_type for n in unlimited.graph]
    assert limited.graph.initializers.keys() == unlimited.graph.initializers.keys()
    for name, value in limited.graph.initializers.items():
        other = unlimited.graph.initializers[name].const_value.numpy()
        np.testing.assert_array_equal(value.const_value.numpy(), other)
    feed = random_inputs(model, seed=3)
    want = make_session(ir.to_proto(unlimited)).run(None, feed)
    got = make_session(ir.to_proto(limited)).run(None, feed)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=0)


# --- the report ------------------------------------------------------------------------


def test_the_report_says_what_was_left_unfolded_and_why() -> None:
    result = optimize(testing.constant_fills(20, FILL), OptimizeConfig(**_budget(5 << 20)))
    report = build_report(result, model="fills.onnx")

    schema = json.loads(schema_cli.DEFAULT_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(report)))
    folding = report["folding"]
    assert folding["unfolded_count"] == 18
    assert folding["unfolded_bytes"] == 18 * FILL_BYTES
    assert folding["reasons"] == {"fold_budget": 18, "tensor_limit": 0}
    assert [u["name"] for u in folding["unfolded"]] == [f"fill{i}" for i in range(2, 12)]
    line = (
        "18 value(s) left as the nodes that make them, 36.0 MiB never computed: 18 past the "
        "fold budget of 5.0 MiB (fold_growth_ratio, fold_growth_floor_bytes); first "
        "ConstantOfShape 'fill2', ConstantOfShape 'fill3', ConstantOfShape 'fill4'"
    )
    assert f"| constant folding | 18 | {line} |" in format_markdown(report)
    assert f"left alone: constant folding (18 nodes): {line}" in format_summary(report)
    assert str(escape(line)) in render_html(report)  # as text: its quotes escaped


def test_a_report_without_anything_left_has_no_folding_line() -> None:
    result = optimize(testing.constant_fills(2, (4, 8)), OptimizeConfig())
    report = build_report(result, model="fills.onnx")

    assert report["folding"]["unfolded_count"] == 0
    # two 4x8 fills in; the 16-byte shape and their 4-byte values out
    assert report["folding"]["grown_bytes"] == 2 * 4 * 8 * 4 - 16 - 2 * 4
    assert "constant folding" not in format_markdown(report)
