"""Per-region validation: a deliberately broken rewriter is named, the others pass.

The model has Conv+BN+Relu, Conv+BN and a MatMul+Add; the broken rewriter folds the
second BN (fold_batchnorm; the first goes through fuse_activation) with epsilon 1.0
instead of the model's 1e-5 (the kind of slip onnx/optimizer's
fuse_bn_into_conv once shipped). Tolerance: rtol 1e-3, atol 1e-4.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize
from autofusion.fusion_core.pipeline.progressive import optimize_progressive
from autofusion.fusion_core.rewriters import Rewrite, builtin_rewriters
from autofusion.fusion_core.rewriters.fold_batchnorm import FoldBatchNorm
from autofusion.fusion_core.rewriters.matmul_add_to_gemm import MatMulAddToGemm
from autofusion.fusion_core.validate import random_inputs
from autofusion.fusion_core.validate._ranges import FP16_MAX, check_fp16
from autofusion.fusion_core.validate._regions import compare_regions

RTOL, ATOL = 1e-3, 1e-4


class WrongEpsilonFoldBatchNorm(FoldBatchNorm):
    """fold_batchnorm with epsilon 1.0 in place of the model's, for one BN only."""

    def rewrite(self, match, params, ctx):  # type: ignore[override]
        bn = match.node(params.batchnorm_node)
        if bn.name == "bn_b":
            bn.attributes["epsilon"] = onnx_ir_attr_float("epsilon", 1.0)
        return super().rewrite(match, params, ctx)


def onnx_ir_attr_float(name: str, value: float):
    import onnx_ir as ir

    return ir.AttrFloat32(name, value)


def conv_model() -> onnx.ModelProto:
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 8, 8] x, float[4, 6] m) => (float[1, 4, 8, 8] y, float[4, 5] z) {
        a = Conv <pads = [1, 1, 1, 1]> (x, wa)
        na = BatchNormalization <epsilon = 0.00001> (a, ga, ba, ma, va)
        ra = Relu (na)
        b = Conv <pads = [1, 1, 1, 1]> (ra, wb)
        y = BatchNormalization <epsilon = 0.00001> (b, gb, bb, mb, vb)
        p = MatMul (m, wm)
        z = Add (p, bm)
    }"""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    arrays = {
        "wa": rng.normal(0, 0.3, (4, 3, 3, 3)),
        "wb": rng.normal(0, 0.3, (4, 4, 3, 3)),
        "wm": rng.normal(0, 0.3, (6, 5)),
        "bm": rng.normal(0, 0.3, 5),
    }
    for k in "ab":
        arrays |= {
            f"g{k}": rng.uniform(0.5, 1.5, 4),
            f"b{k}": rng.normal(0, 0.1, 4),
            f"m{k}": rng.normal(0, 0.1, 4),
            # small variances: epsilon 1.0 instead of 1e-5 changes the scale a lot
            f"v{k}": rng.uniform(0.01, 0.05, 4),
        }
    model.graph.initializer.extend(
        nh.from_array(v.astype(np.float32), name) for name, v in arrays.items()
    )
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            node.name = "bn_a" if node.input[0] == "a" else "bn_b"
    return model


def _optimize(model: onnx.ModelProto, registry=None):
    # strict: the failed check itself, which names the region (no fallback)
    config = OptimizeConfig(target="generic", check=CheckOptions(rtol=RTOL, atol=ATOL), strict=True)
    return optimize(model, config, registry=registry)


def _feeds(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    return [random_inputs(model, seed=k) for k in range(2)]


def test_correct_fusions_pass_region_by_region() -> None:
    model = conv_model()
    result = _optimize(model)
    assert result.counts == {"conv_bn_relu": 1, "conv_bn": 1, "matmul_add": 1}
    report = compare_regions(model, result.to_proto(), _feeds(model), rtol=RTOL, atol=ATOL)
    assert report.error is None
    assert [r.pattern for r in report.regions] == ["conv_bn_relu", "conv_bn", "matmul_add"]
    assert all(r.passed and r.tensors for r in report.regions)
    assert report.first_drift is None


def test_broken_rewriter_is_named_as_the_first_drifting_region() -> None:
    model = conv_model()
    registry = builtin_rewriters()
    registry.register(WrongEpsilonFoldBatchNorm())
    result = _optimize(model, registry)
    assert result.check is not None and not result.check.passed
    report = compare_regions(model, result.to_proto(), _feeds(model), rtol=RTOL, atol=ATOL)
    first = report.first_drift
    assert first is not None
    assert first.pattern == "conv_bn" and "bn_b" in first.replaced_nodes
    assert first.max_abs_diff > 100 * ATOL
    passed = {r.pattern: r.passed for r in report.regions if "bn_b" not in r.replaced_nodes}
    assert passed == {"conv_bn_relu": True, "matmul_add": True}
    assert report.to_dict()["first_drift"]["replaced_nodes"] == first.replaced_nodes


def test_progressive_mode_rolls_back_exactly_the_broken_fusion() -> None:
    model = conv_model()
    registry = builtin_rewriters()
    registry.register(WrongEpsilonFoldBatchNorm())
    config = OptimizeConfig(target="generic", check=CheckOptions(rtol=RTOL, atol=ATOL))
    result = optimize_progressive(model, config, registry=registry)

    assert [(r["pattern"], r["stage"]) for r in result.rollbacks] == [("conv_bn", 1)]
    (rollback,) = result.rollbacks
    assert "bn_b" in rollback["nodes"] and "exceeds atol" in rollback["error"]
    # bn_a folds in the first stage (conv_bn), the MatMul+Add in the second: both kept
    assert result.counts == {"conv_bn": 1, "matmul_add": 1}
    ops = [n.op_type for n in result.model.graph]
    assert ops.count("BatchNormalization") == 1  # bn_b stays unfused
    assert result.check is not None and result.check.passed
    rolled = [m for m in result.near_misses if m.pattern == "conv_bn" and m.kind == "rollback"]
    assert rolled and all(m.reason.startswith("rolled back by progressive") for m in rolled)


def test_progressive_mode_keeps_everything_when_nothing_breaks() -> None:
    model = conv_model()
    config = OptimizeConfig(target="generic", check=CheckOptions(rtol=RTOL, atol=ATOL))
    result = optimize_progressive(model, config)
    assert result.rollbacks == []
    # stage 1 folds both BNs (conv_bn) where one pass takes Conv+BN+Relu at once: on the
    # generic target both end in the same graph
    assert result.counts == {"conv_bn": 2, "matmul_add": 1}
    plain = _optimize(model).model
    assert [n.op_type for n in result.model.graph] == [n.op_type for n in plain.graph]
    assert result.check is not None and result.check.passed


class IntegerGemm(MatMulAddToGemm):
    """matmul_add_to_gemm that casts its result to int32: changes the output's type."""

    def rewrite(self, match, params, ctx):  # type: ignore[override]
        import onnx_ir as ir

        rewrite = super().rewrite(match, params, ctx)
        old, new = rewrite.replaced[0]
        cast = ir.Node("", "Cast", [new], [ir.AttrInt64("to", ir.DataType.INT32)])
        cast.outputs[0].dtype = ir.DataType.INT32
        cast.outputs[0].shape = old.shape
        return Rewrite([*rewrite.new_nodes, cast], [(old, cast.outputs[0])])


