"""fusion_core.provenance: the keys a fusion writes on its nodes, read back by validation,
profiling and the report through the same module."""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core import OptimizeConfig, optimize, provenance, testing
from autofusion.fusion_core.profiling import NodeProfile, NodeTime, region_times
from autofusion.fusion_core.report import build_report
from autofusion.fusion_core.validate import fused_regions


def test_the_key_strings_are_a_file_format_and_do_not_change() -> None:
    # Fused models already written carry these: a renamed key would orphan them.
    assert provenance.KEYS == (
        "autofusion.pattern",
        "autofusion.replaced_nodes",
        "autofusion.replaced_values",
    )


def test_written_on_an_ir_node_and_read_from_the_serialized_proto() -> None:
    node = ir.Node("", "Relu", [ir.Value(name="x")], name="fused")
    provenance.write(node.metadata_props, "p", ["a", "b"], ["t"])
    proto = ir.serde.serialize_node(node)
    for props in (provenance.metadata(node), provenance.metadata(proto)):
        assert provenance.pattern(props) == "p"
        assert provenance.replaced_nodes(props) == ["a", "b"]
        assert provenance.replaced_values(props) == ["t"]


def test_a_node_no_fusion_made_has_no_provenance() -> None:
    props = provenance.metadata(ir.Node("", "Relu", [ir.Value(name="x")]))
    assert provenance.pattern(props) is None and provenance.replaced_nodes(props) is None
    assert provenance.replaced_values(props) == []


def test_the_keys_a_fusion_writes_are_what_the_report_reads() -> None:
    config = OptimizeConfig(target="onnxruntime", check={"enabled": False})
    result = optimize(testing.conv_bn_relu(), config)
    fused = result.to_proto()
    (node,) = fused.graph.node
    props = provenance.metadata(node)
    assert {k for k in props if k.startswith("autofusion.")} == set(provenance.KEYS)
    pattern, replaced = provenance.pattern(props), provenance.replaced_nodes(props)
    assert (pattern, replaced) == ("conv_bn_relu", ["conv", "bn", "relu"])
    assert provenance.replaced_values(props) == ["c", "n"]  # the Conv's and BN's outputs

    # validation maps the fused node back to the original nodes through the same keys
    assert fused_regions(fused) == [(pattern, replaced, [node])]
    # so does profiling, and its regions give the report's measured gain
    before = NodeProfile("ORT_DISABLE_ALL", 1, [NodeTime(n, "Conv", 1, 10.0) for n in replaced])
    after = NodeProfile("ORT_DISABLE_ALL", 1, [NodeTime(node.name, "FusedConv", 1, 12.0)])
    regions = [r.to_dict() for r in region_times(fused, before, after)]
    report = build_report(result, config=config, profile={"regions": regions})
    (fusion,) = report["applied"]
    assert fusion["pattern"] == pattern
    assert fusion["provenance"]["original_nodes"] == replaced
    assert fusion["measured_gain"]["before_us"] == 30.0
    assert fusion["measured_gain"]["after_us"] == 12.0
