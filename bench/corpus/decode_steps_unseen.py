"""The padded multi-step decode on the surveyed families: fused logits against the original's.

Why: issue 24's acceptance asks that a multi-step decode with padding and a batch of two
stays within 1e-4 of the original on families the corpus does not name. The survey
(``unseen_families.py --kv``) checks one step with a full mask; a fusion that mishandles
padding, positions or a cache that grows step by step shows only in a real generation
loop. This exports each family's KV-cache graph (``_llm_torch``'s ``dynamo_kv``, reused
from ``--out``), fuses it as the survey does (``fusion_core.optimize`` for onnxruntime,
profile ``cpu-roofline``, the check on), and runs ``bench/_decoder_steps.py``'s decode on
both: a batch of two 16-token prompts, the second left-padded by 5, prefilled from an
empty cache, then ``--steps`` greedy one-token steps, every variant fed the original's
tokens. The survey's graphs carry more than keys and values (``_kv_states``): a state
whose name ends in ``key``, ``value`` or ``indexer_key`` (a sparse attention's indexer)
grows along its length axis and starts empty; a convolution or recurrent state has a
fixed size, starts at zeros (a causal convolution's left padding and a scan's initial
state) and is carried from ``present.*`` to ``past_key_values.*`` as is. A graph
exported for one new token (a recurrent layer's chunked scan fixes the length) is
prefilled one token at a time, and one whose batch the export fixed to 1 runs each row
alone (the padded row still padded).

Per family: the attention ops fused against the model's attention layers, the max abs
difference of the logits over the prefill's real positions and over the steps, the
logits' magnitude, and the verdicts: absolute (1e-4) and relative (the difference over
the logits' max abs, 1e-5). ``--torch`` adds the original against torch on the same feeds
(the export's own error); ``--disable PATTERN`` (repeatable) fuses without a pattern, to
find which fusion a failing row owes its difference to. Rows are saved in ``--out`` and
reused (``--again`` recomputes them).

    python bench/corpus/decode_steps_unseen.py [--out DIR] [--markdown FILE] [--torch]
        [--steps N] [--padding P] [--disable PATTERN] [--again] FAMILY ...

Needs the corpus extra (torch, transformers): ``make .venv/.corpus-installed``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from pathlib import Path

import unseen_families as unseen
from _decode_loop import Decoder, carry, empty_state, generate, run_steps, state_kind
from _decode_plan import ATOL, BATCH, LENGTH, PADDING, RELATIVE, STEPS, Plan
from _decode_table import markdown
from _decode_torch import TorchDecoder
from _decoder_steps import compare, prompts

# The decode (_decode_loop, first: it puts bench/ on sys.path for _decoder_steps), its
# plan, the torch reference and the table are the _decode_*.py beside this. __all__: the
# names the tests read from here.
__all__ = ["Plan", "carry", "empty_state", "main", "measure", "prompts", "run_steps", "unseen"]
CONFIG = dict(target="onnxruntime", target_profile="cpu-roofline")  # the survey's
log = logging.getLogger(__name__)


def export(family: str, folder: Path) -> Path:
    """The survey's KV export of ``family``, reused when ``folder`` has it."""
    import _llm_torch
    from unseen_families import EXAMPLE_BATCH

    path = folder / f"{family}_dynamo_kv.onnx"
    if not path.exists():
        _llm_torch.export(family, "dynamo_kv", path, batch=EXAMPLE_BATCH)
    return path


def fuse(path: Path, disable: list[str]) -> tuple[Path, dict]:
    """The fused graph (beside the original) and what fused: ops by kind, the check."""
    from autofusion.fusion_core import OptimizeConfig, optimize, save_model

    started = time.perf_counter()
    result = optimize(str(path), OptimizeConfig(**CONFIG, exclude=disable))
    fused = path.with_name(path.stem + (".no-" + "-".join(disable) if disable else "") + ".af.onnx")
    save_model(result.model, str(fused))
    after = Counter()
    for op, count in result.ops_after.items():
        after[op.split("::")[-1]] += count
    row = {name: sum(after[op] for op in ops) for name, ops in unseen.KINDS.items()}
    row["attention_ops"] = {op: after[op] for op in unseen.KINDS["attention"] if after[op]}
    row["seconds"] = round(time.perf_counter() - started, 1)
    row["check"] = unseen.check_cell(result)
    return fused, row


