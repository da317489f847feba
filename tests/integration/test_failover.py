"""Failover and point-in-time restore (F19): detected, refused with the exact commands, and
the documented recovery (docs/failover.md) ends exact. Each test runs its own clusters: a
primary and a physical copy of it made with pg_basebackup."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import psycopg
import pytest

from bronze.ship import Shipper
from gold.deltas import GoldStopped
from pipelines.backfill.rebuild import rebuild_and_push
from infra.localpg import LocalPostgres
from core.config import Config
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, error_line, run_cli, wait_for
from tests.truth import check_gold
from tests.integration.workload import archive, insert, mixed, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "source_schema.sql"


@pytest.fixture
def clusters():
    made: list[LocalPostgres] = []

    def make(copy_of: LocalPostgres | None = None, standby: bool = False) -> LocalPostgres:
        base = Path(tempfile.mkdtemp(prefix="lakecdc-failover-"))
        pg = LocalPostgres(base) if copy_of is None else copy_of.base_backup(base, standby)
        made.append(pg)
        return pg.start()

    yield make
    for pg in made:
        pg.destroy()


def _primary(make, tmp_path) -> tuple[LocalPostgres, Config]:
    primary = make()
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE notify")
    with psycopg.connect(primary.dsn("notify"), autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text())
    config = Config.load(env={}, source_dsn=primary.dsn("notify"), slot="lakecdc",
                         lakehouse=str(tmp_path / "lakehouse"), poll_interval_s=0.05,
                         mirrors=())
    return primary, config


def _traffic(dsn: str, seed: int) -> None:
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        insert(conn, rng, 120)
        transition(conn, 0.5, "delivered")
        archive(conn, 0.3)


def _lsn(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT ({query} - '0/0'::pg_lsn)::bigint").fetchone()[0]


@pytest.mark.long
def test_a_promoted_standby_is_detected_and_the_runbook_restores_exactness(clusters, spark,
                                                                           tmp_path):
    primary, config = _primary(clusters, tmp_path)
    setup(config)
    _traffic(config.source_dsn, 81)
    Pipeline(config, spark_factory=lambda: spark).run_once()
    check_gold(config.lakehouse, config.source_dsn, config.source_dsn)

    standby = clusters(copy_of=primary, standby=True)
    _traffic(config.source_dsn, 82)
    Shipper(config).run(once=True)                 # bronze moves on, on timeline 1
    target = _lsn(primary.dsn(), "pg_current_wal_lsn()")
    wait_for(lambda: _lsn(standby.dsn(), "pg_last_wal_replay_lsn()") >= target, timeout=60)
    primary.crash()                                # the primary dies; the standby takes over
    standby.promote()

    moved = config.with_(source_dsn=standby.dsn("notify"))
    env = cli_env(moved)
    error_line(run_cli(["ship", "--once"], env), "timeline 2",
                         "setup --rebaseline", "backfill rebuild-gold")
    assert run_cli(["setup", "--rebaseline"], env).returncode == 0

    pipeline = Pipeline(moved, spark_factory=lambda: spark)
    _traffic(moved.source_dsn, 83)
    with pytest.raises(GoldStopped, match="re-baselined"):
        pipeline.run_once()                        # counts would miss the gap: refused
    rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where, pipeline.gold_lock)
    check_gold(moved.lakehouse, moved.source_dsn, moved.source_dsn)
    purged = mixed(moved.source_dsn, seed=84)
    pipeline.run_once()
    check_gold(moved.lakehouse, moved.source_dsn, moved.source_dsn, purged)


@pytest.mark.long
def test_a_restored_earlier_copy_is_detected_and_a_new_lakehouse_is_exact(clusters, spark,
                                                                          tmp_path):
    primary, config = _primary(clusters, tmp_path)
    setup(config)
    _traffic(config.source_dsn, 91)
    Pipeline(config, spark_factory=lambda: spark).run_once()
    backup_dir = Path(tempfile.mkdtemp(prefix="lakecdc-restore-"))
    copy = primary.base_backup(backup_dir)          # restored later to this moment
    _traffic(config.source_dsn, 92)
    Shipper(config).run(once=True)                 # bronze now holds LSNs the copy lacks
    primary.stop()
    copy.start()
    try:
        restored = config.with_(source_dsn=copy.dsn("notify"))
        env = cli_env(restored)
        error_line(run_cli(["ship", "--once"], env), "behind what bronze already "
                             "holds", "LAKECDC_LAKEHOUSE")
        error_line(run_cli(["setup", "--rebaseline"], env), "earlier point",
                             "LAKECDC_LAKEHOUSE")

        fresh = restored.with_(lakehouse=str(tmp_path / "lakehouse-after-restore"))
        setup(fresh)
        Pipeline(fresh, spark_factory=lambda: spark).stream(once=True)
        # The restored dashboard holds the old lakehouse's counts: the new gold takes over.
        fresh_env = cli_env(fresh)
        error_line(run_cli(["push", "--once"], fresh_env), "another pipeline", "--take-over")
        took = run_cli(["push", "--once", "--take-over"], fresh_env)
        assert took.returncode == 0, took.stderr[-2000:]
        _traffic(fresh.source_dsn, 93)
        Pipeline(fresh, spark_factory=lambda: spark).run_once()
        check_gold(fresh.lakehouse, fresh.source_dsn, fresh.source_dsn)
    finally:
        copy.destroy()
