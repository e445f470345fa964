"""Helpers for testing fusions: model builders and the four-part fusion assertion.

As onnxscript ships ``rewriter/testing.py``, this module is importable by anyone who
writes a pattern or a rewriter, and by this repository's tests, so that test models and
checks are written once. Models are written in ONNX text (``build_model``) or built
(``conv_bn_relu``). Their weights are seeded and not degenerate: BatchNormalization
statistics and scales stay away from 0 and 1, because an identity-like BN hides a wrong
fold. Every model a builder makes passes the full ONNX checker, so a failing test points
at the optimizer, not at the test model.

``assert_fusion`` makes the four checks of a positive case (STYLE.md, Tests):
1. the match counts;
2. the op sequence of the fused graph;
3. the full ONNX check;
4. the same outputs as the original on onnxruntime, within the stated ``rtol`` and
   ``atol``.

``assert_no_fusion`` makes the negative case's checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnx.parser

from autofusion.fusion_core.config import CheckOptions, OptimizeConfig
from autofusion.fusion_core.pipeline import Result, optimize
from autofusion.fusion_core.validate import make_session, random_inputs

__all__ = [
    "FusedForTest",
    "GraphWriter",
    "assert_fusion",
    "assert_no_fusion",
    "bn_params",
    "build_model",
    "canonical_twice",
    "constant_fills",
    "conv_bn_relu",
    "deep_conv_net",
    "fuse_quiet",
    "misses",
    "op_sequence",
    "optimize_quiet",
    "post_norm_residual",
    "run_both",
]

_F32 = onnx.TensorProto.FLOAT


def canonical_twice(model: onnx.ModelProto):
    """``model`` after onnx's shape inference and the canonical form: (the model, the
    rules that applied with their counts, how many applied on a second run, the graph in
    onnx-ir for ``undo_unused``). A rule is idempotent when the third is 0."""
    import itertools

    import onnx_ir as ir

    from autofusion.fusion_core.canonical import canonical_form

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    work = ir.from_proto(inferred)
    counter = itertools.count()

    def fresh(hint: str) -> str:
        return f"{hint}__{next(counter)}"

    done = canonical_form(work.graph, fresh)
    again = sum(canonical_form(work.graph, fresh).values())
    return ir.to_proto(work), dict(done), again, work


def conv_bn_relu(
    *,
    in_channels: int = 3,
    out_channels: int = 4,
    height: int | str = 8,
    width: int | str = 8,
    batch: int | str = 1,
    prefix: str = "",
    doc: str = "",
    seed: int = 0,
    opset: int = 17,
) -> onnx.ModelProto:
    """``x -> Conv(3x3, pads 1) -> BatchNormalization -> Relu -> y``; nodes named
    ``{prefix}conv``, ``{prefix}bn``, ``{prefix}relu``; a str dim is symbolic."""
    rng = np.random.default_rng(seed)
    arrays = {
        "w": rng.normal(0, 0.3, (out_channels, in_channels, 3, 3)),
        "gamma": rng.uniform(0.5, 1.5, out_channels),
        "beta": rng.normal(0, 0.1, out_channels),
        "mean": rng.normal(0, 0.1, out_channels),
        "var": rng.uniform(0.5, 2.0, out_channels),
    }
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["c"], name=f"{prefix}conv", pads=[1, 1, 1, 1]),
        oh.make_node(
            "BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], name=f"{prefix}bn"
        ),
        oh.make_node("Relu", ["n"], ["y"], name=f"{prefix}relu", doc_string=doc),
    ]
    graph = oh.make_graph(
        nodes,
        "conv_bn_relu",
        [oh.make_tensor_value_info("x", _F32, [batch, in_channels, height, width])],
        [oh.make_tensor_value_info("y", _F32, [batch, out_channels, height, width])],
        [nh.from_array(a.astype(np.float32), name) for name, a in arrays.items()],
        doc_string=doc,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], doc_string=doc)
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def deep_conv_net(
    blocks: int, *, channels: int = 4, size: int = 8, seed: int = 0
) -> onnx.ModelProto:
    """A deep chain of ``blocks`` 3x3 Conv -> BatchNormalization blocks, nodes named
    ``block{i}/conv``, ``block{i}/bn``, ...: most end in a Relu (``conv_bn_relu``),
    every 7th from the 4th on in nothing (``conv_bn``), every 7th from the 6th on adds
    the block's input before its Relu (``conv_bn_add_relu``, and a ``conv_add`` near
    miss: the added input is no constant). Many fusions of a few patterns, as in a
    ResNet or a DenseNet, for the reports and pages of a large model."""
    rng = np.random.default_rng(seed)
    nodes, arrays, x = [], {}, "x"
    for i in range(blocks):
        p = f"block{i}"
        arrays[f"{p}_w"] = rng.normal(0, 0.5 / (3 * channels**0.5), (channels, channels, 3, 3))
        bn = bn_params(rng, channels, f"{p}_bn", positive=True)
        arrays |= bn
        nodes += [
            oh.make_node("Conv", [x, f"{p}_w"], [f"{p}_c"], name=f"{p}/conv", pads=[1, 1, 1, 1]),
            oh.make_node("BatchNormalization", [f"{p}_c", *bn], [f"{p}_n"], name=f"{p}/bn"),
        ]
        out = f"{p}_n"
        if i % 7 == 5:
            nodes.append(oh.make_node("Add", [out, x], [f"{p}_a"], name=f"{p}/add"))
            out = f"{p}_a"
        if i % 7 != 3:
            nodes.append(oh.make_node("Relu", [out], [f"{p}_y"], name=f"{p}/relu"))
            out = f"{p}_y"
        x = out
    nodes.append(oh.make_node("Identity", [x], ["y"], name="output"))
    shape = [1, channels, size, size]
    graph = oh.make_graph(
        nodes,
        "deep_conv_net",
        [oh.make_tensor_value_info("x", _F32, shape)],
        [oh.make_tensor_value_info("y", _F32, shape)],
        [nh.from_array(np.asarray(a, np.float32), name) for name, a in arrays.items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def constant_fills(count: int, shape: tuple[int, ...] = (1024, 2048)) -> onnx.ModelProto:
    """``y = Sum(x, fill_0, ..., fill_{count-1})``, each ``fill_i`` a float32
    ``ConstantOfShape`` of ``shape`` (value ``i + 1``, nodes named ``fill{i}``): a model of
    a few kilobytes whose folded constants are ``count`` x ``shape`` floats. With 100 of
    1024x2048, the model that made one job store 839 MB (issue 26)."""
    dims = oh.make_tensor("dims", onnx.TensorProto.INT64, [len(shape)], list(shape))
    nodes = [oh.make_node("Constant", [], ["shape"], name="shape", value=dims)]
    for i in range(count):
        value = oh.make_tensor(f"value{i}", _F32, [1], [float(i + 1)])
        nodes.append(
            oh.make_node("ConstantOfShape", ["shape"], [f"c{i}"], name=f"fill{i}", value=value)
        )
    nodes.append(oh.make_node("Sum", ["x", *(f"c{i}" for i in range(count))], ["y"], name="sum"))
    graph = oh.make_graph(
        nodes,
        "constant_fills",
        [oh.make_tensor_value_info("x", _F32, [1] * (len(shape) - 1) + [shape[-1]])],
        [oh.make_tensor_value_info("y", _F32, list(shape))],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def build_model(
    text: str, initializers: dict[str, np.ndarray] | None = None, *, only_read: bool = False
) -> onnx.ModelProto:
    """Parse ONNX text and append ``initializers`` (float arrays become float32);
    ``only_read``: those no node reads left out (one table of constants for blocks that
    each read some of them)."""
    model = onnx.parser.parse_model(text)
    read = {name for node in model.graph.node for name in node.input}
    for name, array in (initializers or {}).items():
        if only_read and name not in read:
            continue
        array = np.asarray(array)
        if np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    onnx.checker.check_model(model, full_check=True)
    return model


def post_norm_residual(hidden: int = 64, heads: int = 4, seed: int = 7) -> onnx.ModelProto:
    """A post-norm residual block whose branch comes back from a head split through a
    Reshape to ``[0, -1, hidden]`` (``view(batch, -1, hidden)``, as TorchScript writes
    it): onnxruntime's own inference leaves the -1 unknown, the pre-passes prove it
    ``batch x seq x hidden``; seeded, non-degenerate weights."""
    rng = np.random.default_rng(seed)
    text = f"""<ir_version: 8, opset_import: ["" : 17]>
    block (float[batch, seq, {hidden}] x) => (float[batch, seq, {hidden}] y) {{
        h = MatMul(x, w)
        heads = Reshape(h, split)
        turned = Transpose<perm = [0, 1, 3, 2]>(heads)
        branch = Reshape(turned, merge)
        summed = Add(x, branch)
        y = LayerNormalization<axis = -1, epsilon = 0.00001>(summed, gamma, beta)
    }}"""
    return build_model(
        text,
        {
            "w": rng.normal(0, 0.2, (hidden, hidden)),
            "split": np.array([0, 0, heads, hidden // heads], np.int64),
            "merge": np.array([0, -1, hidden], np.int64),
            "gamma": rng.uniform(0.5, 1.5, hidden),
            "beta": rng.normal(0, 0.3, hidden),
        },
    )


def bn_params(
    rng: np.random.Generator, channels: int, prefix: str = "bn", *, positive: bool = False
) -> dict[str, np.ndarray]:
    """Non-trivial BatchNormalization parameters: ``<prefix>_scale/_bias/_mean/_var``.

    The scale is far from 1 and (unless ``positive``) of mixed sign; the variance is
    strictly positive.
    """
    scale = rng.uniform(0.5, 2.0, channels)
    if not positive:
        scale *= np.where(np.arange(channels) % 2 == 0, 1.0, -1.0)
    return {
        f"{prefix}_scale": scale,
        f"{prefix}_bias": rng.standard_normal(channels),
        f"{prefix}_mean": rng.standard_normal(channels),
        f"{prefix}_var": rng.uniform(0.5, 2.0, channels),
    }


class GraphWriter:
    """Nodes and initializers of a test model under fresh names, for blocks built op by
    op (a mixture of experts, whose shape varies with every draw): ``one`` adds a node and
    gives its output, ``const`` an initializer (kept in ``arrays`` by its hint, for a
    numpy reference), ``weight`` seeded weights scaled by their fan-in, ``model`` the
    checked opset-18 model from ``hidden`` to ``out``."""

    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.rng = np.random.default_rng(seed)
        self._count = 0

    def name(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def const(self, array: Any, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(nh.from_array(np.asarray(array), name))
        self.arrays[hint] = np.asarray(array)
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64), "shape")

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> list[str]:
        names = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(oh.make_node(op_type, list(inputs), names, **attrs))
        return names

    def one(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        return self.op(op_type, *inputs, **attrs)[0]

    def weight(self, *shape: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def model(self, name: str, out: str, shape: list) -> onnx.ModelProto:
        graph = oh.make_graph(
            self.nodes,
            name,
            [oh.make_tensor_value_info("hidden", _F32, shape)],
            [oh.make_tensor_value_info(out, _F32, shape)],
            self.inits,
        )
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
        onnx.checker.check_model(model, full_check=True)
        return model


def optimize_quiet(
    model: onnx.ModelProto,
    *,
    target: str = "generic",
    patterns: list[str] | None = None,
    target_profile: str = "cpu-roofline",
    **config: Any,
) -> Result:
    """``fusion_core.optimize`` with the built-in check disabled (tests compare themselves).

    Priced on ``cpu-roofline`` (the roofline alone), so a rewriter test sees every fusion
    its pattern matches: the default profile ``cpu`` prices SkipLayerNormalization and the
    Q/K/V merge as losses, which default selection leaves out (tests/fusion_core/
    test_cost_defaults.py)."""
    return optimize(
        model,
        OptimizeConfig(
            target=target,
            patterns=patterns,
            target_profile=target_profile,
            check=CheckOptions(enabled=False),
            **config,
        ),
    )


@dataclass(frozen=True)
class FusedForTest:
    """What a generated case reads after fusing: the result, the fused proto, its op
    types in order (``ops``, without domains) and the near misses about one kind of
    block (``misses_about``), which its assertion message prints."""

    result: Result
    model: onnx.ModelProto
    ops: list[str]

    def misses_about(self, kind: str) -> list[str]:
        """``pattern: reason`` of every near miss whose pattern names ``kind``."""
        return [f"{m.pattern}: {m.reason}" for m in self.result.near_misses if kind in m.pattern]

    def ops_among(self, wanted: tuple[str, ...]) -> list[str]:
        """The fused ops of the ``wanted`` types, in graph order."""
        return [op for op in self.ops if op in wanted]

    def assert_refused(
        self,
        original: onnx.ModelProto,
        *,
        op: str,
        kind: str,
        reason: str,
        feeds: dict[str, np.ndarray] | None = None,
    ) -> None:
        """A negative generated case: nothing fused (no ``op`` in the graph), a near miss
        about ``kind`` (``misses_about``) says ``reason`` (a substring), and the model
        computes what ``original`` does bit for bit (rtol = atol = 0: nothing was
        rewritten)."""
        assert op not in self.ops and not self.result.counts, self.ops
        reasons = self.misses_about(kind)
        assert any(reason in r for r in reasons), f"{reason!r} not in {reasons}"
        run_both(original, self.model, feeds=feeds, rtol=0, atol=0)


def fuse_quiet(model: onnx.ModelProto, **config: Any) -> FusedForTest:
    """``optimize_quiet`` for the onnxruntime target unless ``config`` names another."""
    result = optimize_quiet(model, **{"target": "onnxruntime", **config})
    fused = result.to_proto()
    return FusedForTest(result, fused, [n.op_type for n in fused.graph.node])


def op_sequence(model: onnx.ModelProto) -> list[str]:
    """Op types of the graph's nodes in order, ``domain::op`` outside the ONNX domain."""
    return [
        f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph.node
    ]


