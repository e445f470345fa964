"""Pattern specs as data: what compiles, and how each invalid spec is reported.

Every invalid spec must raise ``PatternError`` whose ``errors`` name the field that is
wrong, so a pattern author (or the service's problem+json) can point at it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from autofusion import fusion_core
from autofusion.fusion_core import PatternError, compile_pattern
from autofusion.fusion_core.catalog import load_pattern_file, parse_pattern_text
from autofusion.fusion_core.patterns import PatternSpec
from autofusion.fusion_core.rewriters import Rewriter, RewriterRegistry, builtin_rewriters

CONV_BN: dict[str, Any] = {
    "name": "test.conv_bn",
    "priority": 20,
    "targets": ["generic", "onnxruntime"],
    "nodes": [
        {"id": "conv", "op": ["Conv", "ConvTranspose"]},
        {"id": "bn", "op": "BatchNormalization", "inputs": {0: "conv"}},
    ],
    "constraints": [
        {"kind": "constant", "values": ["conv.in1", "bn.in1", "bn.in2", "bn.in3", "bn.in4"]},
        {"kind": "consumers", "value": "conv.out0", "eq": 1},
    ],
    "rewriter": {
        "name": "fold_batchnorm",
        "params": {"producer_node": "conv", "batchnorm_node": "bn"},
    },
}

REQUIRED_BUILTINS = [
    "conv_bn",
    "conv_bn_relu",
    "conv_bn_add_relu",
    "dwconv_bn",
    "pool_bn",
    "conv_add",
    "conv_mul",
    "conv_activation",
    "gemm_bn",
    "gemm_activation",
    "matmul_add",
    "pad_conv",
]


def conv_bn(change: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """A fresh copy of the valid conv_bn pattern, edited by ``change``."""
    raw = copy.deepcopy(CONV_BN)
    if change is not None:
        change(raw)
    return raw


def add_constraint(constraint: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw["constraints"].append(constraint)


def add_node(node: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw["nodes"].append(node)


def set_field(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def names_field(errors: list[tuple[str, str]], path: str) -> bool:
    """True if an error sits at ``path`` or below it (``constraints.2`` covers
    ``constraints.2.attr``)."""
    return any(p == path or p.startswith(path + ".") for p, _ in errors)


# --- valid specs ---------------------------------------------------------------------


def test_valid_spec_compiles_and_binds_its_rewriter():
    compiled = compile_pattern(conv_bn())

    assert compiled.name == "test.conv_bn"
    assert compiled.rewriter.name == "fold_batchnorm"
    assert compiled.params.producer_node == "conv"
    assert compiled.params.batchnorm_node == "bn"
    assert [n.id for n in compiled.spec.nodes] == ["conv", "bn"]
    assert compiled.spec.node("conv").op == ("Conv", "ConvTranspose")


def test_a_validated_pattern_spec_compiles_too():
    spec = PatternSpec.model_validate(conv_bn())

    assert compile_pattern(spec).spec is spec


def test_horizontal_spec_with_free_input_compiles():
    raw = {
        "name": "qkv",
        "nodes": [{"id": k, "op": "MatMul", "inputs": {0: "$x"}} for k in ("q", "k", "v")],
        "constraints": [{"kind": "static_shape", "values": ["$x"]}],
        "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
    }

    compiled = compile_pattern(raw)

    assert compiled.spec.free_inputs() == {"x"}


# --- invalid specs -------------------------------------------------------------------

INVALID_SPECS = [
    pytest.param(
        set_field("nodes", 0, "op", value="Convv"),
        "nodes.0.op",
        "Convv",
        id="unknown-op-type",
    ),
    pytest.param(
        add_constraint({"kind": "bogus", "value": "conv.in1"}),
        "constraints.2",
        "bogus",
        id="unknown-constraint-kind",
    ),
    pytest.param(
        set_field("rewriter", "name", value="fold_everything"),
        "rewriter.name",
        "fold_everything",
        id="unknown-rewriter",
    ),
    pytest.param(
        set_field("rewriter", "params", "producer_node", value="gemm"),
        "rewriter.params.producer_node",
        "gemm",
        id="rewriter-param-names-missing-node",
    ),
    pytest.param(
        set_field("rewriter", "params", "epsilon", value=1e-5),
        "rewriter.params.epsilon",
        "extra",
        id="unknown-rewriter-param",
    ),
    pytest.param(
        add_constraint({"kind": "constant", "values": ["relu.in0"]}),
        "constraints.2",
        "relu",
        id="constraint-names-unknown-node",
    ),
    pytest.param(
        add_constraint({"kind": "attr", "node": "relu", "name": "alpha", "eq": 1}),
        "constraints.2",
        "relu",
        id="attr-constraint-names-unknown-node",
    ),
    pytest.param(
        add_constraint({"kind": "constant", "values": ["bn.input1"]}),
        "constraints.2",
        "bn.input1",
        id="malformed-reference",
    ),
    pytest.param(
        add_constraint({"kind": "constant", "values": ["$y"]}),
        "constraints.2",
        "$y",
        id="reference-to-unknown-free-input",
    ),
    pytest.param(
        add_node({"id": "conv", "op": "Relu", "inputs": {0: "bn"}}),
        "nodes",
        "duplicate",
        id="duplicate-node-ids",
    ),
    pytest.param(
        set_field("nodes", 0, "inputs", value={0: "bn"}),
        "nodes",
        "cycle",
        id="cycle",
    ),
    pytest.param(
        add_node({"id": "relu", "op": "Relu"}),
        "nodes",
        "relu",
        id="disconnected-node",
    ),
    pytest.param(
        set_field("nodes", 1, "inputs", value={0: "relu"}),
        "nodes.1.inputs.0",
        "relu",
        id="edge-from-unknown-node",
    ),
    pytest.param(
        set_field("nodes", 1, "inputs", value={0: "conv.in0"}),
        "nodes.1.inputs",
        "conv.in0",
        id="malformed-edge",
    ),
    pytest.param(
        set_field("targets", value=["tensorrt"]),
        "targets.0",
        "generic",
        id="unknown-target",
    ),
    pytest.param(
        set_field("name", value="bad name!"),
        "name",
        "bad name!",
        id="invalid-pattern-name",
    ),
    pytest.param(
        add_constraint({"kind": "attr", "node": "conv", "name": "group"}),
        "constraints.2",
        "comparison",
        id="attr-without-comparison",
    ),
    pytest.param(
        add_constraint({"kind": "dtype", "values": ["conv.out0"], "in": ["FLOAT99"]}),
        "constraints.2",
        "FLOAT99",
        id="dtype-unknown-name",
    ),
    pytest.param(
        set_field("nodes", value=[]),
        "nodes",
        "at least 1",
        id="no-nodes",
    ),
    pytest.param(
        add_constraint(
            {"kind": "formula", "value": "bn.in1", "equals": "__import__('os').getcwd()"}
        ),
        "constraints.2",
        "is not allowed",
        id="formula-calls-python",
    ),
    pytest.param(
        add_constraint({"kind": "formula", "value": "bn.in1", "equals": "conv.in1 + 1"}),
        "constraints.2",
        "is not allowed",
        id="formula-bare-name",
    ),
    pytest.param(
        add_constraint({"kind": "formula", "value": "bn.in1", "equals": "dim(relu.out0, 0)"}),
        "constraints.2",
        "relu",
        id="formula-names-unknown-node",
    ),
    pytest.param(
        add_constraint({"kind": "formula", "value": "bn.in1", "equals": "sqrt(dim(conv.in1,"}),
        "constraints.2",
        "is not a formula",
        id="formula-syntax",
    ),
    pytest.param(
        add_constraint({"kind": "opset", "domain": ""}),
        "constraints.2",
        "comparison",
        id="opset-without-comparison",
    ),
    pytest.param(
        set_field(
            "rewriter", value={"name": "fused_region", "params": {"domain": "com.microsoft"}}
        ),
        "rewriter.params.domain",
        "reserved",
        id="fused-region-reserved-domain",
    ),
    pytest.param(
        set_field("exposes", value=["relu.out0"]),
        "exposes",
        "is not an output of a node of this pattern",
        id="exposes-unknown-node",
    ),
    pytest.param(
        set_field("exposes", value=["conv.in0"]),
        "exposes",
        "is not an output of a node of this pattern",
        id="exposes-an-input",
    ),
]


@pytest.mark.parametrize(("change", "path", "text"), INVALID_SPECS)
def test_invalid_spec_names_the_field(change, path, text):
    raw = conv_bn(change)

    with pytest.raises(PatternError) as info:
        compile_pattern(raw)

    errors = info.value.errors
    assert names_field(errors, path), f"no error at {path!r}: {errors}"
    messages = " ".join(msg for p, msg in errors if p == path or p.startswith(path + "."))
    assert text.lower() in messages.lower(), errors


def test_pattern_error_message_names_pattern_and_field():
    with pytest.raises(PatternError) as info:
        compile_pattern(conv_bn(set_field("nodes", 0, "op", value="Convv")))

    message = str(info.value)
    assert "test.conv_bn" in message
    assert "nodes.0.op" in message
    assert info.value.code == "invalid-pattern"


class _OnnxruntimeOnly(Rewriter):
    name = "ort_only"
    targets: ClassVar[frozenset[str]] = frozenset({"onnxruntime"})

    def rewrite(self, match, params, ctx):
        return "never used"


def test_target_the_rewriter_cannot_emit_for_is_rejected():
    registry = builtin_rewriters()
    registry.register(_OnnxruntimeOnly())
    raw = conv_bn(set_field("rewriter", value={"name": "ort_only"}))
    raw["targets"] = ["generic", "onnxruntime"]

    with pytest.raises(PatternError) as info:
        compile_pattern(raw, registry)

    assert names_field(info.value.errors, "targets")
    assert "generic" in str(info.value)


def test_target_the_rewriter_emits_for_compiles():
    registry = RewriterRegistry([_OnnxruntimeOnly()])
    raw = conv_bn(set_field("rewriter", value={"name": "ort_only"}))
    raw["targets"] = ["onnxruntime"]

    assert compile_pattern(raw, registry).rewriter.name == "ort_only"


def test_rewriter_missing_from_a_custom_registry_is_unknown():
    with pytest.raises(PatternError) as info:
        compile_pattern(conv_bn(), RewriterRegistry([_OnnxruntimeOnly()]))

    assert names_field(info.value.errors, "rewriter.name")


# --- pattern text and files ----------------------------------------------------------

TWO_PATTERNS_YAML = """\
- name: first
  nodes:
    - {id: conv, op: Conv}
    - {id: act, op: Relu, inputs: {0: conv}}
  rewriter: {name: fused_region, params: {domain: ai.test}}
