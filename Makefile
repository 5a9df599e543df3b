# The two quick-start commands: `make serve` (install + serve the bundled content) and
# `make test` (install + lint + type-check + docs site + tests; CI runs exactly this through .ci/run).
# Python 3.11 or newer: PY=python3.12 make serve picks another interpreter.
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

.PHONY: install install-test system-packages test-emulators serve test test-tools test-image lint docs
# flowserve with the CPU frameworks the bundled models need (ONNX Runtime, torch, treelite and
# xgboost, DALI) and tritonclient's HTTP client for the README's snippet
install: $(BIN)/python
	$(BIN)/pip install -q -e '.[bundled]'

install-test: $(BIN)/python system-packages test-emulators
	$(BIN)/pip install -q -e '.[test,all,docs]'

# graphviz renders graphs; chromium drives the UI browser test. Best effort: without them (or
# without root) those tests skip and say why.
system-packages:
	@command -v dot >/dev/null && command -v chromium >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium >/dev/null) ; } || \
	  echo "graphviz/chromium not installed: rendering and browser tests will skip"

# Azurite (npm) serves the Azure repository test on 127.0.0.1. Best effort: without it that
# test skips and says why.
test-emulators:
	@command -v azurite-blob >/dev/null || \
	  { command -v npm >/dev/null && npm install -g --no-audit --no-fund azurite@3 >/dev/null 2>&1 ; } || \
	  echo "azurite not installed: the Azure repository test will skip"

serve: install
	$(BIN)/flowserve serve --model-repository model_repository --graphs graphs

lint:
	$(BIN)/ruff check flowserve nodes tests benchmarks
	$(BIN)/ruff format --check flowserve nodes tests benchmarks
	$(BIN)/mypy

# the documentation site (mkdocs.yml, docs/) into build/site; --strict: a broken link, anchor,
# included file or a page missing from the nav fails the build
docs:
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the tests run on TEST_JOBS processes (pytest-xdist; a file's tests stay together, so a module's
# server is started once); the image install replay is `make test-image` (minutes of pip)
TEST_JOBS ?= 3

test: install-test lint docs test-tools
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not image"

test-tools:
	$(BIN)/python benchmarks/perf_analyzer_setup.py || echo "perf_analyzer unavailable: its tests will skip"
	$(BIN)/python benchmarks/triton_setup.py || echo "Triton 2.51 unavailable: tests/nodes/test_remote_triton.py will skip"

# the CPU image's install step (docker/install.sh) into a fresh venv, which must then serve every
# bundled model (tests/deploy/test_image_install.py); CI runs it after make test
test-image: install-test
	$(BIN)/python -m pytest -q -m image tests/deploy