def test_a_rewrite_that_changes_an_output_type_is_taken_back_before_the_check() -> None:
    """The rewrite declares the old output's type on an int32 Cast: the type inference of
    its new nodes (fusion_core/pipeline/transaction.py) sees it and takes it back, so the
    rest of the model fuses and passes (it once reached onnx's checker at the end)."""
    model = conv_model()
    registry = builtin_rewriters()
    registry.register(IntegerGemm())
    result = _optimize(model, registry)
    [rejected] = result.rejected
    assert rejected.name == "matmul_add" and "infers as INT32" in rejected.failed, rejected
    assert result.structure == [] and "matmul_add" not in result.counts
    assert result.check is not None and result.check.passed


def test_structure_problems_name_a_dangling_read_and_a_changed_output() -> None:
    import onnx_ir as ir

    from autofusion.fusion_core.validate._structure import output_signature, structure_problems

    work = ir.serde.deserialize_model(conv_model())
    before = output_signature(work)
    assert structure_problems(work, before) == []
    relu = next(n for n in work.graph if n.op_type == "Relu")
    work.graph.remove(relu, safe=False)  # the second Conv still reads its output
    work.graph.outputs[1].dtype = ir.DataType.INT32
    problems = structure_problems(work, before)
    assert "output 'z' changed type from FLOAT to INT32" in problems
    assert any("reads 'ra' from a removed node Relu" in p for p in problems), problems


# ---------------------------------------------------------------------------------------
# fp16 range analysis


