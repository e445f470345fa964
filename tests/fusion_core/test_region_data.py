"""regions.json: written where the models are, drawn where they are not, read as
untrusted data."""

from __future__ import annotations

import json

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.report import (
    build_report,
    example_fusions,
    region_pictures,
    regions_from_data,
)
from autofusion.fusion_core.testing import conv_bn_relu

XSS = '<script>alert("x")</script>'


def _pictures(prefix: str = "") -> dict:
    model = conv_bn_relu(prefix=prefix)
    result = optimize(model, OptimizeConfig(check={"enabled": False}))
    report = build_report(result)
    return region_pictures(report["applied"], model, result.to_proto())


def test_the_data_round_trips_to_the_same_pictures() -> None:
    data = json.loads(json.dumps(_pictures()))
    assert data["total"] == 1
    (region,) = regions_from_data(data)
    assert region["label"].startswith("#0 conv_bn")
    assert region["before"].startswith("<svg") and region["after"].startswith("<svg")
    assert "BatchNormalization" in region["before"] and "BatchNormalization" not in region["after"]


def test_node_names_are_escaped_when_drawn() -> None:
    (region,) = regions_from_data(_pictures(prefix=XSS))
    assert "<script>" not in region["before"] and "&lt;script&gt;" in region["before"]


def test_malformed_entries_are_dropped_not_drawn() -> None:
    good = _pictures()["regions"][0]
    too_many = {"nodes": [good["before"]["nodes"][0]] * 65}
    wrong_type = {"nodes": [{**good["before"]["nodes"][0], "inputs": "x"}]}
    data = {
        "regions": [
            "not a dict",
            {"label": 3},
            {"label": "a", "before": too_many, "after": wrong_type},
            {"label": "b", "before": {"nodes": []}, "after": None},
            good,
        ]
    }
    drawn = regions_from_data(data)
    assert [r["label"] for r in drawn] == ["a", "b", good["label"]]
    assert drawn[0]["before"] is None and drawn[0]["after"] is None
    assert drawn[1]["before"] is None
    assert drawn[2]["before"] is not None
    assert regions_from_data(None) == [] and regions_from_data({"regions": "x"}) == []


def test_pictures_show_key_attributes_and_shapes() -> None:
    data = json.loads(json.dumps(_pictures()))
    (region,) = data["regions"]
    assert (region["index"], region["pattern"]) == (0, "conv_bn_relu")
    conv = next(n for n in region["before"]["nodes"] if n["op"] == "Conv")
    assert conv["attrs"] == ["pads=1"]  # [1, 1, 1, 1] said once; no default attribute
    assert region["before"]["shapes"]["c"] == "1×4×8×8"  # inferred: not in the model
    svg = regions_from_data(data)[0]["before"]
    assert ">p=1<" in svg and ">1×4×8×8<" in svg
    assert "inputs: x (1×3×8×8), w (4×3×3×3)" in svg  # the tooltip names every input


def test_examples_are_a_few_per_pattern_most_frequent_first() -> None:
    applied = [{"pattern": "a"}] * 5 + [{"pattern": "b"}] * 7 + [{"pattern": "c"}]
    chosen = example_fusions(applied, per_pattern=2, limit=10)
    assert [(f["pattern"], f["index"]) for f in chosen] == [
        ("b", 5), ("b", 6), ("a", 0), ("a", 1), ("c", 12),
    ]  # fmt: skip
    # A tight limit keeps one example of every pattern before any gets a second.
    assert [f["pattern"] for f in example_fusions(applied, per_pattern=2, limit=4)] == [
        "b", "b", "a", "c",
    ]  # fmt: skip


def test_data_of_an_older_server_is_read_from_its_label() -> None:
    region = _pictures()["regions"][0]
    old = {k: v for k, v in region.items() if k not in ("index", "pattern")}
    old["before"] = {"nodes": [{k: v for k, v in n.items() if k != "attrs"}
                               for n in region["before"]["nodes"]]}  # fmt: skip
    (drawn,) = regions_from_data({"regions": [old]})
    assert (drawn["index"], drawn["pattern"]) == (0, "conv_bn_relu")
    assert drawn["before"].startswith("<svg") and drawn["after"].startswith("<svg")


def test_malformed_attributes_or_shapes_are_not_drawn() -> None:
    region = _pictures()["regions"][0]
    bad_attrs = {**region["before"], "nodes": [{**region["before"]["nodes"][0], "attrs": [3]}]}
    bad_shapes = {**region["before"], "shapes": {"c": ["1", "4"]}}
    drawn = regions_from_data({"regions": [{**region, "before": bad_attrs, "after": bad_shapes}]})
    assert drawn[0]["before"] is None and drawn[0]["after"] is None
