"""Write the report's JSON Schema: ``python -m autofusion.fusion_core.report.schema [PATH]``.

``docs/report.schema.json`` is generated from ``_schema.py`` and committed; a test fails
when the two differ. ``--check`` only compares (exit 1 when out of date).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autofusion.fusion_core.report._schema import report_schema

__all__ = ["DEFAULT_PATH", "main", "render"]

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "docs" / "report.schema.json"


def render() -> str:
    return json.dumps(report_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autofusion.fusion_core.report.schema", description=__doc__
    )
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
        if current != text:
            sys.stderr.write(
                f"{args.path} is out of date: run python -m autofusion.fusion_core.report.schema\n"
            )
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {args.path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
