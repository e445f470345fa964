"""Fusion coverage by family: how many attention, rotary, norm and MoE blocks fuse.

Why: issue 24 ("fusion by meaning") is measured by how much of each family's
attention, rotary embeddings, norms and mixtures of experts autofusion fuses on the
onnxruntime target, whatever the family and the exporter. This runs ``autofusion
optimize MODEL --target onnxruntime --no-check`` (as a user does, a subprocess) on every
LLM model of the corpus (``export_llm.py``) and every encoder of ``export_torch.py``
(its decoders' prefill graphs are the LLM corpus's business), and prints per model
``fused / there`` for each kind:

* there: the meta's expectations, which come from the architecture: an LLM's
  ``expected_ops`` (``_llm_expect.py``: attention, RotaryEmbedding, the norms' ops,
  MoE); an encoder's attention expectation (one per Softmax, ``_torch_expect.py``),
  its RMSNorms, plus the LayerNormalization ops of the original graph (one op already,
  so they count as fused when they survive); ``-`` where the meta counts nothing;
* fused: the fused ops of the optimized graph (``nodes.by_op_after`` of the report),
  capped at what is there.

``--group`` prints one row per family instead, the variants with equal counts in one.

    python bench/corpus/fusion_coverage.py [--cache DIR] [--models NAME ...]
        [--jobs 2] [--group] [--markdown coverage.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import meta
import onnx

KINDS = ("attention", "rotary", "norms", "moe")
FUSED_OPS = {  # kind -> the optimized graph's ops that count as that kind fused
    "attention": ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention"),
    "rotary": ("RotaryEmbedding",),
    "norms": (
        "LayerNormalization",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "RMSNormalization",
    ),
    "moe": ("MoE", "QMoE"),
}
TIMEOUT_S = 900


def selected(models: Path, names: list[str] | None) -> list[tuple[Path, meta.ModelMeta]]:
    """The LLM models and export_torch's encoders (not bench-only), or ``names``."""
    found = []
    for path, info in meta.load_all(models):
        if names is not None:
            keep = info.name in names
        else:
            llm = info.name.startswith("llm_")
            encoder = "attention" in info.source and "LLM decoder" not in info.notes
            keep = (llm or encoder) and not info.bench_only
        if keep:
            found.append((path, info))
    return found


def there(info: meta.ModelMeta, path: Path) -> dict[str, int | None]:
    """How many blocks of each kind the model has, from its meta (None: not counted)."""
    ops = info.expected_ops.get("onnxruntime", {})
    if ops:
        by_kind: dict[str, int | None] = dict.fromkeys(KINDS)
        for key, count in ops.items():
            if key.startswith(meta.OR_LEFT_OUT):
                continue
            names = key.split("|")
            for kind in KINDS:
                if set(names) & set(FUSED_OPS[kind]):
                    by_kind[kind] = count
        return by_kind
    expected = info.expected.get("onnxruntime", {})

    def pattern_count(prefix: str) -> int:
        return sum(v for k, v in expected.items() if k.lstrip("?").startswith(prefix))

    graph = onnx.load(str(path), load_external_data=False).graph
    layer_norms = sum(n.op_type == "LayerNormalization" for n in graph.node)
    return {
        "attention": pattern_count("attention") or None,
        "rotary": pattern_count("rotary_embedding") or None,
        "norms": (layer_norms + pattern_count("rms_norm")) or None,
        "moe": None,
    }


def optimize(path: Path, info: meta.ModelMeta, tmp: Path) -> dict:
    """The optimized graph's op counts (by type, domain dropped), or {"error": ...}."""
    report = tmp / f"{info.name}.json"
    cmd = [str(Path(sys.executable).with_name("autofusion")), "optimize", str(path)]
    cmd += ["-o", str(tmp / f"{info.name}.onnx"), "--target", "onnxruntime", "--no-check"]
    cmd += ["--report", str(report)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    if proc.returncode != 0 or not report.is_file():
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines() or [""]
        internal = [line for line in lines if "internal error" in line]
        return {"error": f"exit {proc.returncode}: {(internal or lines)[-1][:200]}"}
    after = json.loads(report.read_text()).get("nodes", {}).get("by_op_after", {})
    counts: dict[str, int] = {}
    for op, count in after.items():
        op_type = op.rsplit("::", 1)[-1]
        counts[op_type] = counts.get(op_type, 0) + count
    return counts


def row(info: meta.ModelMeta, path: Path, counts: dict) -> dict:
    totals = there(info, path)
    cells = {}
    for kind in KINDS:
        total = totals[kind]
        if "error" in counts:
            cells[kind] = "error" if total else "-"
        elif total is None:
            cells[kind] = "-"
        else:
            fused = sum(counts.get(op, 0) for op in FUSED_OPS[kind])
            cells[kind] = f"{min(fused, total)}/{total}"
    return {"model": info.name, "exporter": info.exporter, **cells, "error": counts.get("error")}


# a model's name is its family's, then the variant (export_llm.KINDS, export_torch's exporters)
VARIANTS = ("optimum_kv", "dynamo_kv", "torchscript", "dynamo")


def grouped(rows: list[dict]) -> list[dict]:
    """One row per family (the name less its variant) and set of equal counts, the
    variants that share them joined in ``exporter``."""
    groups: dict[tuple, list[str]] = {}
    for r in rows:
        family, variant = r["model"].removeprefix("llm_"), r["exporter"]
        for suffix in VARIANTS:
            if family.endswith("_" + suffix):
                family, variant = family.removesuffix("_" + suffix), suffix
                break
        groups.setdefault((family, *(r[k] for k in KINDS)), []).append(variant)
    return [
        {
            "model": key[0],
            "exporter": ", ".join(variants),
            **dict(zip(KINDS, key[1:], strict=True)),
            "error": None,
        }
        for key, variants in groups.items()
    ]


def markdown(rows: list[dict], *, group: bool = False) -> str:
    first = "| family | exporters |" if group else "| model | exporter |"
    lines = [f"{first} attention | rotary | norms | MoE |", "|---|---|---|---|---|---|"]
    for r in grouped(rows) if group else rows:
        cells = " | ".join(r[k] for k in KINDS)
        lines.append(f"| {r['model']} | {r['exporter']} | {cells} |")
    errors = [f"- {r['model']}: {r['error']}" for r in rows if r["error"]]
    return "\n".join(lines + ([""] + errors if errors else [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", help="corpus cache (default ~/.cache/autofusion-corpus)")
    parser.add_argument("--models", nargs="+", metavar="NAME", help="only these models")
    parser.add_argument("--jobs", type=int, default=2, help="optimize processes at a time")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--group", action="store_true", help="one row per family and equal counts")
    args = parser.parse_args(argv)
    models = selected(meta.models_dir(meta.cache_dir(args.cache)), args.models)
    with (
        tempfile.TemporaryDirectory(prefix="autofusion-coverage-") as tmp,
        ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool,
    ):
        counts = list(pool.map(lambda m: optimize(m[0], m[1], Path(tmp)), models))
    rows = [row(info, path, c) for (path, info), c in zip(models, counts, strict=True)]
    table = markdown(rows, group=args.group)
    sys.stdout.write(table)
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
