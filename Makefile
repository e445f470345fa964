# The two commands of the README. Both set up .venv on first use (Python 3.11+).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# Until the service exists (issue 3), `make run` optimizes the bundled example model.
run: $(STAMP)
	mkdir -p build
	$(BIN)/autofusion optimize tests/data/resnet/resnet50_w8_torchscript.onnx \
		-o build/resnet50_w8_fused.onnx --target onnxruntime --report build/report.json

lint: $(STAMP)
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf build .pytest_cache .ruff_cache