- name: second
  nodes:
    - {id: mm, op: MatMul}
    - {id: add, op: Add, inputs: {0: mm}}
  rewriter: {name: matmul_add_to_gemm}
"""

WRAPPED_YAML = "patterns:\n" + "".join(
    "  " + line + "\n" for line in TWO_PATTERNS_YAML.splitlines()
)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(TWO_PATTERNS_YAML, id="yaml-list"),
        pytest.param(WRAPPED_YAML, id="yaml-patterns-key"),
    ],
)
def test_parse_pattern_text_returns_each_pattern(text):
    raws = parse_pattern_text(text)

    assert [raw["name"] for raw in raws] == ["first", "second"]


def test_parse_pattern_text_accepts_one_mapping_and_json():
    single = parse_pattern_text("name: only\nnodes: [{id: a, op: Relu}]\nrewriter: {name: x}\n")
    as_json = parse_pattern_text('[{"name": "j", "nodes": [], "rewriter": {"name": "x"}}]')

    assert [raw["name"] for raw in single] == ["only"]
    assert [raw["name"] for raw in as_json] == ["j"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("- name: a\n  nodes: [unclosed\n", "not valid YAML", id="invalid-yaml"),
        pytest.param("42\n", "holds no pattern", id="scalar"),
        pytest.param("- just a string\n", "holds no pattern", id="list-of-strings"),
        pytest.param("", "holds no pattern", id="empty"),
    ],
)
def test_parse_pattern_text_rejects_text_without_patterns(text, words):
    with pytest.raises(PatternError, match=words):
        parse_pattern_text(text, origin="extra.yaml")


def test_load_pattern_file_compiles_every_pattern(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text(WRAPPED_YAML, encoding="utf-8")

    compiled = load_pattern_file(path)

    assert [p.name for p in compiled] == ["first", "second"]
    assert [p.rewriter.name for p in compiled] == ["fused_region", "matmul_add_to_gemm"]


def test_load_pattern_file_reports_invalid_pattern_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(TWO_PATTERNS_YAML.replace("op: MatMul", "op: MatMull"), encoding="utf-8")

    with pytest.raises(PatternError) as info:
        load_pattern_file(path)

    assert names_field(info.value.errors, "nodes.0.op")
    assert "second" in str(info.value)


def test_load_pattern_file_rejects_invalid_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("patterns: [{name: a, nodes: [\n", encoding="utf-8")

    with pytest.raises(PatternError, match="not valid YAML"):
        load_pattern_file(path)


def test_load_pattern_file_rejects_missing_file(tmp_path):
    path = tmp_path / "nowhere.yaml"

    with pytest.raises(PatternError, match="nowhere.yaml"):
        load_pattern_file(path)


def test_load_pattern_file_rejects_binary_file(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81 not utf-8")

    with pytest.raises(PatternError, match="UTF-8"):
        load_pattern_file(path)


# --- built-in patterns ---------------------------------------------------------------


def test_every_builtin_pattern_compiles():
    patterns = fusion_core.builtin_patterns()

    assert len(patterns) >= len(REQUIRED_BUILTINS)
    assert all(p.rewriter.name == p.spec.rewriter.name for p in patterns)


def test_builtin_pattern_names_are_unique():
    names = [p.name for p in fusion_core.builtin_patterns()]

    assert len(names) == len(set(names)), sorted(names)


@pytest.mark.parametrize("name", REQUIRED_BUILTINS)
def test_builtin_pattern_exists(name):
    assert name in {p.name for p in fusion_core.builtin_patterns()}