def misses(result: Result, pattern: str) -> list[str]:
    """The near-miss reasons the optimizer reported for ``pattern``."""
    return [m.reason for m in result.near_misses if m.pattern == pattern]


def run_both(
    original: onnx.ModelProto,
    fused: onnx.ModelProto,
    *,
    rtol: float,
    atol: float,
    feeds: dict[str, np.ndarray] | None = None,
    seed: int = 0,
) -> None:
    """Run both models in onnxruntime (graph optimizations disabled); outputs must agree."""
    feeds = feeds if feeds is not None else random_inputs(original, seed=seed)
    reference, candidate = make_session(original), make_session(fused)
    names = [o.name for o in reference.get_outputs()]
    assert names == [o.name for o in candidate.get_outputs()], "the outputs differ"
    for name, want, got in zip(
        names, reference.run(names, feeds), candidate.run(names, feeds), strict=True
    ):
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def assert_fusion(
    model: onnx.ModelProto,
    result: Result,
    *,
    counts: dict[str, int],
    ops: list[str],
    rtol: float,
    atol: float,
) -> onnx.ModelProto:
    """The four checks of a positive case (STYLE.md, Tests): match counts, op sequence,
    full ONNX check, and the same outputs as ``model``. Returns the fused proto."""
    assert result.counts == counts, f"counts {result.counts}, expected {counts}"
    fused = result.to_proto()
    assert op_sequence(fused) == ops, f"ops {op_sequence(fused)}, expected {ops}"
    onnx.checker.check_model(fused, full_check=True)
    run_both(model, fused, rtol=rtol, atol=atol)
    return fused


def assert_no_fusion(
    model: onnx.ModelProto,
    result: Result,
    *,
    pattern: str,
    reason: str,
    ops: list[str],
    rtol: float,
    atol: float,
) -> onnx.ModelProto:
    """A negative case: ``pattern`` did not fire, a near miss of it gives ``reason``
    (a substring), and the untouched model is valid and computes the same."""
    assert pattern not in result.counts, f"{pattern} fused: {result.counts}"
    reasons = misses(result, pattern)
    assert any(reason in r for r in reasons), f"{reason!r} not in {reasons}"
    fused = result.to_proto()
    assert op_sequence(fused) == ops, f"ops {op_sequence(fused)}, expected {ops}"
    onnx.checker.check_model(fused, full_check=True)
    run_both(model, fused, rtol=rtol, atol=atol)
    return fused
