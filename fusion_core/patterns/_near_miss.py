"""A place that matched in part but did not fuse, and why: plain data, no onnx, so the
API can name it in its schemas without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NEAR_MISS_KINDS", "NearMiss"]

# Why a place did not fuse, by who said no: a constraint of the pattern, a value the
# fusion would remove that is needed outside it (escape), the rewriter, the selection
# (the cost model, a limit, measured selection), progressive validation's rollback, or a
# bug: the rewrite raised or broke the graph and was taken back (Result.rejected).
NEAR_MISS_KINDS = ("constraint", "escape", "rewriter", "selection", "rollback", "bug")


@dataclass(frozen=True)
class NearMiss:
    """A place that matched (in part) but did not fuse, and why."""

    pattern: str
    nodes: tuple[str, ...]
    reason: str
    kind: str = "constraint"  # one of NEAR_MISS_KINDS

    def __post_init__(self) -> None:
        if self.kind not in NEAR_MISS_KINDS:
            raise ValueError(f"near miss kind {self.kind!r}: expected one of {NEAR_MISS_KINDS}")

    def to_dict(self) -> dict:
        return {
            "pattern": self.pattern,
            "nodes": list(self.nodes),
            "reason": self.reason,
            "kind": self.kind,
        }
