"""The patterns page's rows: searched, grouped by family, each with its usage.

A family is what a pattern's rewriter makes of it (attention, normalization, an
activation, a fold into a Conv or Gemm, ...): the rewriter is the one fact every
pattern has, built-in or registered at run time, and it says what kind of fusion the
pattern is better than the YAML file a built-in came from (73 built-ins in 35 files). A
rewriter this table does not name (a newer release's) is listed under its own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autofusion.app.api.schemas.registry import PatternSummary
from autofusion.app.core.models import PatternRecord
from autofusion.app.services.pattern_usage import PatternUsage, UsageWindow

__all__ = [
    "FAMILIES",
    "PatternGroup",
    "PatternRow",
    "family_of",
    "family_slug",
    "group_patterns",
    "short",
]

# rewriter name -> family, in the order the page lists the families.
FAMILIES: dict[str, tuple[str, ...]] = {
    "Attention": (
        "attention",
        "attention_block",
        "group_query_attention",
        "packed_attention",
        "rotary",
        "fold_scale",
    ),
    "Normalization": (
        "layer_norm",
        "rms_norm",
        "skip_layer_norm",
        "skip_rms_norm",
        "fold_layer_norm_affine",
    ),
    "Activations": ("gelu", "silu", "hard_sigmoid", "hard_swish", "fuse_activation"),
    "Folded into Conv or Gemm": (
        "fold_batchnorm",
        "fold_affine",
        "pad_into_conv",
        "pool_bn",
        "matmul_add_to_gemm",
    ),
    "Merged siblings": ("merge_siblings",),
    "Mixture of experts": ("mixture_of_experts",),
    "Fused regions (any ops, no code)": ("fused_region",),
}
_FAMILY_OF = {rewriter: family for family, names in FAMILIES.items() for rewriter in names}
_ORDER = {family: k for k, family in enumerate(FAMILIES)}

SHORT_CHARS = 120  # the list's description: one line on a laptop's screen
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"`])")


def family_of(rewriter: str) -> str:
    return _FAMILY_OF.get(rewriter) or (rewriter or "other")


def family_slug(family: str) -> str:
    """The family's anchor on the patterns page (``#family-<slug>``)."""
    return re.sub(r"[^a-z0-9]+", "-", family.lower()).strip("-")


def short(description: str, limit: int = SHORT_CHARS) -> str:
    """The first sentence, cut at a word before ``limit`` characters (with an ellipsis):
    the whole text is on the pattern's own page."""
    text = " ".join(description.split())
    first = _SENTENCE_END.split(text, 1)[0]
    if len(first) <= limit:
        return first
    cut = first[:limit].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + " …"


@dataclass(frozen=True)
class PatternRow:
    summary: PatternSummary
    short: str
    ops: tuple[str, ...]  # the op types of its nodes, in order, each once
    usage: PatternUsage

    @property
    def name(self) -> str:
        return self.summary.name

    @property
    def shortened(self) -> bool:
        return self.short != " ".join(self.summary.description.split())


@dataclass(frozen=True)
class PatternGroup:
    family: str
    rows: list[PatternRow]

    @property
    def slug(self) -> str:
        return family_slug(self.family)

    @property
    def fusions(self) -> int:
        return sum(row.usage.fusions for row in self.rows)


def _ops(spec: dict[str, Any]) -> tuple[str, ...]:
    found: list[str] = []
    for node in spec.get("nodes") or []:
        op = node.get("op") if isinstance(node, dict) else None
        for name in op if isinstance(op, list) else [op]:
            if isinstance(name, str) and name not in found:
                found.append(name)
    return tuple(found)


def _matches(row: PatternRow, terms: list[str]) -> bool:
    """Every term is in the name, the description, an op type, the rewriter or family."""
    s = row.summary
    haystack = " ".join(
        (s.name, s.description, s.rewriter, family_of(s.rewriter), *row.ops)
    ).lower()
    return all(term in haystack for term in terms)


def group_patterns(
    records: list[PatternRecord], usage: UsageWindow, query: str = ""
) -> list[PatternGroup]:
    """The records that match ``query`` (every word of it, any case), by family; within a
    family the patterns that fired most come first, then by name."""
    terms = query.lower().split()
    groups: dict[str, list[PatternRow]] = {}
    for record in records:
        summary = PatternSummary.from_record(record)
        row = PatternRow(
            summary, short(summary.description), _ops(record.spec), usage.of(record.name)
        )
        if _matches(row, terms):
            groups.setdefault(family_of(summary.rewriter), []).append(row)
    ordered = sorted(groups, key=lambda f: (_ORDER.get(f, len(_ORDER)), f))
    return [
        PatternGroup(f, sorted(groups[f], key=lambda r: (-r.usage.fusions, r.name)))
        for f in ordered
    ]
