# The two commands a fresh machine needs (each installs what it needs first):
#   make demo   - lakecdc demo: own local Postgres + wal2json, traffic, the whole pipeline
#   make test   - the test suite on real Postgres + wal2json, Spark + Delta
#   make bench  - the benchmarks (python -m bench): docs/benchmarks.md, its JSON and plots
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test unit lint bench system-deps venv clean

system-deps:
	@bash infra/install-system-deps.sh

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

venv: $(VENV)/.installed

# Two workers (one per core) that steal tests from each other, so neither idles while the
# other finishes a long file; Spark is started once first so the Delta jars are resolved
# before the workers start theirs.
test: system-deps venv lint
	$(PY) -c "from core.spark import get_or_create; get_or_create().stop()"
	$(PY) -m pytest -n 2 --dist worksteal --durations=40

# The dependency rule (pyproject.toml, [tool.importlinter]) and pyflakes' checks.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-logo

unit: venv
	$(PY) -m pytest tests/unit

demo: system-deps venv
	$(VENV)/bin/lakecdc demo

# BENCH_ARGS: e.g. --quick, or sizes (--changes 200000 --rate 1000); see python -m bench -h
bench: system-deps venv
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) lakehouse .pytest_cache