def verdicts(diffs: dict) -> dict:
    """Pass against 1e-4 absolute and against 1e-5 of the logits' max abs."""
    worst = max(diffs["prefill_max_abs"], diffs["decode_max_abs"])
    scale = diffs["original_logits_max_abs"]
    return {
        "worst": worst,
        "relative": worst / scale if scale else float("nan"),
        "abs_pass": bool(worst <= ATOL),  # a NaN fails both
        "rel_pass": bool(worst <= RELATIVE * scale),
    }


def attention_layers(past: list[str]) -> int:
    """Layers whose cache holds keys: the attention blocks there are to fuse."""
    return len({name.split(".")[1] for name in past if state_kind(name) == "key"})


def decode_both(family: str, path: Path, plan: Plan) -> dict:
    """What fused, and the padded decode of the fused graph against the original's."""
    fused, row = fuse(path, list(plan.disable))
    decoder = Decoder(path)
    out = {"fused": row, "attention_layers": attention_layers(decoder.past)}
    out |= {"one_token": decoder.one_token, "one_row": decoder.one_row}
    ids, mask = prompts(BATCH, LENGTH, plan.padding)
    steps = plan.steps
    base, tokens = run_steps(path, ids, mask, steps)
    out["fused_vs_original"] = compare(run_steps(fused, ids, mask, steps, tokens)[0], base, mask)
    out["verdict"] = verdicts(out["fused_vs_original"])
    if plan.with_torch:
        reference = generate(TorchDecoder(family, decoder.one_token), ids, mask, steps, tokens)
        out["original_vs_torch"] = compare(base, reference[0], mask)
    return out


def measure(family: str, folder: Path, plan: Plan) -> dict:
    """One family's row: export, fuse, the padded decode on both, the verdicts."""
    row = {"family": family, "disabled": list(plan.disable)}
    row |= {"steps": plan.steps, "padding": plan.padding}
    try:
        path = export(family, folder)
    except Exception as exc:  # an exporter's own failure: the row says which
        cause = exc.__cause__ or exc
        row["error"] = (
            f"export failed: {type(cause).__name__}: {' '.join(str(cause).split())[:160]}"
        )
        return row
    try:
        row.update(decode_both(family, path, plan))
    except Exception as exc:  # the row says what failed; the next family still runs
        log.debug("%s failed", family, exc_info=True)
        row["error"] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    return row


def family_row(family: str, args) -> dict:
    """The row saved in ``--out`` (recomputed with ``--again``)."""
    plan = Plan(args.steps, args.padding, tuple(args.disable), args.torch)
    saved = args.out / f"{family}_decode{plan.suffix()}.json"
    if saved.exists() and not args.again:
        return json.loads(saved.read_text())
    row = measure(family, args.out, plan)
    saved.write_text(json.dumps(row, indent=1))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="+", help=f"some of {', '.join(unseen.UNSEEN)}")
    parser.add_argument("--out", type=Path, default=Path("/tmp/decode-survey"))
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--padding", type=int, default=PADDING, help=f"of {LENGTH} tokens")
    parser.add_argument("--torch", action="store_true", help="the original against torch too")
    parser.add_argument("--again", action="store_true", help="recompute saved rows")
    parser.add_argument("--disable", action="append", default=[], help="a pattern to exclude")
    args = parser.parse_args(argv)
    families = unseen.known_families(parser, args.families, unseen.UNSEEN)
    logging.basicConfig(level=logging.WARNING)
    unseen.register_unseen()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for family in families:
        rows.append(family_row(family, args))
        print(json.dumps(rows[-1]), flush=True)
    unseen.emit_table(markdown(rows), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
