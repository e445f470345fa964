"""How a sandbox that ran out of its address space (RLIMIT_AS) is recognized.

On its side, by the exception (``is_out_of_memory``); on the parent's, when it died
before it could write its error file, by what it printed (``MEMORY_HINTS`` in its log).
"""

from __future__ import annotations

import errno

__all__ = ["MEMORY_HINTS", "is_out_of_memory", "says_out_of_memory"]

# What C++ allocators, protobuf, onnx, the dynamic loader and the interpreter say when an
# allocation fails under RLIMIT_AS.
MEMORY_HINTS = (
    "memoryerror",
    "cannot allocate memory",
    "out of memory",
    "bad_alloc",
    "arena alloc failed",
    "failed to map segment",
    "memory allocation",
    "can't start new thread",
)
# Errors whose text may quote the model or the request (a node called "out of memory"):
# only what a library raised counts by its text.
_QUOTING_MODULES = ("autofusion.", "pydantic")
_CHAIN_LIMIT = 8


def says_out_of_memory(text: str) -> bool:
    """Whether ``text`` (an exception's message, the tail of a log) reads like an
    allocation that failed."""
    lowered = text.lower()
    return any(hint in lowered for hint in MEMORY_HINTS)


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Out of address space, even where a check turned it into a refusal: protobuf's
    ``DecodeError: Arena alloc failed`` became "not a valid ONNX file"."""
    seen = 0
    while exc is not None and seen < _CHAIN_LIMIT:
        if isinstance(exc, MemoryError):
            return True
        if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
            return True
        if not type(exc).__module__.startswith(_QUOTING_MODULES) and says_out_of_memory(str(exc)):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
