"""Markdown tables and PNG charts of a ``bench_tools.py`` result (the JSON it writes).

    python bench/_tools_report.py RESULTS.json [MORE.json ...] [--charts DIR]

prints the report of one run, or of runs made in parts (their models together, the
tools in the order they first appear), from the JSON alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import warnings
from pathlib import Path

ALL, DISABLED = "ORT_ENABLE_ALL", "ORT_DISABLE_ALL"


def machine() -> dict:
    """What the numbers ran on (the docs' machine table is filled from this)."""
    cpu, mem = platform.processor() or platform.machine(), None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def header(results: dict) -> str:
    m, v, o = results["machine"], results["versions"], results["options"]
    versions = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    return (
        f"{m['cpu']}, {m['cpus']} CPUs, {m['memory']}, python {m['python']}\n"
        f"{versions}\n"
        f"latency: {o['threads']} intra-op threads, spinning off, {o['warmup']} warm-up + "
        f"{o['iters']} interleaved runs per session; optimize: median of {o['repeat']} "
        f"after {o.get('tool_warmup', 0)} untimed\n"
    )


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "" if value is None or not math.isfinite(value) else format(value, fmt)


def _ops(counts: dict | None, limit: int = 6) -> str:
    if not counts:
        return ""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k.removeprefix('com.microsoft.')} {n}" for k, n in items[:limit])
    return text + (f", +{len(items) - limit} more" if len(items) > limit else "")


def _short(text: str | None, limit: int = 160) -> str:
    text = (text or "").replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reported(info: dict | None) -> dict:
    """The fusion counts a tool returns itself (autofusion, ORT's and onnxscript's)."""
    info = info or {}
    return info.get("fusions") or info.get("fused") or {}


def _lat(record: dict, level: str) -> dict:
    return record.get("latency", {}).get(level, {})


def ratio_cell(lat: dict, compact: bool = False) -> str:
    """``0.691 (0.684-0.699)``: the paired median ratio and its 95% interval; a verdict
    ``slower`` (the whole interval above 1) in bold. ``compact``: the median only."""
    paired = lat.get("paired")
    if not paired:  # a result written before the intervals, or not measured
        return _f(lat.get("paired_ratio"), ".3f")
    text = f"{paired['median']:.3f}"
    if not compact:
        text += f" ({paired['low']:.3f}-{paired['high']:.3f})"
    return f"**{text} slower**" if paired["verdict"] == "slower" else text


def _optimize_cell(record: dict) -> str:
    seconds = _f(record.get("median_s"), ".2f")
    return f"{seconds} (one run)" if record.get("once") and seconds else seconds


