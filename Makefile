# The two quick-start commands: `make serve` (install + serve the bundled content) and
# `make test` (install + lint + type-check + tests; CI runs exactly this through .ci/run).
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: install install-test serve test lint
install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q -e '.[test,all]'

serve: install
	$(BIN)/flowserve serve --model-repository model_repository --graphs graphs

lint:
	$(BIN)/ruff check flowserve nodes tests benchmarks
	$(BIN)/mypy

test: install-test lint
	$(BIN)/python -m pytest -q
