"""regions.json: written where the models are, drawn where they are not, read as
untrusted data."""

from __future__ import annotations

import json

from fusion_core import OptimizeConfig, optimize
from fusion_core.report import build_report, region_pictures, regions_from_data
from fusion_core.testing import conv_bn_relu

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