def model_table(name: str, model: dict, tools: list[str]) -> str:
    entry, res = model["entry"], model["tools"]
    shapes = ", ".join(f"{k} {v}" for k, v in entry.get("input_shapes", {}).items())
    lines = [
        f"### {name} ({entry['params'] / 1e6:.1f} M params, {entry['nodes']} nodes; {shapes})",
        "",
        "| tool | optimize s | nodes | new op types (count) | fusions the tool reports "
        "| max abs diff | ms @DISABLE_ALL | paired (95%) | ms @ALL | paired (95%) "
        "| create ms @ALL |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tool in ["original", *tools]:
        r = res.get(tool, {})
        if r.get("status") != "ok":
            lines.append(
                f"| {tool} | {r.get('status', '?')}: {_short(r.get('error'))} | | | | | | | | | |"
            )
            continue
        d, a = _lat(r, DISABLED), _lat(r, ALL)
        if tool == "original":  # its ratio to itself says nothing
            d, a = ({k: v for k, v in x.items() if "paired" not in k} for x in (d, a))
        errors = "; ".join(
            f"{lv}: {x['error']}" for lv, x in r.get("latency", {}).items() if "error" in x
        )
        lines.append(
            f"| {tool} | {_optimize_cell(r)} | {r['nodes']} "
            f"| {_ops(r.get('fused_ops'))} | {_ops(_reported(r.get('info')))} "
            f"| {_f(r.get('max_abs_diff'), '.1e')} "
            f"| {_f(d.get('median_ms'))} | {ratio_cell(d)} "
            f"| {_f(a.get('median_ms'))} | {ratio_cell(a)} "
            f"| {_f(a.get('create_ms'), '.0f')}{' (' + errors + ')' if errors else ''} |"
        )
    return "\n".join(lines) + "\n"


def _by_model(results: dict, cell, first: tuple[str, object] | None = None) -> str:
    """Models as rows, tools as columns (``first``: an extra leading column)."""
    tools = list(results["tools"])
    head = ["model", *([first[0]] if first else []), *tools]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for name, model in results["models"].items():
        res = model["tools"]
        cells = [first[1](res)] if first else []
        cells += [cell(res.get(tool, {})) for tool in tools]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _status_or(record: dict, text: str) -> str:
    if record.get("status") == "ok":
        return text
    return record.get("status", "") or ""


def _original_ms(level: str):
    return lambda res: _f(_lat(res.get("original", {}), level).get("median_ms"))


def _vs_peer(record: dict) -> str:
    vs = _lat(record, ALL).get("vs_best_peer")
    if record.get("status") != "ok" or not vs:
        return _status_or(record, "")
    text = f"{vs['median']:.3f} ({vs['low']:.3f}-{vs['high']:.3f}) vs {vs['peer']}"
    return f"**{text} slower**" if vs["verdict"] == "slower" else text


def summary_tables(results: dict) -> str:
    """Models x tools: paired ratios with intervals at both levels, autofusion against the
    best peer, measured selection, optimize seconds, nodes."""
    autofusion = [t for t in results["tools"] if t.startswith("autofusion")]
    out = [
        f"#### Latency at {ALL}: paired median ratio to the original (95% interval); "
        "below 1 is faster, **slower**: the whole interval above 1",
        "",
        _by_model(
            results,
            lambda r: _status_or(r, ratio_cell(_lat(r, ALL))),
            ("original ms", _original_ms(ALL)),
        ),
        f"#### Latency at {DISABLED}: paired median ratio to the original (median only)",
        "",
        _by_model(
            results,
            lambda r: _status_or(r, ratio_cell(_lat(r, DISABLED), compact=True)),
            ("original ms", _original_ms(DISABLED)),
        ),
    ]
    if autofusion:
        out += [
            f"#### autofusion against the best peer at {ALL}: paired ratio to the peer with "
            "the lowest median ratio to the original, same iterations (95% interval)",
            "",
            _by_model({**results, "tools": {t: "" for t in autofusion}}, _vs_peer),
        ]
    out += [
        "#### Optimize time, seconds (median; measured selection: its one run)",
        "",
        _by_model(results, lambda r: _status_or(r, _optimize_cell(r))),
        "#### Nodes after",
        "",
        _by_model(
            results,
            lambda r: _status_or(r, str(r.get("nodes", ""))),
            ("original", lambda res: str(res.get("original", {}).get("nodes", ""))),
        ),
    ]
    measured = measured_tables(results)
    return "\n".join(out) + ("\n" + measured if measured else "")


def _group_text(group: dict) -> str:
    ratio = group.get("ratio")
    how = f"{ratio['median']:.3f} ({ratio['low']:.3f}-{ratio['high']:.3f})" if ratio else "-"
    return f"`{group['group']}` x{group['fusions']} {how}"


def measured_tables(results: dict) -> str:
    """Per model and measured tool: its time, the groups kept and left out (with the
    with/without ratio), the kept model against the original, any fallback or error."""
    lines = [
        "#### Measured selection: time, groups kept / left out, the result against the original",
        "",
        "| model | tool | measured selection s | groups kept | groups left out (with/without) "
        "| final: kept model / original | note |",
        "| --- | --- | ---: | --- | --- | --- | --- |",
    ]
    rows = 0
    for name, model in results["models"].items():
        for tool, record in model["tools"].items():
            m = (record.get("info") or {}).get("measurement")
            if not m:
                if record.get("once") and record.get("status") != "ok":
                    rows += 1
                    lines.append(f"| {name} | {tool} | | | | | {_short(record.get('error'))} |")
                continue
            rows += 1
            groups = m.get("groups") or []
            kept = "; ".join(_group_text(g) for g in groups if g.get("kept")) or "none"
            left = "; ".join(_group_text(g) for g in groups if not g.get("kept")) or "none"
            final = m.get("final")
            final_text = (
                f"{final['median']:.3f} ({final['low']:.3f}-{final['high']:.3f}) "
                f"{final['verdict']}, {final['runs']} runs"
                if final
                else "-"
            )
            note = _short(m.get("fallback") or m.get("error") or "", 200)
            lines.append(
                f"| {name} | {tool} | {_f(m.get('seconds'), '.1f')} | {kept} | {left} "
                f"| {final_text} | {note} |"
            )
    return "\n".join(lines) + "\n" if rows else ""


def charts(results: dict, folder: Path) -> list[Path]:
    """One PNG per model (latency ratios; optimize time, log scale) and two summaries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in results["models"].items():
        res = model["tools"]
        tools = [t for t in results["tools"] if res.get(t, {}).get("status") == "ok"]
        if not tools:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.38 * len(tools) + 1.8))
        y = range(len(tools))
        for offset, level, color in ((-0.2, ALL, "tab:blue"), (0.2, DISABLED, "tab:orange")):
            ratios = [_lat(res[t], level).get("paired_ratio") or 0 for t in tools]
            left.barh([i + offset for i in y], ratios, height=0.4, color=color, label=level)
        left.axvline(1.0, color="black", linewidth=0.8)
        left.set_yticks(list(y), tools)
        left.invert_yaxis()
        left.set_xlabel("latency / original at the same level (paired median)")
        left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8)
        secs = [res[t].get("median_s") or float("nan") for t in tools]
        right.barh(list(y), secs, color="tab:green")
        right.set_xscale("log")
        right.set_yticks(list(y), [""] * len(tools))
        right.invert_yaxis()
        right.set_xlabel("optimize time, s (log)")
        fig.suptitle(f"{name}: {results['options']['threads']} threads, batch 1")
        fig.tight_layout()
        path = folder / f"tools_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    written += _heatmap(
        results,
        folder,
        plt,
        "paired latency ratio @ORT_ENABLE_ALL",
        lambda r: _lat(r, ALL).get("paired_ratio"),
        "tools_latency_all.png",
    )
    written += _heatmap(
        results,
        folder,
        plt,
        "optimize time, s",
        lambda r: r.get("median_s"),
        "tools_optimize_time.png",
        log=True,
    )
    return written


def _heatmap(results, folder, plt, title, value, filename, log=False) -> list[Path]:
    import numpy as np
    from matplotlib.colors import LogNorm, TwoSlopeNorm

    models, tools = list(results["models"]), list(results["tools"])
    grid = np.full((len(tools), len(models)), np.nan)
    for j, m in enumerate(models):
        for i, t in enumerate(tools):
            r = results["models"][m]["tools"].get(t, {})
            v = value(r) if r.get("status") == "ok" else None
            grid[i, j] = v if v is not None else np.nan
    if np.isnan(grid).all():
        return []
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(models) + 4), 0.4 * len(tools) + 1.8))
    finite = grid[np.isfinite(grid)]
    if log:
        norm, cmap = LogNorm(max(finite.min(), 1e-3), max(finite.max(), 1e-2)), "viridis"
    else:
        lo, hi = min(finite.min(), 0.99), max(finite.max(), 1.01)
        norm, cmap = TwoSlopeNorm(1.0, lo, hi), "RdYlGn_r"
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, norm=norm)
    for i in range(len(tools)):
        for j in range(len(models)):
            text = "-" if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right")
    ax.set_yticks(range(len(tools)), tools)
    ax.set_title(f"{title}\n(-: failed or n/a)", fontsize=10)
    bar = fig.colorbar(image, ax=ax)
    if not log:
        ticks = sorted({round(lo, 2), 1.0, round(hi, 2)})
        bar.set_ticks(ticks, labels=[f"{t:.2f}" for t in ticks])
    with warnings.catch_warnings():  # colorbar of a TwoSlopeNorm: a harmless nan in layout
        warnings.simplefilter("ignore", RuntimeWarning)
        fig.tight_layout()
    path = folder / filename
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def merge(parts: list[dict]) -> dict:
    """Runs made in parts as one result: the first part's machine, versions and options,
    every part's models and tools."""
    merged = {**parts[0], "tools": {}, "models": {}}
    for part in parts:
        merged["tools"].update(part["tools"])
        merged["models"].update(part["models"])
    return merged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="bench_tools.py --json files")
    parser.add_argument("--charts", type=Path, help="save PNG charts in this folder")
    args = parser.parse_args(argv)
    results = merge([json.loads(path.read_text()) for path in args.results])
    tools = list(results["tools"])
    print(header(results))
    for name, model in results["models"].items():
        print(model_table(name, model, tools))
    print(summary_tables(results))
    if args.charts:
        charts(results, args.charts)


if __name__ == "__main__":
    main()
