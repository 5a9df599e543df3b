# The two quick-start commands: `make serve` (install + serve the bundled content) and
# `make test` (install + lint + type-check + tests; CI runs exactly this through .ci/run).
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: install install-test system-packages serve test lint
install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python system-packages
	$(BIN)/pip install -q -e '.[test,all]'

# graphviz renders graphs; chromium drives the UI browser test. Best effort: without them (or
# without root) those tests skip and say why.
system-packages:
	@command -v dot >/dev/null && command -v chromium >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium >/dev/null) ; } || \
	  echo "graphviz/chromium not installed: rendering and browser tests will skip"

serve: install
	$(BIN)/flowserve serve --model-repository model_repository --graphs graphs

lint:
	$(BIN)/ruff check flowserve nodes tests benchmarks
	$(BIN)/mypy

test: install-test lint
	$(BIN)/python benchmarks/perf_analyzer_setup.py || echo "perf_analyzer unavailable: its tests will skip"
	$(BIN)/python -m pytest -q
