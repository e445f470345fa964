"""``submit``'s summary says what measured selection decided and where from: the groups it
kept, how many came from the verdict store (and which jobs measured them), how many were
timed (issue 28). Read from the report as a server of any version wrote it: a report
without measured selection, or one written before the store, says no more than before."""

from __future__ import annotations

from autofusion.app.cli._submit_output import measured_line


def group(source: str, kept: bool, jobs: tuple[str, ...] = ()) -> dict:
    combined = {"jobs": list(jobs), "measurements": len(jobs)} if source == "store" else None
    return {"group": f"g{source}{kept}", "kept": kept, "source": source, "combined": combined}


def test_the_line_counts_the_store_s_decisions_and_names_their_jobs() -> None:
    report = {
        "measurement": {
            "seconds": 3.21,
            "groups": [
                group("store", True, ("1234567890ab", "abcdef012345")),
                group("store", False, ("1234567890ab",)),
                group("measured", True),
                group("not measured", False),
            ],
        }
    }
    assert measured_line(report) == (
        "4 group(s), 2 kept; 2 decided from the verdict store, 1 timed "
        "(measured by job(s) 12345678, abcdef01), in 3.2 s"
    )


def test_a_report_without_measured_selection_or_before_the_store_says_no_more() -> None:
    assert measured_line({"measurement": None}) is None
    assert measured_line({}) is None
    before_the_store = {"measurement": {"groups": [{"group": "g", "kept": True}]}}
    assert measured_line(before_the_store) == "1 group(s), 1 kept"
