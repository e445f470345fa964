#!/usr/bin/env bash
# The whole benchmark suite (`make bench`): exports the corpus (cached), compares the
# tools on it (bench_tools.py), then the matcher scaling and the selection strategies.
# Installs nothing: the Makefile target installs the `bench` extra first.
#
#   bench/run_all.sh [RESULTS_DIR]        # default ~/.cache/autofusion-bench/results/<UTC time>
#
# Environment: PYTHON (default .venv/bin/python), BENCH_CORPUS (the corpus folder,
# default ~/.cache/autofusion-bench/corpus), BENCH_TOOLS_ARGS (extra bench_tools.py
# options, e.g. "--threads 4 --iters 50"), BENCH_QUICK=1 (a smoke run: two models,
# three iterations, small scaling sizes; numbers not worth reading).
# Outputs in RESULTS_DIR: tools.md, tools.json, charts/*.png, matcher_scaling.md,
# strategies.md, and a .log of each step's progress.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${1:-$HOME/.cache/autofusion-bench/results/$(date -u +%Y%m%dT%H%M%SZ)}
CORPUS=${BENCH_CORPUS:-$HOME/.cache/autofusion-bench/corpus}
mkdir -p "$OUT"

if [[ "${BENCH_QUICK:-0}" == 1 ]]; then
    MODELS=(--models mobilenetv3_large distilbert)
    TOOLS_ARGS=(--iters 3 --warmup 1 --repeat 1 --tool-warmup 0)
    SCALING_ARGS=(--sizes 1000 10000 --repeat 1 --optimize-repeat 1)
    STRATEGY_ARGS=(--sizes 1000 10000 --repeat 1)
else
    MODELS=()
    TOOLS_ARGS=()
    SCALING_ARGS=()
    STRATEGY_ARGS=()
fi
# shellcheck disable=SC2206  # word splitting of the extra options is intended
TOOLS_ARGS+=(${BENCH_TOOLS_ARGS:-})

echo "results: $OUT"
echo "== corpus ($CORPUS)"
"$PY" bench/make_corpus.py --out "$CORPUS" "${MODELS[@]}" >"$OUT/make_corpus.log" 2>&1 \
    || { tail -20 "$OUT/make_corpus.log"; exit 1; }
grep -v '^\[torch.onnx\]\|torchvision\|Warning\|return cls' "$OUT/make_corpus.log" || true

echo "== tools"
"$PY" bench/bench_tools.py --corpus "$CORPUS" "${MODELS[@]}" "${TOOLS_ARGS[@]}" \
    --json "$OUT/tools.json" --charts "$OUT/charts" >"$OUT/tools.md" 2> >(tee "$OUT/tools.log" >&2)

echo "== matcher scaling"
"$PY" bench/bench_matcher_scaling.py "${SCALING_ARGS[@]}" >"$OUT/matcher_scaling.md"

echo "== strategies"
"$PY" bench/bench_strategies.py "${STRATEGY_ARGS[@]}" >"$OUT/strategies.md"

echo "done: $OUT"
ls -1 "$OUT"
