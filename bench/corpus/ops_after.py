"""The fused attention, rotary and norm ops of every corpus model, for comparing two
checkouts of autofusion.

Why: a change meant to leave the fused models as they were (one pattern standing for
several, a rule generalized) is shown to do so on every model of the corpus, not only on
the ones its tests name: run this under both checkouts and compare the two files.

    PYTHONPATH=/path/to/before-pkg python bench/corpus/ops_after.py --out /tmp/before.json
    python bench/corpus/ops_after.py --out /tmp/after.json --against /tmp/before.json

Per model (every model whose meta expects something on onnxruntime): the counts of the
ops after fusion whose type names attention, rotary or a norm, the Softmax ops left, and
whether the check passed, for ``optimize(model, OptimizeConfig(target="onnxruntime"))``
(the default profile, selection and check). ``--against`` prints the models that differ
and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import meta

from autofusion.fusion_core import OptimizeConfig, optimize

WATCHED = ("Attention", "Rotary", "Norm", "MoE")


def ops_after(path: Path) -> dict:
    try:
        result = optimize(path, OptimizeConfig(target="onnxruntime"))
    except Exception as exc:  # a model autofusion refuses: recorded, compared as such
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    ops = {
        op: n
        for op, n in sorted(result.ops_after.items())
        if op == "Softmax" or any(word in op for word in WATCHED)
    }
    return {"ops": ops, "check": bool(result.check and result.check.passed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=None, help="corpus cache folder")
    parser.add_argument("--out", type=Path, required=True, help="write the JSON here")
    parser.add_argument("--against", type=Path, help="a file of another checkout's run")
    args = parser.parse_args(argv)
    found = {}
    for path, info in meta.load_all(meta.models_dir(meta.cache_dir(args.cache))):
        if info.expected.get("onnxruntime"):
            found[info.name] = ops_after(path)
    args.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(found)} models -> {args.out}")
    if args.against is None:
        return 0
    before = json.loads(args.against.read_text(encoding="utf-8"))
    differ = sorted(n for n in set(found) | set(before) if found.get(n) != before.get(n))
    for name in differ:
        print(f"{name}: {before.get(name)} -> {found.get(name)}")
    print(f"{len(differ)} of {len(found)} models differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
