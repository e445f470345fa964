"""The HTML rendering of a report: one self-contained page, inline SVG that parses,
charts exactly when there is profile data, region pictures when the models are given,
and every name from a model escaped."""

from __future__ import annotations

import copy
import re
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import onnx.numpy_helper as nh
import onnx.parser
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.report import (
    EXAMPLES_PER_PATTERN,
    MAX_REGION_PICTURES,
    build_report,
    render_html,
)

HOSTILE = "<script>alert(1)</script>"
SVG = re.compile(r"<svg\b.*?</svg>", re.S)
CHARTS = ('id="chart-latency"', 'id="chart-op-types"')
PROFILE = {
    "latency": [
        {
            "level": "ORT_DISABLE_ALL",
            "ratio": 0.7,
            "sessions": [
                {"label": "original", "median_ms": 2.0, "p90_ms": 2.5},
                {"label": "fused", "median_ms": 1.4, "p90_ms": 1.9},
            ],
        }
    ],
    "nodes": {
        "original": {
            "runs": 1,
            "op_types": [
                {"op_type": "Conv", "total_us": 30.0},
                {"op_type": "BatchNormalization", "total_us": 9.0},
                {"op_type": f"Relu{HOSTILE}", "total_us": 4.0},
            ],
        },
        "fused": {"runs": 1, "op_types": [{"op_type": "Conv", "total_us": 31.0}]},
    },
}


