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
import warnings
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np
import unseen_families as unseen

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ for the decode loop
from _decoder_steps import compare, positions, prompts

PAST, PRESENT = "past_key_values.", "present."
# the kinds that grow, and their length axis: _kv_states.LENGTH_AXES (imported there with torch)
GROWING = {"key": 2, "value": 2, "indexer_key": 1}
BATCH, LENGTH, PADDING, STEPS = 2, 16, 5, 6
ATOL, RELATIVE = 1e-4, 1e-5
CONFIG = dict(target="onnxruntime", target_profile="cpu-roofline")  # the survey's
log = logging.getLogger(__name__)


class Plan(NamedTuple):
    """What one run measures: the decode's length, the padded row's padding, the patterns
    excluded from the fusion, and whether torch is run too."""

    steps: int = STEPS
    padding: int = PADDING
    disable: tuple[str, ...] = ()
    with_torch: bool = False

    def suffix(self) -> str:
        """Names a saved row of a run other than the default."""
        default = (self.steps, self.padding) == (STEPS, PADDING)
        shape = "" if default else f".s{self.steps}p{self.padding}"
        return shape + "".join(f".no-{name}" for name in self.disable)


def state_kind(name: str) -> str:
    """``past_key_values.{layer}.{kind}[.{index}]`` -> kind."""
    return name.split(".")[2]


def empty_state(name: str, shape: list, batch: int, dtype=np.float32) -> np.ndarray:
    """The state before any token: keys, values and indexer keys of length 0, a
    fixed-size state (convolution, recurrent) of zeros. Every dim but the batch and the
    growing length must be a number in the graph."""
    dims = list(shape)
    dims[0] = batch
    kind = state_kind(name)
    if kind in GROWING:
        dims[GROWING[kind]] = 0
    unknown = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    if unknown:
        raise ValueError(
            f"{name}: dims {unknown} of {shape} are not numbers, so its empty state has "
            "no size; export the graph with those dims static"
        )
    return np.zeros(dims, dtype)


def carry(outputs: dict[str, np.ndarray], inputs: list[str]) -> dict[str, np.ndarray]:
    """Each ``present.X`` becomes the next step's ``past_key_values.X``, grown or not."""
    state = {PAST + n[len(PRESENT) :]: v for n, v in outputs.items() if n.startswith(PRESENT)}
    missing = sorted(set(inputs) - set(state))
    if missing:
        raise ValueError(f"the graph takes {missing} but outputs no present state for them")
    return {name: state[name] for name in inputs}


