"""The Markdown table of the padded decode's rows (``decode_steps_unseen.py --markdown``):
per family what fused, the logits' differences and the verdicts."""

from __future__ import annotations

from _decode_plan import PADDING, STEPS


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