def conv_chain(blocks: int, first_name: str = "conv0") -> onnx.ModelProto:
    """``blocks`` Conv -> BatchNormalization -> Relu blocks in a row, 2 channels."""
    lines, arrays = [], {}
    rng = np.random.default_rng(1)
    for i in range(blocks):
        lines += [
            f" c{i} = Conv(v{i}, w{i})" if i else " c0 = Conv(x, w0)",
            f" n{i} = BatchNormalization(c{i}, g{i}, b{i}, m{i}, s{i})",
            f" {'y' if i == blocks - 1 else f'v{i + 1}'} = Relu(n{i})",
        ]
        arrays |= {f"w{i}": rng.normal(0, 0.5, (2, 2, 1, 1)), f"g{i}": rng.uniform(0.5, 1.5, 2)}
        arrays |= {f"b{i}": rng.normal(0, 0.1, 2), f"m{i}": rng.normal(0, 0.1, 2)}
        arrays |= {f"s{i}": rng.uniform(0.5, 2.0, 2)}
    model = onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[1,2,4,4] x) => (float[1,2,4,4] y) {\n" + "\n".join(lines) + "\n}"
    )
    model.graph.initializer.extend(
        nh.from_array(a.astype(np.float32), n) for n, a in arrays.items()
    )
    for k, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}{k // 3}"
    model.graph.node[0].name = first_name
    return model


@pytest.fixture(scope="module")
def hostile():
    """A report on a model whose first node is named like a script tag."""
    original = conv_chain(2, first_name=HOSTILE)
    result = optimize(original, OptimizeConfig(target="generic"))
    return build_report(result, model=f"{HOSTILE}.onnx"), original, result.to_proto()


def svgs(html: str) -> list[ET.Element]:
    """Every inline SVG, parsed as XML (fails the test when one does not parse)."""
    return [ET.fromstring(svg) for svg in SVG.findall(html)]


def assert_self_contained(html: str) -> None:
    lowered = html.lower()
    for marker in ("<script", "<link", "<iframe", "<img", "@import", "url(", "src="):
        assert marker not in lowered, marker
    # Links only within the page (a fusion's row to its group and picture).
    assert all(link.startswith("#") for link in re.findall(r"href=\"([^\"]*)\"", html))
    assert re.findall(r"https?://[^\"']+", html) == ["http://www.w3.org/2000/svg"] * len(
        SVG.findall(html)
    )


def test_renders_without_profile_or_models(hostile):
    report, _, _ = hostile
    html = render_html(report)
    assert html.startswith("<!DOCTYPE html>")
    assert_self_contained(html)
    for chart in CHARTS:
        assert chart not in html
    assert 'class="region"' not in html
    # Only the check's error histograms: one per compared output, as on the job page.
    outputs = len(report["check"]["outputs"])
    assert [svg.get("id") for svg in svgs(html)] == [f"chart-error-{k}" for k in range(outputs)]
    assert 'id="fusions"' in html and 'id="validation"' in html


def test_renders_charts_and_regions_with_profile_and_models(hostile):
    report, original, fused = hostile
    report = copy.deepcopy(report) | {"profile": PROFILE}
    html = render_html(report, original=original, fused=fused)
    assert_self_contained(html)
    for chart in CHARTS:
        assert html.count(chart) == 1
    parsed = svgs(html)
    regions = [svg for svg in parsed if svg.get("class") == "region"]
    assert len(regions) == 2 * len(report["applied"])  # before and after of each
    histograms = [svg for svg in parsed if (svg.get("id") or "").startswith("chart-error-")]
    assert len(parsed) == len(regions) + 2 + len(histograms)


def test_only_the_charts_with_data_are_drawn(hostile):
    report, _, _ = hostile
    latency_only = copy.deepcopy(report) | {"profile": {"latency": PROFILE["latency"]}}
    html = render_html(latency_only)
    assert 'id="chart-latency"' in html and 'id="chart-op-types"' not in html
    nodes_only = copy.deepcopy(report) | {"profile": {"nodes": PROFILE["nodes"]}}
    html = render_html(nodes_only)
    assert 'id="chart-op-types"' in html and 'id="chart-latency"' not in html
    assert all(chart not in render_html(report | {"profile": {}}) for chart in CHARTS)


def test_names_from_the_model_are_escaped(hostile):
    report, original, fused = hostile
    assert HOSTILE in report["applied"][0]["replaced_nodes"]
    html = render_html(report | {"profile": PROFILE}, original=original, fused=fused)
    assert HOSTILE not in html
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    titles = [t.text for svg in svgs(html) for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert HOSTILE in titles  # the full name, escaped in the page, is the node's tooltip


def test_region_pictures_show_the_nodes_and_their_neighbours(hostile):
    report, original, fused = hostile
    html = render_html(report, original=original, fused=fused)
    first_before = svgs(html)[0]
    names = {
        g.find("{http://www.w3.org/2000/svg}title").text: g.get("class")
        for g in first_before.iter("{http://www.w3.org/2000/svg}g")
    }
    # the first block's three nodes, and the second block's Conv that reads its output
    assert names == {
        HOSTILE: "fused",
        "batchnormalization0": "fused",
        "relu0": "fused",
        "conv1": "near",
    }


def test_region_pictures_are_a_few_examples_of_each_pattern():
    """A deep chain fuses one pattern many times: a few pictures of it, the rest counted."""
    model = conv_chain(MAX_REGION_PICTURES + 3)
    result = optimize(model, OptimizeConfig(target="generic", check={"enabled": False}))
    report = build_report(result)
    assert len(report["applied"]) == MAX_REGION_PICTURES + 3
    html = render_html(report, original=model, fused=result.to_proto())
    regions = [svg for svg in svgs(html) if svg.get("class") == "region"]
    assert len(regions) == 2 * EXAMPLES_PER_PATTERN
    count = MAX_REGION_PICTURES + 3
    assert f'data-pattern="conv_bn_relu" data-count="{count}"' in html
    # Every fusion is listed by its nodes, the pictured ones linking to their picture.
    rows = re.findall(r'<tr id="fusion-(\d+)"><td>(<a href="#region-\d+">)?', html)
    assert len(rows) == count and sum(bool(link) for _, link in rows) == EXAMPLES_PER_PATTERN


def test_region_pictures_show_shapes_and_key_attributes(hostile):
    report, original, fused = hostile
    html = render_html(report, original=original, fused=fused)
    before = svgs(html)[0]
    texts = [t.text for t in before.iter("{http://www.w3.org/2000/svg}text")]
    assert "1×2×4×4" in texts  # an intermediate value's shape, from shape inference
    assert "→ 1×2×4×4" in texts  # a node without attributes shows its output's shape
