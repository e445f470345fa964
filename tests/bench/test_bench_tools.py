"""bench_tools' paired ratios to the original and to the best peer, and their cells."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import _tools_report
import bench_tools

FAMILIES = {
    "ort-all": "onnxruntime",
    "onnxslim": "onnxslim",
    "autofusion-ort-default": "autofusion",
}


def _records(**times: list[float]) -> dict:
    return {label: {"times_ms": list(t)} for label, t in times.items()}


def test_against_best_peer_pairs_autofusion_with_the_fastest_peer():
    base = [10.0, 11.0, 9.0, 10.0, 12.0, 10.0, 11.0, 10.0]
    records = _records(
        original=base,
        **{
            "ort-all": [t * 0.8 for t in base],
            "onnxslim": [t * 0.9 for t in base],
            "autofusion-ort-default": [t * 0.72 for t in base],
        },
    )
    for record in records.values():
        record["paired"] = {"median": record["times_ms"][0] / base[0]}
    bench_tools.against_best_peer(records, FAMILIES)
    vs = records["autofusion-ort-default"]["vs_best_peer"]
    assert vs["peer"] == "ort-all"
    assert vs["median"] == pytest.approx(0.9)
    assert vs["verdict"] == "faster"
    assert "vs_best_peer" not in records["ort-all"] and "vs_best_peer" not in records["original"]


@pytest.mark.parametrize(
    ("verdict", "cell"),
    [
        ("faster", "0.691 (0.684-0.699)"),
        ("no measurable change", "0.691 (0.684-0.699)"),
        ("slower", "**0.691 (0.684-0.699) slower**"),
    ],
    ids=["faster", "no-change", "slower-in-bold"],
)
def test_ratio_cell_shows_the_interval_and_marks_slower(verdict, cell):
    lat = {"paired": {"median": 0.6912, "low": 0.6841, "high": 0.6989, "verdict": verdict}}
    assert _tools_report.ratio_cell(lat) == cell
    compact = _tools_report.ratio_cell(lat, compact=True)
    assert compact == ("**0.691 slower**" if verdict == "slower" else "0.691")
