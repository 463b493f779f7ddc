# AppBridge: the two set-up commands are `make run` and `make test` (README.md, Quick start).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
DEPS_STAMP := $(VENV)/.deps
TEST_DEPS_STAMP := $(VENV)/.deps-test
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test run test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The dependencies go in before the project is built, because mypyc compiles the media path
# against them (setup.py); deploy/install-deps.py reads them from pyproject.toml.
$(DEPS_STAMP): $(BIN)/python pyproject.toml deploy/install-deps.py
	$(BIN)/python deploy/install-deps.py
	touch $@

$(TEST_DEPS_STAMP): $(DEPS_STAMP)
	$(BIN)/python deploy/install-deps.py test
	touch $@

# setup.py builds the C extensions: appbridge/media/_ratecv.c and _lowpass.c, and with mypyc the
# modules listed in appbridge/compiled.py. A change to any of them rebuilds (a compiled module
# ignores its source).
COMPILED_SOURCES := $(shell sed -n 's/^    "\(appbridge[a-z_.]*\)",$$/\1/p' appbridge/compiled.py | tr . / | sed 's/$$/.py/')
BUILD_INPUTS := pyproject.toml setup.py appbridge/media/_ratecv.c appbridge/media/_lowpass.c appbridge/compiled.py $(COMPILED_SOURCES)

# The one build, with the dependencies already there (no isolated build environment, no second
# install); `python -m appbridge.compiled` fails if it left a listed module interpreted unasked.
$(STAMP): $(DEPS_STAMP) $(BUILD_INPUTS)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/python -m appbridge.compiled
	touch $@

# The test install is the plain one plus the test extras: it never compiles again.
$(TEST_STAMP): $(STAMP) $(TEST_DEPS_STAMP)
	touch $@

install: $(STAMP)

install-test: $(TEST_STAMP)
	bash deploy/install-test-peers.sh

# A current compiled build serves at once; otherwise deploy/first-run.py serves interpreted now and
# compiles in the background, so that a fresh clone answers /healthz within seconds of its deps.
SERVE_ARGS := $(if $(CONFIG),--config $(CONFIG),)
run: $(DEPS_STAMP)
	@if $(MAKE) -s -q $(STAMP) 2>/dev/null; then exec $(BIN)/appbridge serve $(SERVE_ARGS); \
	else exec $(BIN)/python deploy/first-run.py $(STAMP) $(SERVE_ARGS); fi

lint: install-test
	$(BIN)/ruff check appbridge tests bench examples
	$(BIN)/ruff format --check appbridge tests bench examples
	$(BIN)/mypy

# Test files run in TEST_WORKERS processes (pytest-xdist), each file whole in one of them, so
# module fixtures are made once; the tests take their ports from the OS, never fixed ones.
TEST_WORKERS ?= 2
test: install-test lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

bench: install
	$(BIN)/python -m bench.load $(BENCH_ARGS)
	$(BIN)/python -m bench.webrtc_load $(WEBRTC_BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build
	find appbridge -name '*.so' -delete
