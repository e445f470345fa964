"""Units the renderings and the dashboard share, with no dependency: the dashboard
words a report without importing onnx-ir or onnx (tests/app/test_api_imports.py)."""

from __future__ import annotations

__all__ = ["bytes_text"]


def bytes_text(value: int) -> str:
    """Bytes in binary units: ``812 B``, ``3.4 KiB``, ``98.4 MiB``, ``1.20 GiB``."""
    if value < 1024:
        return f"{value} B"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if value < scale * 1024:
            return f"{value / scale:.1f} {unit}"
    return f"{value / (1 << 30):.2f} GiB"
