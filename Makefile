# AppBridge: the two set-up commands are `make run` and `make test` (INTERFACES.md §1).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test run test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# setup.py builds the C extensions: appbridge/media/_ratecv.c, and with mypyc the modules listed in
# appbridge/compiled.py. A change to any of them rebuilds (a compiled module ignores its source).
COMPILED_SOURCES := $(shell sed -n 's/^    "\(appbridge[a-z_.]*\)",$$/\1/p' appbridge/compiled.py | tr . / | sed 's/$$/.py/')
BUILD_INPUTS := pyproject.toml setup.py appbridge/media/_ratecv.c appbridge/compiled.py $(COMPILED_SOURCES)

# Installed twice when needed: mypyc compiles against the dependencies, which a fresh venv gets
# only during the first install (that one leaves the media path interpreted; setup.py).
COMPILED_OK := $(BIN)/python -c "import sys; from appbridge import compiled as c; \
	sys.exit(any(not c.is_compiled(m) for m in c.COMPILED_MODULES))"

$(STAMP): $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install -q -e .
	$(COMPILED_OK) || $(BIN)/pip install -q --no-deps -e .
	touch $@

# The test install is a superset of the plain one: it stands for both (no second compile).
$(TEST_STAMP): $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install -q -e '.[test]'
	$(COMPILED_OK) || $(BIN)/pip install -q --no-deps -e .
	touch $@ $(STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)
	bash deploy/install-test-peers.sh

run: install
	$(BIN)/appbridge serve $(if $(CONFIG),--config $(CONFIG),)

lint: install-test
	$(BIN)/ruff check appbridge tests bench examples
	$(BIN)/ruff format --check appbridge tests bench examples
	$(BIN)/mypy

test: install-test lint
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: install
	$(BIN)/python -m bench.load $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build
	find appbridge -name '*.so' -delete
