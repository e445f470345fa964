"""The CI client's node counts: the main graph's as the headline, the If/Loop/Scan
bodies' apart (the report's ``nodes.subgraphs``), in the text summary and in ``--json``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from submit_testing import submit_outcome

from autofusion.app.cli._submit_json import submit_document
from autofusion.app.cli._submit_output import facts

NODES = {
    "before": 4,
    "after": 2,
    "by_op_before": {"BatchNormalization": 1, "Conv": 1, "If": 1, "Relu": 1},
    "by_op_after": {"com.microsoft::FusedConv": 1, "If": 1},
}
BODIES = {"before": 3, "after": 5, "by_op_before": {"Neg": 3}, "by_op_after": {"Neg": 5}}


def _outcome(nodes: dict) -> SimpleNamespace:
    return submit_outcome({"target": "onnxruntime", "fusions": {"conv_bn_relu": 1}, "nodes": nodes})


@pytest.mark.parametrize(
    "nodes, line, document",
    [
        (
            {**NODES, "subgraphs": BODIES},
            "4 -> 2 (and 3 -> 5 in If/Loop/Scan bodies)",
            {"before": 4, "after": 2, "subgraphs": {"before": 3, "after": 5}},
        ),
        ({**NODES, "subgraphs": None}, "4 -> 2", {"before": 4, "after": 2}),
        (NODES, "4 -> 2", {"before": 4, "after": 2}),  # a report from before the split
    ],
    ids=["with-bodies", "no-body", "older-report"],
)
def test_the_client_shows_the_main_graph_and_the_bodies_apart(nodes, line, document):
    outcome = _outcome(nodes)
    assert dict(facts(outcome))["nodes"] == line
    assert submit_document(outcome)["details"]["nodes"] == document
