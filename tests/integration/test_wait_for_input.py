"""A stage started before its input exists (the bundle's ``run`` job before its setup job, a
stage before the one upstream) waits for it with ``--wait-for-input`` and then runs; after
the bound it is refused with the stage's own sentence, exit 2."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

from gold.push import ensure_dashboard_tables
from pipelines.run.inputs import wait_for_input
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, error_line, run_cli, wait_for
from tests.truth import check_gold
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration]


@pytest.mark.spark
def test_run_deployed_before_setup_waits_for_it_then_runs_exact(source_db, config, cli_here,
                                                                said):
    """The bundle's ``run`` job starts when deployed, before anyone ran the setup job: it
    says once what it waits for and runs after setup, exact on a populated source."""
    mixed(source_db.dsn, seed=61)     # before setup: the baseline counts what is left
    done: list = []
    running = threading.Thread(target=lambda: done.append(cli_here(
        ["run", "--once", "--wait-for-input", "forever"], cli_env(config))))
    running.start()
    wait_for(lambda: said.lines or not running.is_alive(), timeout=120)
    assert said.lines == ["run: waiting for `lakecdc setup` (bronze at "
                          f"{config.bronze_path} and the dashboard's tables)"], done
    setup(config)
    running.join(timeout=300)
    assert not running.is_alive() and done[0].returncode == 0, done[0].stderr[-3000:]
    assert said.lines[1:] == []                 # one line, however long it waited
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn)


def test_run_waits_for_the_dashboards_tables_too(source_db, config):
    """Setup creates bronze before it loads the mirrors and creates the dashboard's tables:
    bronze alone is not a finished setup."""
    setup(config)
    assert wait_for_input(config, "run", 0)
    with psycopg.connect(config.dashboard, autocommit=True) as conn:
        conn.execute("DROP TABLE lakecdc_layer_progress")
        assert not wait_for_input(config, "run", 0.2, poll_s=0.1)
        ensure_dashboard_tables(conn)
    assert wait_for_input(config, "run", 0)


@pytest.fixture
def said():
    """What ``pipelines.run.inputs`` logs, as it logs it."""
    logger, lines = logging.getLogger("lakecdc.inputs"), _Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    yield lines
    logger.removeHandler(lines)
    logger.setLevel(level)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


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
