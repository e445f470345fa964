"""The written model declares what its target profile says (fusion_core/pipeline/written.py).

The block (``testing.post_norm_residual``) is a post-norm residual whose second branch comes
back from a head split through a Reshape to ``[0, -1, 64]`` (``view(batch, -1, hidden)``):
onnxruntime's own inference leaves the -1 unknown, ours proves it. Declared, it lets
onnxruntime's CPU provider form its slower SkipLayerNormalization at ORT_ENABLE_ALL; left
out, the runtime sees what the exporter's file showed it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.report import build_report, format_summary, render_html
from autofusion.fusion_core.testing import build_model, post_norm_residual


def _intermediates(model: onnx.ModelProto) -> set[str]:
    return {info.name for info in model.graph.value_info}


def _fused(**config) -> tuple[onnx.ModelProto, list[str], bool]:
    result = optimize(post_norm_residual(), OptimizeConfig(target="onnxruntime", **config))
    return result.to_proto(), result.prepasses, result.check.passed


def test_cpu_profile_writes_no_intermediate_shapes_and_keeps_the_interface():
    written, prepasses, passed = _fused()  # the default profile: cpu
    assert passed
    assert _intermediates(written) == set()
    assert [i.type.tensor_type.shape.dim[1].dim_param for i in written.graph.input] == ["seq"]
    assert [o.type.tensor_type.elem_type for o in written.graph.output] == [onnx.TensorProto.FLOAT]
    assert [line for line in prepasses if line.startswith("written form:")] == [
        "written form: the types and shapes of 5 intermediate values and 5 weights left out "
        "(value_info: none, from profile 'cpu'); the runtime infers them as it loads the model"
    ]


def test_the_run_or_the_gpu_profile_keeps_every_inferred_shape():
    for config in ({"value_info": "all"}, {"target_profile": "gpu"}):
        written, prepasses, passed = _fused(**config)
        assert passed
        declared = {i.name: i for i in written.graph.value_info}
        assert {"h", "branch", "turned"} <= set(declared)
        dims = [d.dim_param or d.dim_value for d in declared["branch"].type.tensor_type.shape.dim]
        assert dims == ["batch", "seq", 64]
        assert not [line for line in prepasses if line.startswith("written form:")]


def _runtime_ops(model: onnx.ModelProto, folder: Path) -> set[str]:
    path, optimized = folder / "in.onnx", folder / "out.onnx"
    onnx.save(model, path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return {node.op_type for node in onnx.load(optimized).graph.node}


def test_onnxruntime_forms_skip_layer_norm_only_from_declared_shapes(tmp_path):
    none, _, _ = _fused()
    declared, _, _ = _fused(value_info="all")
    assert "SkipLayerNormalization" not in _runtime_ops(none, tmp_path)
    assert "SkipLayerNormalization" in _runtime_ops(declared, tmp_path)


def test_both_forms_compute_the_same():
    feeds = {"x": np.random.default_rng(8).normal(0, 1, (2, 5, 64)).astype(np.float32)}
    outputs = []
    for form in ("none", "all"):
        written, _, _ = _fused(value_info=form)
        session = ort.InferenceSession(
            written.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        outputs.append(session.run(None, feeds)[0])
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)


_BRANCHED = """
<ir_version: 8, opset_import: ["" : 17]>
branched (float[n, 8] x, bool flag) => (float[n, 8] y) {
    y = If(flag) <then_branch = g1 () => (float[n, 8] t) {
        a = Mul(x, x)
        t = Add(a, x)
    }, else_branch = g2 () => (float[n, 8] e) {
        b = Sub(x, x)
        e = Relu(b)
    }>
}
"""


def test_subgraph_intermediates_follow_the_profile_too():
    result = optimize(build_model(_BRANCHED), OptimizeConfig(target="onnxruntime"))
    assert result.check.passed
    branches = [a.g for node in result.to_proto().graph.node for a in node.attribute]
    assert len(branches) == 2
    assert [list(g.value_info) for g in branches] == [[], []]
    assert [len(g.output) for g in branches] == [1, 1]  # a branch's output stays declared


def test_a_profile_with_an_unknown_value_info_is_refused(tmp_path):
    profile = tmp_path / "mine.yaml"
    text = Path(__file__).parents[2] / "fusion_core" / "target_profiles" / "cpu.yaml"
    profile.write_text(text.read_text().replace("value_info: none", "value_info: some"))
    with pytest.raises(ConfigError, match="value_info"):
        optimize(
            post_norm_residual(), OptimizeConfig(target="onnxruntime", target_profile=str(profile))
        )


# onnx's inference reads ONNX Attention's 3-D output as [?, ?, 0] when its inputs' last
# dim is unknown to it (here: a Reshape to sizes read from another input), and the branch
# that passes the output on contradicts that; declared, the file is sound.
_MISREAD = """
<ir_version: 10, opset_import: ["" : 23]>
misread (float[batch, seq, 64] x, int64[batch, seq] mask, bool flag) => (float[batch, seq, 64] y)
<float[batch, seq, 192] qkv, float[batch, seq, 64] q, float[batch, seq, 64] k,
 float[batch, seq, 64] v, float[batch, seq, 64] att> {
    flat = Reshape(x, rows)
    projected = MatMul(flat, w)
    lead = Shape<start = 0, end = 1>(mask)
    length = Shape<start = 1, end = 2>(mask)
    target = Concat<axis = 0>(lead, length, width)
    qkv = Reshape(projected, target)
    q, k, v = Split<axis = 2, num_outputs = 3>(qkv)
    att = Attention<q_num_heads = 4, kv_num_heads = 4>(q, k, v)
    y = If(flag) <then_branch = g1 () => (float[batch, seq, 64] t) {
        t = Identity(att)
    }, else_branch = g2 () => (float[batch, seq, 64] e) {
        e = Relu(att)
    }>
}
"""


def test_a_value_onnx_would_read_wrong_keeps_its_declaration():
    model = build_model(  # checked: declared, the file is sound
        _MISREAD,
        {
            "rows": np.array([-1, 64], np.int64),
            "w": np.random.default_rng(5).normal(0, 0.2, (64, 192)),
            "width": np.array([192], np.int64),
        },
    )
    result = optimize(model, OptimizeConfig(target="generic"))
    assert result.fallback is None, result.fallback  # the written form broke nothing
    assert result.check.passed, result.check
    written = result.to_proto()
    onnx.checker.check_model(written, full_check=True)
    assert {"att", "q", "k", "v"} <= _intermediates(written)
    [line] = [p for p in result.prepasses if p.startswith("written form:")]
    assert "which onnx's inference gets wrong without: " in line and "att" in line


def test_the_report_page_and_the_summary_say_what_was_left_out():
    config = OptimizeConfig(target="onnxruntime")
    report = build_report(optimize(post_norm_residual(), config), config=config)
    page = render_html(report)
    said = "the types and shapes of 5 intermediate values and 5 weights left out"
    assert re.search(rf'<td id="written-form">{said} \(value_info: none', page)
    assert f"  written form: {said}" in format_summary(report)
    kept = OptimizeConfig(target="onnxruntime", value_info="all")
    report = build_report(optimize(post_norm_residual(), kept), config=kept)
    assert 'id="written-form"' not in render_html(report)
    assert "written form:" not in format_summary(report)
