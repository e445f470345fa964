"""Markdown tables and PNG charts of a ``bench_tools.py`` result (the JSON it writes)."""

from __future__ import annotations

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


def model_table(name: str, model: dict, tools: list[str]) -> str:
    entry, res = model["entry"], model["tools"]
    shapes = ", ".join(f"{k} {v}" for k, v in entry.get("input_shapes", {}).items())
    lines = [
        f"### {name} ({entry['params'] / 1e6:.1f} M params, {entry['nodes']} nodes; {shapes})",
        "",
        "| tool | optimize s | nodes | new op types (count) | fusions the tool reports "
        "| max abs diff "
        "| ms @DISABLE_ALL | ratio | paired | ms @ALL | ratio | paired | create ms @ALL |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tool in ["original", *tools]:
        r = res.get(tool, {})
        if r.get("status") != "ok":
            lines.append(
                f"| {tool} | {r.get('status', '?')}: {_short(r.get('error'))} | | | | | | | | | | |"
            )
            continue
        d, a = _lat(r, DISABLED), _lat(r, ALL)
        errors = "; ".join(
            f"{lv}: {x['error']}" for lv, x in r.get("latency", {}).items() if "error" in x
        )
        lines.append(
            f"| {tool} | {_f(r.get('median_s'), '.3f')} | {r['nodes']} "
            f"| {_ops(r.get('fused_ops'))} | {_ops(_reported(r.get('info')))} "
            f"| {_f(r.get('max_abs_diff'), '.1e')} "
            f"| {_f(d.get('median_ms'))} | {_f(d.get('ratio'), '.3f')} "
            f"| {_f(d.get('paired_ratio'), '.3f')} | {_f(a.get('median_ms'))} "
            f"| {_f(a.get('ratio'), '.3f')} | {_f(a.get('paired_ratio'), '.3f')} "
            f"| {_f(a.get('create_ms'), '.0f')}{' (' + errors + ')' if errors else ''} |"
        )
    return "\n".join(lines) + "\n"


def _grid(results: dict, cell) -> str:
    models = list(results["models"])
    tools = list(results["tools"])
    lines = ["| tool | " + " | ".join(models) + " |", "| --- |" + " ---: |" * len(models)]
    for tool in tools:
        cells = [cell(results["models"][m]["tools"].get(tool, {})) for m in models]
        lines.append(f"| {tool} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _status_or(record: dict, text: str) -> str:
    return text if record.get("status") == "ok" else record.get("status", "")


def summary_tables(results: dict) -> str:
    """Tools x models: paired latency ratio at both levels, optimize seconds."""
    out = []
    for level in (ALL, DISABLED):
        out += [
            f"#### Latency at {level}, median of paired ratios to the original (below 1: faster)",
            "",
            _grid(
                results,
                lambda r, lv=level: _status_or(r, _f(_lat(r, lv).get("paired_ratio"), ".3f")),
            ),
        ]
    out += [
        "#### Optimize time, seconds (median)",
        "",
        _grid(results, lambda r: _status_or(r, _f(r.get("median_s"), ".3f"))),
    ]
    out += [
        "#### Nodes after (original first)",
        "",
        _grid(results, lambda r: _status_or(r, str(r.get("nodes", "")))),
    ]
    return "\n".join(out)


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
