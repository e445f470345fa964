"""The service refuses protobuf's pure-Python backend (issue 15, item 8).

``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` swaps the C (upb) parser for one that
is orders of magnitude slower on the models a client uploads and less hardened against
hostile input. ``serve`` and ``worker`` check before they start and exit with one line.
"""

from __future__ import annotations

__all__ = ["python_protobuf_refusal"]


def python_protobuf_refusal(command: str) -> str | None:
    """The one-line refusal when protobuf runs on its pure-Python backend, else None."""
    from google.protobuf.internal import api_implementation

    backend = api_implementation.Type()
    if backend != "python":
        return None
    return (
        f"autofusion {command}: refusing to start on protobuf's pure-Python backend "
        "(PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python): it is slow and less safe on "
        "uploaded models; unset that variable (or set it to 'upb')\n"
    )
