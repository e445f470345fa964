"""What the written model declares, measured: every corpus graph with and without value_info.

For every model of the corpus cache (``bench/corpus/build.py``) this runs ``autofusion
optimize MODEL --target onnxruntime`` twice, as a user does (``bench_corpus.optimize``):

* ``none``: ``--value-info none``, the check on (the written form is what is checked);
* ``all``: ``--value-info all`` (every inferred intermediate shape declared, what every
  profile wrote before), the check off (same fusions; timing only);

then runs the original and both outputs in onnxruntime at ORT_DISABLE_ALL and
ORT_ENABLE_ALL, CPU, ``--threads`` intra-op threads, on the check's inputs, interleaved
(``bench_tools.latency``: the variant going first rotates; ``--warmup`` untimed then
``--iters`` timed rounds). Per model and level: each variant's median over the
original's (paired by round, with the 95% interval of ``fusion_core.profiling``'s
PairedRatio) and ``none / all`` (below 1: leaving the shapes out is faster).

    python bench/bench_value_info.py [--models NAME ...] [--iters 20] [--warmup 3]
        [--threads 2] [--json value-info.json] [--markdown value-info.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "corpus"))
import bench_corpus  # noqa: E402  (bench/ is not a package)
import bench_tools  # noqa: E402
import meta  # noqa: E402

from autofusion.fusion_core.profiling.stats import paired_ratio  # noqa: E402
from autofusion.fusion_core.validate import random_inputs  # noqa: E402

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL")
FORMS = {"none": ["--value-info", "none"], "all": ["--value-info", "all", "--no-check"]}


def _optimized(src: Path, info: meta.ModelMeta, tmp: Path, args: argparse.Namespace) -> dict:
    records = {}
    for form, extra in FORMS.items():
        folder = tmp / form
        folder.mkdir()
        records[form] = bench_corpus.optimize(
            src, info, "onnxruntime", folder, args.timeout, extra=extra
        )
    return records


def _timed(paths: dict[str, Path], feeds: dict, args: argparse.Namespace) -> dict:
    out = {}
    for level in LEVELS:
        lat = bench_tools.latency(paths, feeds, level, args)
        errors = {k: v["error"] for k, v in lat.items() if "error" in v}
        if errors:
            out[level] = {"error": errors}
            continue
        ratios = {
            f"{form}/original": paired_ratio(lat[form]["times_ms"], lat["original"]["times_ms"])
            for form in FORMS
        }
        ratios["none/all"] = paired_ratio(lat["none"]["times_ms"], lat["all"]["times_ms"])
        out[level] = {
            "median_ms": {k: round(v["median_ms"], 4) for k, v in lat.items()},
            **{k: r.to_dict() for k, r in ratios.items() if r is not None},
        }
    return out


def bench_model(src: Path, info: meta.ModelMeta, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-value-info-{info.name}-") as tmp:
        bench_tools.progress(f"{info.name}: optimize twice")
        records = _optimized(src, info, Path(tmp), args)
        outputs = {form: r.get("output") for form, r in records.items()}
        record = {
            "family": info.family,
            "exporter": info.exporter,
            "check_passed": records["none"].get("check_passed"),
            "fusions": sum((records["none"].get("fusions") or {}).values()),
            "same_fusions": records["none"].get("fusions") == records["all"].get("fusions"),
        }
        if not all(outputs.values()):
            record["error"] = {f: r.get("last_line") for f, r in records.items()}
            return record
        bench_tools.progress(f"{info.name}: latency")
        model = onnx.load(str(src), load_external_data=False)
        feeds = random_inputs(model, seed=0, dims=records["none"].get("dims") or {})
        paths = {"original": src, **{form: Path(p) for form, p in outputs.items()}}
        record["levels"] = _timed(paths, feeds, args)
    return record


def _cell(level: dict, key: str) -> str:
    ratio = level.get(key)
    if not ratio:
        return "-"
    text = f"{ratio['median']:.3f} ({ratio['low']:.3f}-{ratio['high']:.3f})"
    return f"**{text}**" if key != "none/all" and ratio["low"] > 1 else text


def markdown(results: dict) -> str:
    head = "| model | exporter | fusions | check |"
    rule = "|---|---|---:|---|"
    for level in LEVELS:
        short = level.replace("ORT_", "").lower()
        head += f" all/orig {short} | none/orig {short} | none/all {short} |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for name, r in results.items():
        row = f"| {name} | {r['exporter']} | {r['fusions']} | {r['check_passed']} |"
        for level in LEVELS:
            data = (r.get("levels") or {}).get(level) or {}
            cells = [_cell(data, k) for k in ("all/original", "none/original", "none/all")]
            row += "".join(f" {cell} |" for cell in cells)
        lines.append(row)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", help="corpus cache (default ~/.cache/autofusion-corpus)")
    parser.add_argument("--models", nargs="*", help="only these corpus models")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900, help="per optimize call, s")
    parser.add_argument("--json", type=Path, default=Path("value-info.json"))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    return bench_corpus.bench_all(args, bench_model, markdown, _on_onnxruntime)


def _on_onnxruntime(info: meta.ModelMeta) -> bool:
    return "onnxruntime" in info.targets


if __name__ == "__main__":
    sys.exit(main())