class Decoder:
    """One session and its cache; ``step`` feeds new tokens and the whole mask so far."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.args = self.session.get_inputs()
        self.names = {arg.name for arg in self.args}
        self.outputs = [out.name for out in self.session.get_outputs()]
        self.past = [arg.name for arg in self.args if arg.name.startswith(PAST)]
        self.cache: dict[str, np.ndarray] = {}
        ids = next(arg for arg in self.args if arg.name == "input_ids")
        if isinstance(ids.shape[1], int) and ids.shape[1] != 1:
            raise ValueError(
                f"{path.name} takes exactly {ids.shape[1]} new tokens a call (the export "
                "fixed the count), so neither a prefill nor a one-token step can be fed"
            )
        self.one_token = ids.shape[1] == 1  # exported for generate's step only
        self.one_row = ids.shape[0] == 1  # torch.onnx fixed the batch to the traced 1

    def start(self, batch: int) -> None:
        """An empty cache for ``batch`` rows."""
        self.cache = {
            a.name: empty_state(a.name, a.shape, batch) for a in self.args if a.name in self.past
        }

    def step(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask, **self.cache}
        if "position_ids" in self.names:
            feed["position_ids"] = positions(mask, ids.shape[1])
        result = dict(zip(self.outputs, self.session.run(None, feed), strict=True))
        self.cache = carry(result, self.past)
        return result["logits"]

    def prefill(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if not self.one_token:
            return self.step(ids, mask)
        columns = [self.step(ids[:, i : i + 1], mask[:, : i + 1]) for i in range(ids.shape[1])]
        return np.concatenate(columns, axis=1)


def generate(decoder: Decoder, ids, mask, steps: int, tokens=None):
    """The prefill from an empty cache, then ``steps`` one-token steps."""
    decoder.start(ids.shape[0])
    logits = [decoder.prefill(ids, mask)]
    chosen = []
    for step in range(steps):
        token = tokens[step] if tokens is not None else logits[-1][:, -1].argmax(-1)
        chosen.append(token)
        mask = np.concatenate([mask, np.ones((mask.shape[0], 1), np.int64)], axis=1)
        logits.append(decoder.step(token.astype(np.int64)[:, None], mask)[:, -1:])
    return logits, chosen


def run_steps(path: Path, ids, mask, steps: int, tokens=None):
    """Logits of the prefill (every position) and of each step; with ``tokens`` None
    each step feeds the variant's own argmax, and the tokens are returned. A graph whose
    batch the export fixed to 1 runs each row alone (the padded row still padded)."""
    decoder = Decoder(path)
    if not decoder.one_row:
        return generate(decoder, ids, mask, steps, tokens)
    rows = [
        generate(
            decoder,
            ids[r : r + 1],
            mask[r : r + 1],
            steps,
            tokens and [t[r : r + 1] for t in tokens],
        )
        for r in range(ids.shape[0])
    ]
    logits = [
        np.concatenate(parts, axis=0) for parts in zip(*(row[0] for row in rows), strict=True)
    ]
    chosen = [np.concatenate(parts) for parts in zip(*(row[1] for row in rows), strict=True)]
    return logits, chosen


class TorchDecoder(Decoder):
    """The family's torch model fed as its graph is (one token a call where the graph
    takes one): the export's own error, the cache classes as exported, a top-k's exact
    ties broken as onnxruntime breaks them (``_topk_ties``)."""

    def __init__(self, family: str, one_token: bool) -> None:
        import _llm_families as fam

        warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated")
        self.model = fam.build(family)
        self.one_token, self.one_row = one_token, False

    def start(self, batch: int) -> None:
        import _kv_states as kv

        self.cache = kv.new_cache(self.model.config)

    def step(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch
        from _topk_ties import onnx_ties

        with torch.no_grad(), onnx_ties():
            out = self.model(
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=torch.from_numpy(positions(mask, ids.shape[1])),
                past_key_values=self.cache,
                use_cache=True,
            )
        self.cache = out.past_key_values
        return out.logits.numpy()


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


def _cell(value: float) -> str:
    return f"{value:.1e}" if value == value else "NaN"  # NaN != NaN


def _calls(row: dict) -> str:
    tokens = "one token a call" if row["one_token"] else "any length"
    return tokens + (", batch fixed to 1: rows alone" if row.get("one_row") else "")


def _ops(counts: dict[str, int]) -> str:
    short = {"GroupQueryAttention": "GQA", "MultiHeadAttention": "MHA"}
    return " + ".join(f"{n} {short.get(op, op)}" for op, n in counts.items()) or "0"


def _name(row: dict) -> str:
    shape = (row.get("steps", STEPS), row.get("padding", PADDING))
    name = row["family"] + (
        f", {shape[0]} steps, padding {shape[1]}" if shape != (STEPS, PADDING) else ""
    )
    return name + (f" (no {', '.join(row['disabled'])})" if row["disabled"] else "")


def markdown(rows: list[dict]) -> str:
    lines = [
        "| family | tokens a call | attention fused of layers | rotary, norms | check "
        "| prefill / steps max abs | logits up to | relative | 1e-4 | rel 1e-5 "
        "| original vs torch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        name = _name(row)
        if "error" in row:
            lines.append(f"| {name} | {row['error']} |" + " |" * 9)
            continue
        fused, diffs, verdict = row["fused"], row["fused_vs_original"], row["verdict"]
        torch_diff = row.get("original_vs_torch")
        torch_cell = (
            f"{_cell(torch_diff['prefill_max_abs'])} / {_cell(torch_diff['decode_max_abs'])}"
            if torch_diff
            else ""
        )
        lines.append(
            f"| {name} | {_calls(row)} "
            f"| {_ops(fused['attention_ops'])} of {row['attention_layers']} "
            f"| {fused['rotary']}, {fused['norms']} | {fused['check']} "
            f"| {_cell(diffs['prefill_max_abs'])} / {_cell(diffs['decode_max_abs'])} "
            f"| {diffs['original_logits_max_abs']:.2g} | {_cell(verdict['relative'])} "
            f"| {'pass' if verdict['abs_pass'] else '**FAIL**'} "
            f"| {'pass' if verdict['rel_pass'] else '**FAIL**'} | {torch_cell} |"
        )
    return "\n".join(lines) + "\n"


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
    import _llm_families as fam

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
    unknown = sorted(set(args.families) - set(unseen.UNSEEN))
    if unknown:
        parser.error(f"unknown families {unknown}: choose from {', '.join(unseen.UNSEEN)}")
    logging.basicConfig(level=logging.WARNING)
    fam.FAMILIES.update({name: spec for name, (spec, _) in unseen.UNSEEN.items()})
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for family in args.families:
        rows.append(family_row(family, args))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