def overflow_model() -> onnx.ModelProto:
    """MatMul + Add whose sum reaches ~1e5 (fused into a Gemm), then a written-out layer
    norm (LayerNormalization, keep_fp32) over values just as large."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 8] x) => (float[4, 8] y) {
        p = MatMul (x, w)
        s = Add (p, b)
        mean = ReduceMean <axes = [-1]> (s)
        d = Sub (s, mean)
        sq = Pow (d, two)
        var = ReduceMean <axes = [-1]> (sq)
        ve = Add (var, eps)
        sd = Sqrt (ve)
        y = Div (d, sd)
    }"""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(
        [
            nh.from_array(rng.normal(0, 3e4, (8, 8)).astype(np.float32), "w"),
            nh.from_array(np.full(8, 1e4, np.float32), "b"),
            nh.from_array(np.array(2.0, np.float32), "two"),
            nh.from_array(np.array(1e-5, np.float32), "eps"),
        ]
    )
    return model


def test_fp16_flags_the_overflowing_region_and_keeps_normalizations_in_fp32() -> None:
    model = overflow_model()
    result = _optimize(model)
    assert result.counts == {"matmul_add": 1, "layer_norm": 1}
    fused = result.to_proto()
    keep = {"layer_norm"}
    report = check_fp16(model, fused, _feeds(model), keep_fp32=keep)
    assert report.error is None
    # the product p (removed by the fusion) and the sum s (its output) both overflow
    assert {(f.pattern, f.tensor, f.problem) for f in report.flags} == {
        ("matmul_add", "p", "overflow"),
        ("matmul_add", "s", "overflow"),
    }
    assert all(f.max_abs > FP16_MAX for f in report.flags)
    flag = report.flags[0]
    norm = [n.name for n in fused.graph.node if n.op_type == "LayerNormalization"]
    assert report.kept_fp32 == norm
    assert report.fp32_nodes == sorted(set(norm) | set(flag.fused_nodes))
    # Without keep_fp32 the layer norm region is flagged too: its squares overflow.
    bare = check_fp16(model, fused, _feeds(model), keep_fp32=set())
    assert {f.pattern for f in bare.flags} == {"matmul_add", "layer_norm"}


def test_fp16_has_nothing_to_flag_in_a_well_scaled_model() -> None:
    model = conv_model()
    result = _optimize(model)
    report = check_fp16(model, result.to_proto(), _feeds(model), keep_fp32=set())
    assert report.flags == [] and report.error is None


# ---------------------------------------------------------------------------------------
# The same, switched on through OptimizeConfig (what the CLI and the service send)


def test_config_precision_fp16_fills_the_result() -> None:
    result = optimize(overflow_model(), OptimizeConfig(precision="fp16"))
    assert result.precision is not None
    assert {f.tensor for f in result.precision.flags} == {"p", "s"}
    assert result.precision.kept_fp32  # the LayerNormalization


def test_config_progressive_rolls_back_through_optimize() -> None:
    registry = builtin_rewriters()
    registry.register(WrongEpsilonFoldBatchNorm())
    config = OptimizeConfig(progressive=True, check=CheckOptions(rtol=RTOL, atol=ATOL))
    result = optimize(conv_model(), config, registry=registry)
    assert [r["pattern"] for r in result.rollbacks] == ["conv_bn"]
    assert result.check is not None and result.check.passed


def test_config_shape_profiles_are_all_checked() -> None:
    path = "tests/data/transformers/bert_eager_dynamo.onnx"
    profiles = [{"batch": 1, "sequence": 5}, {"batch": 3, "sequence": 11}]
    check = CheckOptions(profiles=profiles, samples=1, rtol=0, atol=1e-4)
    result = optimize(path, OptimizeConfig(target="onnxruntime", check=check))
    assert result.check is not None and result.check.passed
    checked = [p.dims for p in result.check.profiles]
    assert [{k: d[k] for k in ("batch", "sequence")} for d in checked] == profiles


def test_fp16_underflow_needs_a_real_share_of_tiny_values() -> None:
    """A few values below 2^-14 are everywhere; a region made of them is flagged."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[64, 8] x) => (float[64, 4] y) {
        p = MatMul (x, w)
        y = Add (p, b)
    }"""
    for scale, flagged in ((1e-7, True), (1.0, False)):
        model = onnx.parser.parse_model(text)
        rng = np.random.default_rng(0)
        model.graph.initializer.extend(
            [
                nh.from_array((rng.normal(0, 1, (8, 4)) * scale).astype(np.float32), "w"),
                nh.from_array(np.zeros(4, np.float32), "b"),
            ]
        )
        result = _optimize(model)
        report = check_fp16(model, result.to_proto(), _feeds(model), keep_fp32=set())
        problems = {f.problem for f in report.flags}
        assert problems == ({"underflow"} if flagged else set()), report.flags
        if flagged:
            assert all(f.subnormal_fraction > 0.5 for f in report.flags)
