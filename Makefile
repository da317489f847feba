# The two commands a fresh machine needs (each installs what it needs first):
#   make demo   - lakecdc demo: own local Postgres + wal2json, traffic, the whole pipeline
#   make test   - the test suite on real Postgres + wal2json, Spark + Delta
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test unit system-deps venv clean

system-deps:
	@bash infra/install-system-deps.sh

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

venv: $(VENV)/.installed

test: system-deps venv
	$(PY) -m pytest

unit: venv
	$(PY) -m pytest tests/unit

demo: system-deps venv
	$(VENV)/bin/lakecdc demo

clean:
	rm -rf $(VENV) lakehouse .pytest_cache
