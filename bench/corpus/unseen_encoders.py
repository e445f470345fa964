"""Encoder, vision, speech and seq2seq-decoder families outside the corpus: what fuses.

Why: issue 24's acceptance is measured on families the corpus does not name; five surveys
(``unseen_families.py``) covered the causal LMs, and users bring encoders too. This builds
each family of ``_unseen_encoders`` from its config (2 layers, hidden 256, 8 heads of 32
where it takes them, 64x64 images, 1 s of 16 kHz audio; seeded weights with every 1-D
parameter re-randomized), exports it with both torch exporters (TorchScript at opset 17,
dynamo; ``_unseen_encoder_export``), optimizes it for onnxruntime with the check on
(profile ``cpu-roofline``, so every match shows), and prints per row the attention
implementation transformers picked, the fused attention ops (MultiHeadAttention,
GroupQueryAttention, Attention), the Softmax ops before and left, the fused norms, the
other fusions by pattern, the check, and the first attention near miss where a Softmax
is left.

    python bench/corpus/unseen_encoders.py [--out DIR] [--markdown FILE] [--attn eager]
        [--exporters torchscript dynamo] [FAMILY ...]

``--attn eager`` exports the eager attention where transformers' default (sdpa) fails to
export (torch 2.13's dynamo cannot view the non-contiguous SDPA output: BEiT, T5).

Needs the corpus extra (torch, transformers): ``make .venv/.corpus-installed``. Run one
process at a time (``flock /tmp/bigmem.lock``): each export holds its model in memory.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

import _unseen_encoders as enc
from unseen_families import EXPORTERS, KINDS, check_cell, emit_table, known_families

ATTENTION, NORMS = KINDS["attention"], KINDS["norms"]
_COLOR = re.compile(r"\x1b\[[0-9;]*m")


def export_error(exc: BaseException) -> str:
    """An exporter's failure as one table cell: torch.export's own error (not the wrapper's
    advice), colours and line breaks out, cut to 160 characters."""
    cause = exc.__cause__ or exc
    text = " ".join(_COLOR.sub("", str(cause)).split())
    return f"export failed: {type(cause).__name__}: {text}"[:160]


def other_fusions(counts: dict[str, int]) -> str:
    """The applied patterns that are neither attention nor a norm, most first."""
    rest = Counter({p: n for p, n in counts.items() if "attention" not in p and "norm" not in p})
    return ", ".join(f"{p} {n}" for p, n in rest.most_common())


def first_miss(result, softmax_left: int) -> str:
    """The first attention near miss, where an attention's Softmax is left."""
    misses = [m for m in result.near_misses if "attention" in m.pattern]
    if softmax_left <= 0 or not misses:
        return ""
    return f"{misses[0].pattern}: {misses[0].reason}"


def survey(family: str, kind: str, folder: Path, attn: str | None = None) -> dict:
    """One row: export (cached in ``folder``), optimize with the check, count; ``attn``:
    the attention implementation (None: the one transformers picks)."""
    import _unseen_encoder_export as export
    import onnx

    from autofusion.fusion_core import OptimizeConfig, optimize

    path = folder / f"{family}_{kind}{f'_{attn}' if attn else ''}.onnx"
    row = {"family": family, "exporter": kind, "attn": "?"}
    try:
        row["attn"] = export.build(family, attn).model.config._attn_implementation
        if not path.exists():
            export.export(family, kind, path, attn)
    except Exception as exc:  # an exporter's own failure: the row says which
        row["error"] = export_error(exc)
        return row
    model = onnx.load(str(path))
    started = time.perf_counter()
    result = optimize(model, OptimizeConfig(target="onnxruntime", target_profile="cpu-roofline"))
    row["seconds"] = round(time.perf_counter() - started, 1)
    after = Counter()
    for op, count in result.ops_after.items():
        after[op.split("::")[-1]] += count
    row["softmax"] = sum(1 for node in model.graph.node if node.op_type == "Softmax")
    row["softmax_left"] = after["Softmax"]
    row["attention"] = sum(after[op] for op in ATTENTION)
    row["norms"] = sum(after[op] for op in NORMS)
    row["other"] = other_fusions(result.counts)
    row["check"] = check_cell(result)
    row["miss"] = first_miss(result, row["softmax_left"])
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| family | what sets it apart | exporter (attn) | attention fused | Softmax before, "
        "left | norms | other fusions | check | first near miss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        about = enc.FAMILIES[row["family"]].about
        head = f"| {row['family']} | {about} | {row['exporter']} ({row['attn']}) "
        if "error" in row:
            error = row["error"].replace("|", "/")
            lines.append(f"{head}| - | - | - | - | {error} | |")
            continue
        miss = row["miss"].replace("|", "/")[:160]
        lines.append(
            f"{head}| {row['attention']} | {row['softmax']}, {row['softmax_left']} "
            f"| {row['norms']} | {row['other'] or '-'} | {row['check']} | {miss} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help=f"some of {', '.join(enc.FAMILIES)} (all)")
    default = Path.home() / ".cache/autofusion-corpus/unseen-encoders"
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--exporters", nargs="+", choices=EXPORTERS, default=list(EXPORTERS))
    parser.add_argument("--attn", help="the attention implementation (transformers' default)")
    args = parser.parse_args(argv)
    families = known_families(parser, args.families, enc.FAMILIES)
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for family in families:
        for kind in args.exporters:
            rows.append(survey(family, kind, args.out, args.attn))
            print(rows[-1], flush=True)
    emit_table(markdown(rows), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
