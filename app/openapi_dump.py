"""Write the published API contract: ``python -m autofusion.app.openapi_dump [PATH]``.

``docs/openapi.json`` is generated from ``create_app().openapi()`` and committed; a test
fails when the two differ, so regenerate it after changing a route or a schema.
``--check`` only compares (exit 1 when out of date).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from autofusion.app.core.config import Settings
from autofusion.app.main import create_app

__all__ = ["DEFAULT_PATH", "openapi_document", "render"]

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of an app built with default settings (nothing is started)."""
    with tempfile.TemporaryDirectory() as data_dir:
        return create_app(Settings(data_dir=Path(data_dir))).openapi()


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autofusion.app.openapi_dump", description=__doc__
    )
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    args = parser.parse_args(argv)
    text = render(openapi_document())
    if args.check:
        current = args.path.read_text(encoding="utf-8") if args.path.exists() else ""
        if current != text:
            print(
                f"{args.path} is out of date: run python -m autofusion.app.openapi_dump",
                file=sys.stderr,
            )
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text, encoding="utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
