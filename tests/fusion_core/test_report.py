"""The JSON report (the contract): its keys, provenance, gains, its published JSON Schema,
and the Markdown summary. Reports come from real ``optimize`` runs."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import onnx.parser
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize, save_model, testing
from autofusion.fusion_core.report import (
    REPORT_VERSION,
    build_report,
    format_markdown,
    format_summary,
    report_schema,
)
from autofusion.fusion_core.report import schema as schema_cli

REPO = Path(__file__).resolve().parents[2]
BERT = REPO / "tests" / "data" / "transformers" / "bert_eager_torchscript.onnx"
V1_KEYS = {
    "report_version", "tool", "model", "output", "target", "patterns_used", "prepasses",
    "rounds", "fusions", "applied", "near_misses", "nodes", "timings_s", "check",
}  # fmt: skip
PROFILE = {
    "options": {"iters": 3},
    "latency": [
        {
            "level": "ORT_ENABLE_ALL",
            "ratio": 0.8,
            "sessions": [
                {"label": "original", "median_ms": 1.0, "p90_ms": 1.4, "create_ms": 3.0},
                {"label": "fused", "median_ms": 0.8, "p90_ms": 1.1, "create_ms": 2.0},
            ],
        }
    ],
    "nodes": {
        "original": {"runs": 2, "op_types": [{"op_type": "Conv", "total_us": 40.0}]},
        "fused": {"runs": 2, "op_types": [{"op_type": "FusedConv", "total_us": 20.0}]},
    },
    "regions": [],  # filled per test with the fused node's name
    "patterns": [{"pattern": "conv_bn_relu", "ratio": 0.5}],
}


def conv_bn_relu() -> onnx.ModelProto:
    return testing.conv_bn_relu()  # x[1,3,8,8] -> conv -> bn -> relu -> y[1,4,8,8]


def validate(report: dict) -> None:
    """Validate as a consumer would: the JSON text against the published file."""
    schema = json.loads(schema_cli.DEFAULT_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(json.loads(json.dumps(report)))


@pytest.fixture(scope="module")
def conv_report(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("conv")
    model_path, fused_path = folder / "model.onnx", folder / "fused.onnx"
    onnx.save(conv_bn_relu(), model_path)
    config = OptimizeConfig(target="onnxruntime")
    result = optimize(model_path, config)
    save_model(result.model, fused_path)
    fused_name = result.applied[0].new_nodes[0]
    profile = copy.deepcopy(PROFILE)
    profile["regions"] = [
        {
            "pattern": "conv_bn_relu",
            "fused_nodes": [fused_name],
            "replaced_nodes": ["conv", "bn", "relu"],
            "before_us": 30.0,
            "after_us": 12.0,
        }
    ]
    rollbacks = [{"stage": 1, "pattern": "gelu_erf", "nodes": ["a", "b"], "error": "drift"}]
    return build_report(
        result,
        model=str(model_path),
        output=str(fused_path),
        config=config,
        registry_version=7,
        profile=profile,
        rollbacks=rollbacks,
    )


@pytest.fixture(scope="module")
def bert_report() -> dict:
    # The generic target leaves near misses and fuses across rounds (a scale fold, then
    # the QKV merge takes the folded MatMul). On cpu-roofline: the default cpu profile
    # prices the merge as a loss and leaves it out.
    config = OptimizeConfig(target="generic", target_profile="cpu-roofline", check={"samples": 1})
    return build_report(optimize(BERT, config), model=BERT.name, config=config)


# --- contents --------------------------------------------------------------------------


def test_report_keeps_the_version_1_keys_and_adds_the_new_ones(conv_report):
    assert conv_report["report_version"] == REPORT_VERSION == 2
    assert set(conv_report) >= V1_KEYS
    new = {"digests", "config", "registry_version", "profile", "rollbacks"}
    new |= {"regions", "structure", "precision", "selections", "switches", "left_alone"}
    new |= {"speed", "measurement"}
    new |= {"size", "memory"}
    new |= {"rejected", "fallback"}
    new |= {"folding"}
    new |= {"optimize_memory"}
    assert set(conv_report) == V1_KEYS | new
    assert conv_report["fusions"] == {"conv_bn_relu": 1}
    assert conv_report["nodes"]["by_op_before"] == {"BatchNormalization": 1, "Conv": 1, "Relu": 1}
    assert conv_report["registry_version"] == 7
    assert conv_report["config"]["target"] == "onnxruntime"
    assert conv_report["config"]["check"]["rtol"] == OptimizeConfig().check.rtol
    assert conv_report["check"]["passed"] is True


def test_digests_are_the_sha256_of_the_files(conv_report):
    for key, path in (("model_sha256", "model"), ("output_sha256", "output")):
        expected = hashlib.sha256(Path(conv_report[path]).read_bytes()).hexdigest()
        assert conv_report["digests"][key] == expected


def test_digests_are_null_without_files():
    result = optimize(conv_bn_relu(), OptimizeConfig(check={"enabled": False}))
    report = build_report(result, model="not-a-file.onnx")
    assert report["digests"] == {"model_sha256": None, "output_sha256": None}
    assert report["config"] is None and report["registry_version"] is None
    assert report["profile"] is None and report["check"] is None
    validate(report)


def test_each_fusion_has_provenance_and_gains(conv_report):
    (fusion,) = conv_report["applied"]
    assert fusion["index"] == 0
    assert fusion["provenance"] == {
        "original_nodes": ["conv", "bn", "relu"],
        "from_fusions": [],
        "superseded_by": [],
    }
    predicted = fusion["predicted_gain"]  # the cost model on the default "cpu" profile
    assert predicted["estimated_from"] == "shapes"
    assert predicted["launches_saved"] == 2  # Conv, BN, Relu -> one FusedConv
    # c and n (1x4x8x8 float32, 1024 bytes) are no longer written and read back
    assert predicted["bytes_saved"] == 4 * 1024
    assert predicted["flops_delta"] < 0  # the BatchNormalization's FLOPs are folded away
    assert predicted["saved_us"] > 0
    np.testing.assert_allclose(
        predicted["saved_us"], predicted["before_us"] - predicted["after_us"], rtol=0, atol=2e-3
    )
    np.testing.assert_allclose(
        predicted["ratio"], predicted["after_us"] / predicted["before_us"], rtol=0, atol=1e-4
    )
    assert fusion["measured_gain"] == {
        "before_us": 30.0,
        "after_us": 12.0,
        "saved_us": 18.0,
        "ratio": 0.4,
    }


def test_provenance_follows_fusions_across_rounds(bert_report):
    applied = bert_report["applied"]
    later = [f for f in applied if f["provenance"]["from_fusions"]]
    assert later, "the BERT model fuses across rounds"
    for fusion in later:
        for earlier in fusion["provenance"]["from_fusions"]:
            assert fusion["index"] in applied[earlier]["provenance"]["superseded_by"]
            assert set(applied[earlier]["provenance"]["original_nodes"]) <= set(
                fusion["provenance"]["original_nodes"]
            )
        # the nodes earlier fusions made are traced back to the input graph's
        assert not any(
            n.startswith("attention_scale_fold_") for n in fusion["provenance"]["original_nodes"]
        )
    assert all(f["measured_gain"] is None for f in applied)  # nothing was profiled


def test_rollbacks_come_from_the_parameter_or_the_result(conv_report):
    assert conv_report["rollbacks"][0]["pattern"] == "gelu_erf"
    result = optimize(conv_bn_relu(), OptimizeConfig(check={"enabled": False}))
    assert build_report(result)["rollbacks"] == getattr(result, "rollbacks", None)


# --- the schema ----------------------------------------------------------------------


def test_reports_validate_against_the_schema(conv_report, bert_report):
    assert bert_report["near_misses"], "the BERT model has near misses on generic"
    validate(conv_report)
    validate(bert_report)


def test_check_and_profile_sections_may_grow(conv_report):
    report = copy.deepcopy(conv_report)
    report["check"]["regions"] = [{"pattern": "x", "first_drift": None}]
    report["profile"]["memory"] = {"peak": 1}
    validate(report)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(("check",), id="check"),
        pytest.param(("digests",), id="digests"),
        pytest.param(("applied", 0, "provenance"), id="fusion-provenance"),
        pytest.param(("applied", 0, "measured_gain"), id="fusion-measured-gain"),
        pytest.param(("check", "seed"), id="check-seed"),
        pytest.param(("near_misses",), id="near-misses"),
    ],
)
def test_a_report_missing_a_required_key_fails_validation(conv_report, path):
    report = copy.deepcopy(conv_report)
    parent = report
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    with pytest.raises(jsonschema.ValidationError):
        validate(report)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("report_version", 1, id="old-version"),
        pytest.param("unknown_section", {}, id="unknown-key"),
        pytest.param("digests", {"model_sha256": "xyz", "output_sha256": None}, id="bad-digest"),
    ],
)
def test_a_report_with_a_wrong_value_fails_validation(conv_report, key, value):
    report = copy.deepcopy(conv_report) | {key: value}
    with pytest.raises(jsonschema.ValidationError):
        validate(report)


def test_the_committed_schema_is_up_to_date():
    committed = json.loads(schema_cli.DEFAULT_PATH.read_text(encoding="utf-8"))
    assert committed == report_schema(), (
        "docs/report.schema.json is out of date: "
        "run `python -m autofusion.fusion_core.report.schema`"
    )
    assert committed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema_cli.main(["--check"]) == 0


def test_schema_check_fails_on_a_stale_file(tmp_path):
    stale = tmp_path / "report.schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    assert schema_cli.main(["--check", str(stale)]) == 1
    assert schema_cli.main([str(stale)]) == 0
    assert schema_cli.main(["--check", str(stale)]) == 0


# --- renderings as text ----------------------------------------------------------------


def test_markdown_has_the_fusion_counts_check_and_profile(conv_report):
    text = format_markdown(conv_report)
    assert "### Fusions: 1 in" in text
    assert "| conv_bn_relu | 1 |" in text
    assert "**Check:** passed on" in text
    assert "| ORT_ENABLE_ALL | 0.800 |" in text
    assert "| pattern conv_bn_relu | 0.500 |" in text
    assert "Rolled back: 1" in text


def test_markdown_lists_the_top_near_misses(bert_report):
    text = format_markdown(bert_report)
    for pattern, count in bert_report["fusions"].items():
        assert f"| {pattern} | {count} |" in text
    assert f"### Near misses: {len(bert_report['near_misses'])}" in text
    # the cells escape Markdown's special characters (brackets of a perm, underscores)
    assert bert_report["near_misses"][0]["reason"] in text.replace("\\", "")
    assert "Profile" not in text


def test_markdown_escapes_table_cells(conv_report):
    report = copy.deepcopy(conv_report)
    report["near_misses"] = [{"pattern": "p|q", "nodes": ["a|b"], "reason": "x\ny"}]
    text = format_markdown(report)
    assert "| p\\|q | a\\|b | x y |" in text


def test_the_terminal_summary_still_reads_a_version_2_report(conv_report):
    assert "conv_bn_relu" in format_summary(conv_report)


def test_a_failed_check_reports_the_drifting_region_and_validates():
    """The broken-rewriter case of test_regions.py, through the report."""
    from tests.fusion_core import test_regions as cases

    registry = cases.builtin_rewriters()
    registry.register(cases.WrongEpsilonFoldBatchNorm())
    result = cases._optimize(cases.conv_model(), registry)
    report = build_report(result)
    validate(report)
    assert report["check"]["passed"] is False
    assert "bn_b" in report["regions"]["first_drift"]["replaced_nodes"]
    assert report["structure"] == []


def test_every_rendering_says_which_sizes_the_check_left_out(tmp_path) -> None:
    """A model that takes the tokens in pairs runs at the check's 16 tokens and not at
    its second length, 7: the check passes on 16, and the text, Markdown and HTML
    renderings say what it could not check (a passed alone would overstate it)."""
    from autofusion.fusion_core.report import render_html

    pairs = testing.build_model(
        """<ir_version: 8, opset_import: ["" : 18]>
        g (float[batch, sequence, 4] x) => (float[batch, pairs, 8] y) {
            y = Reshape (x, in_pairs)
        }""",
        {"in_pairs": np.array([0, -1, 8], np.int64)},
    )
    path = tmp_path / "pairs.onnx"
    onnx.save(pairs, path)
    config = OptimizeConfig(target="onnxruntime")
    report = build_report(optimize(path, config), model=str(path), config=config)
    assert report["check"]["passed"] and report["check"]["skipped"], report["check"]
    for text in (format_summary(report), format_markdown(report), render_html(report)):
        assert "not checked at {'batch': 1, 'sequence': 7}" in text.replace("&#39;", "'")
