"""The generated spelling tests take their example budget from one place
(``spelling_settings.EXAMPLES``, the ``AUTOFUSION_SPELLING_EXAMPLES`` variable) and their
hypothesis settings from ``spelling_settings.SPELLINGS``, and the onnx text lines of a
rotary block's angles and rotate_half tables stand once, in ``decoder_text`` (``ANGLES``,
``FREQ_TABLES``): a copy drifts from the others (the budget's default, a health check,
an axis name) unnoticed. A file that reads the variable with a default of its own on
purpose is listed below with its reason. Each is marked ``spelling``, which the corpus tier
selects to run them again at 200 examples."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import HealthCheck

from tests.fusion_core.decoder_text import ANGLES, FREQ_TABLES
from tests.fusion_core.spelling_settings import EXAMPLES, SPELLINGS

TESTS = Path(__file__).resolve().parents[1]
READ = "os.environ.get(" + '"AUTOFUSION_SPELLING_EXAMPLES"'  # split: this file reads nothing
OWN_BUDGETS = {  # the file, relative to tests/: its own default (make test's budget)
    "fusion_core/spelling_settings.py": "25: the shared budget itself",
    "fusion_core/rewriters/test_mask_sizes.py": "16",
    "fusion_core/rewriters/test_group_query_attention_head_sizes.py": "16",
    "fusion_core/rewriters/test_group_query_attention_narrow_values.py": "14",
    "fusion_core/canonical/test_value_scale.py": "16",
    "fusion_core/rewriters/test_gqa_sizes.py": "8",
    # the shared 25 but not moved onto it yet: another change is editing the file
    "fusion_core/rewriters/test_group_query_attention_window.py": "25",
}


def test_the_shared_settings_are_the_budget_derandomized_without_a_deadline() -> None:
    assert SPELLINGS.max_examples == EXAMPLES
    assert SPELLINGS.deadline is None and SPELLINGS.derandomize
    assert list(SPELLINGS.suppress_health_check) == [HealthCheck.too_slow]


def test_only_the_listed_files_read_the_example_budget_themselves() -> None:
    readers = {
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("*.py")
        if READ in path.read_text(encoding="utf-8")
    }
    assert sorted(readers - OWN_BUDGETS.keys()) == [], (
        "import EXAMPLES (or SPELLINGS) from tests/fusion_core/spelling_settings.py "
        "instead, or list the file in OWN_BUDGETS with its reason"
    )


def _copies(tree: ast.AST, lines: list[str]) -> int:
    """How many list literals in ``tree`` spell ``lines`` one after another."""
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.List):
            texts = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            found += any(
                texts[i : i + len(lines)] == lines for i in range(len(texts) - len(lines) + 1)
            )
    return found


def test_no_test_module_writes_the_rotary_angles_or_tables_out_again() -> None:
    copies = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "decoder_text.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, lines in (("ANGLES", ANGLES), ("FREQ_TABLES", FREQ_TABLES)):
            if _copies(tree, lines):
                copies.append(f"{path.relative_to(TESTS).as_posix()}: {name}")
    assert copies == [], "use tests/fusion_core/decoder_text.py's lists instead"


MARK = "pytestmark = pytest.mark.spelling"


def _marked(tree: ast.Module) -> bool:
    """Whether the module assigns ``pytestmark`` a value holding ``pytest.mark.spelling``
    at its top level (the line inside a docstring marks nothing)."""
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
        and "pytest.mark.spelling" in ast.unparse(node.value)
        for node in tree.body
    )


def test_every_generated_spelling_test_is_marked_for_the_corpus_tier() -> None:
    """The corpus tier runs ``-m spelling`` at 200 examples (Makefile ``test-corpus``): a
    generator that takes the shared budget and forgets the mark would run at 25 only."""
    unmarked = sorted(
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if path.name != Path(__file__).name  # reads the settings, generates nothing
        and ("spelling_settings import" in (text := path.read_text(encoding="utf-8"))
            or path.relative_to(TESTS).as_posix() in OWN_BUDGETS)
        and not _marked(ast.parse(text))
    )  # fmt: skip
    assert unmarked == [], f"add `{MARK}` to these (and `import pytest`)"
