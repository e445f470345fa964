"""bench/corpus/decode_steps_unseen.py stays a short script over modules split by concern
(``_decode_plan``: what a run measures; ``_decode_loop``: the onnxruntime decode and its
cache states; ``_decode_torch``: the torch reference; ``_decode_table``: the Markdown
table), and its table reads as before: a row named by how its run differs from the
default plan, an error row as wide as the header."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "corpus"))
import decode_steps_unseen as decode

CORPUS = Path(decode.__file__).parent
SHORT = 350  # lines: docs/architecture.md's "under about 400", with room to grow


def test_the_decode_survey_is_split_into_short_modules() -> None:
    modules = [CORPUS / "decode_steps_unseen.py", *sorted(CORPUS.glob("_decode_*.py"))]
    names = {path.stem for path in modules}
    assert {"_decode_plan", "_decode_loop", "_decode_torch", "_decode_table"} <= names
    long = {p.name: n for p in modules if (n := len(p.read_text().splitlines())) > SHORT}
    assert long == {}


def _row(**changes) -> dict:
    row = {
        "family": "toy",
        "disabled": [],
        "one_token": False,
        "attention_layers": 2,
        "fused": {
            "attention_ops": {"GroupQueryAttention": 2},
            "rotary": 2,
            "norms": 5,
            "check": "passed",
        },
        "fused_vs_original": {
            "prefill_max_abs": 2e-6,
            "decode_max_abs": float("nan"),
            "original_logits_max_abs": 12.0,
        },
        "verdict": {"relative": 1e-7, "abs_pass": True, "rel_pass": False},
    }
    return row | changes


def test_the_table_names_each_row_by_how_its_run_differs_from_the_default() -> None:
    rows = [
        _row(),
        _row(steps=3, padding=0, disabled=["rotary_embedding"], one_row=True),
        {"family": "broken", "disabled": [], "error": "export failed: boom"},
    ]
    header, rule, default, other, error = decode.markdown(rows).splitlines()
    assert header.count("|") == rule.count("|") == error.count("|") == 12
    assert default == (
        "| toy | any length | 2 GQA of 2 | 2, 5 | passed | 2.0e-06 / NaN | 12 | 1.0e-07 "
        "| pass | **FAIL** |  |"
    )
    assert other.startswith(
        "| toy, 3 steps, padding 0 (no rotary_embedding) "
        "| any length, batch fixed to 1: rows alone |"
    )
    assert error.startswith("| broken | export failed: boom |")
