# The two commands of the README:
#   make demo   start the gateway with a local identity provider and demo users
#   make test   run every check (lint, types, tests)
# Both create the virtual environment (.venv) and install what is needed on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint system-packages node-deps clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

system-packages:
	@scripts/system-packages

node-deps:
	@scripts/node-deps

demo: $(VENV)/.installed system-packages
	$(VENV)/bin/svcgate demo

lint: $(VENV)/.installed
	scripts/lint

test: $(VENV)/.installed system-packages node-deps
	scripts/lint
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) svcgate-data .pytest_cache .mypy_cache .ruff_cache
