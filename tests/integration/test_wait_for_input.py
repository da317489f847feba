"""A stage started before its input table exists (the bundle's jobs start side by side on a
fresh deployment) waits for it with ``--wait-for-input`` and then runs; after the bound it
is refused with the stage's own sentence, exit 2."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT, cli_env, error_line, run_cli
from tests.truth import check_gold
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration]


@pytest.mark.spark
def test_push_started_before_gold_exists_waits_and_then_pushes(source_db, config, spark):
    setup(config)
    purged = mixed(source_db.dsn, seed=61)
    waiting = subprocess.Popen([sys.executable, "-m", "pipelines", "push", "--once",
                                "--wait-for-input", "300"], env=cli_env(config), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = waiting.stderr.readline()       # it says so once it waits: gold is not there
    assert "waiting up to 300s for its input" in first, first
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    pipeline.run_once()                     # creates silver and gold while push waits
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0 and "push: gold version" in out, err[-3000:]
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)


def test_a_missing_input_after_the_wait_is_one_sentence(source_db, config):
    setup(config)
    started = time.monotonic()
    result = run_cli(["push", "--once", "--wait-for-input", "1.5"], cli_env(config))
    error_line(result, "no gold table")
    assert time.monotonic() - started >= 1.5


@pytest.mark.spark
def test_mirrors_wait_for_silver_then_refuse_with_their_sentence(source_db, config, cli_here):
    setup(config)
    started = time.monotonic()
    result = cli_here(["mirrors", "--once", "--wait-for-input", "1.5"], cli_env(config))
    assert "mirrors: waiting up to 2s for its input" in result.stderr, result.stderr[-2000:]
    assert "silver/changes" in error_line(result, "no silver table")
    assert time.monotonic() - started >= 1.5
