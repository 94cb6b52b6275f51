# The two commands of the README:
#   make demo   start the gateway and its dashboard with a local identity provider and demo users
#   make test   run every check (lint, types, tests)
# Both create the virtual environment (.venv) and install what is needed on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench lint system-packages node-deps web-deps clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

system-packages:
	@scripts/system-packages

node-deps:
	@scripts/node-deps

web-deps:
	@scripts/web-deps

demo: $(VENV)/.installed system-packages web-deps
	$(VENV)/bin/svcgate demo

# The benchmarks (docs/benchmarks.md): every scenario, a table and JSON lines in bench/results/.
bench: $(VENV)/.installed system-packages
	mkdir -p bench/results
	$(PY) -m bench --json bench/results/latest.jsonl --markdown bench/results/latest.md $(BENCH_ARGS)

lint: $(VENV)/.installed
	scripts/lint

test: $(VENV)/.installed system-packages node-deps
	scripts/lint
	scripts/web-check
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) svcgate-data .pytest_cache .mypy_cache .ruff_cache web/.next web/e2e-artifacts
