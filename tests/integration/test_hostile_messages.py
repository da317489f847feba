"""Nothing in the WAL can crash or stall the shipper (docs/security.md, "Logical messages").

Any role that can connect may call ``pg_logical_emit_message`` unless it is revoked, and so
write under lakecdc's own prefixes. Here a role with nothing but CONNECT does: deeply nested,
oversized, escape-laden and invalid-UTF-8 contents, and 20,000 forged HIGH watermarks in one
statement. Each time the shipper keeps going within a bounded time, the slot moves, and the
counts stay exact against the source.
"""

from __future__ import annotations

import logging
import time

import psycopg
import pytest
from deltalake import DeltaTable

from bronze.ship import Shipper
from bronze.shipped import Downstream
from tests.invariants import check_i1, check_i3_i4, check_i5
from pipelines.observe.metrics import PipelineMetrics
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import cli_env, run_cli
from tests.truth import Witness
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration]

PREFIXES = ("lakecdc.backfill", "lakecdc.marker", "lakecdc.heartbeat")


@pytest.fixture
def intruder(source_db):
    """A role with CONNECT on the source and nothing else (EXECUTE on
    pg_logical_emit_message is PUBLIC's by default)."""
    role = f"intruder_{source_db.name}"
    source_db.execute(f'CREATE ROLE "{role}" LOGIN')
    source_db.execute(f'GRANT CONNECT ON DATABASE "{source_db.name}" TO "{role}"')
    dsn = source_db.cluster.dsn(source_db.name, user=role)
    yield dsn
    source_db.execute(f'DROP OWNED BY "{role}"')
    source_db.execute(f'DROP ROLE "{role}"')


def emit(dsn: str, statement: str, params=None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, params)


def ship_within(config, seconds: float) -> str:
    started = time.monotonic()
    result = run_cli(["ship", "--once"], cli_env(config), timeout=seconds + 60)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert took < seconds, f"ship --once took {took:.1f}s"
    return result.stderr


def bronze_texts(config) -> list[str]:
    return DeltaTable(config.bronze_path).to_pyarrow_table(columns=["data"]).column(
        "data").to_pylist()


@pytest.mark.spark
class Reported(Downstream):
    """Each batch into the shipper's metrics, as ``lakecdc ship`` reports it."""

    def __init__(self, metrics) -> None:
        self.metrics = metrics

    def shipped(self, batch, progress) -> None:
        self.metrics.on_ship_batch(batch, progress)


def test_malformed_oversized_and_foreign_messages_are_skipped_and_counts_stay_exact(
        source_db, config, intruder, spark):
    setup(config)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        purged = mixed(source_db.dsn, seed=81)
        for prefix in PREFIXES:
            for transactional in ("true", "false"):
                emit(intruder, f"SELECT pg_logical_emit_message({transactional}, %s, "
                     "repeat('[', 100000))", [prefix])
                emit(intruder, f"SELECT pg_logical_emit_message({transactional}, %s, "
                     "E'{\"run\": \"\\\\ud800\", \"table\": \"a.b\\\\u0000\", "
                     "\"chunk\": 1, \"mark\": \"high\"}')", [prefix])
            emit(intruder, "SELECT pg_logical_emit_message(true, %s, "
                 "repeat('x', 10 * 1024 * 1024))", [prefix])
        emit(intruder, "SELECT pg_logical_emit_message(true, 'another.app', 'x')")
        purged += mixed(source_db.dsn, seed=82)
        log = ship_within(config, 120)
        assert "not well-formed backfill marks" in log
        assert not [t for t in bronze_texts(config) if '"prefix":"another.app"' in t]
        check_i1(config.bronze_path, witness, config.tables)
        Pipeline(config, spark_factory=lambda: spark).run_once()
        check_i3_i4(config.lakehouse, source_db.dsn, config.dashboard, purged)
        check_i5(config)
    finally:
        witness.drop()


@pytest.mark.spark
def test_invalid_utf8_content_is_shipped_as_text_and_counts_stay_exact(
        source_db, config, intruder, spark):
    setup(config)
    purged = mixed(source_db.dsn, seed=83)
    for prefix in PREFIXES:
        emit(intruder, "SELECT pg_logical_emit_message(true, %s, '\\xff00fe80'::bytea)",
             [prefix])
    purged += mixed(source_db.dsn, seed=84)
    ship_within(config, 120)
    texts = [t for t in bronze_texts(config) if "\ufffd" in t]
    assert len(texts) == 2        # backfill and marker; heartbeats are filtered out
    Pipeline(config, spark_factory=lambda: spark).run_once()
    check_i3_i4(config.lakehouse, source_db.dsn, config.dashboard, purged)
    check_i5(config)


def test_twenty_thousand_forged_high_marks_in_one_statement_cost_no_io_per_mark(
        source_db, config, intruder, caplog):
    setup(config)
    with source_db.connect() as conn:
        before = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()[0]
    emit(intruder, "SELECT pg_logical_emit_message(true, 'lakecdc.backfill', json_build_object("
                   "'run', to_char(now(), 'YYYYMMDD\"T\"HH24MISS\"Z-\"') "
                   "|| lpad(to_hex(i), 6, '0'), 'table', 'public.notifications', "
                   "'chunk', 1, 'mark', 'high')::text) FROM generate_series(1, 20000) AS i")
    emit(intruder, "SELECT pg_logical_emit_message(true, 'lakecdc.backfill', '{\"mark\": 1}')")
    metrics = PipelineMetrics(layers=("bronze",))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="lakecdc"):
        Shipper(config, downstream=Reported(metrics)).run(once=True)
    took = time.monotonic() - started
    assert took < 90, f"ship --once took {took:.1f}s"
    assert "20000 HIGH marks of runs that were never staged ignored" in caplog.text
    assert "skipped 1 logical messages" in caplog.text
    # Counted for operators too: every forged mark and the malformed one.
    assert metrics.registry.get_sample_value("lakecdc_ship_skipped_messages_total") == 20001
    with source_db.connect() as conn:
        confirmed = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                                 "pg_replication_slots WHERE slot_name = %s",
                                 [config.slot]).fetchone()[0]
    assert confirmed > before              # the slot moved past the forged marks


def test_the_documented_revoke_leaves_emitting_to_lakecdcs_role(source_db, intruder):
    from pathlib import Path

    sql_dir = Path(__file__).resolve().parents[2] / "infra" / "postgres"
    source_db.execute((sql_dir / "dashboard_schema.sql").read_text())
    source_db.execute((sql_dir / "roles.sql").read_text())  # this database only (dropped after)
    for overload in ("'x'", "'x'::bytea"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            emit(intruder, f"SELECT pg_logical_emit_message(true, 'lakecdc.backfill', "
                           f"{overload})")
        emit(source_db.cluster.dsn(source_db.name, user="lakecdc_replicator"),
             f"SELECT pg_logical_emit_message(true, 'lakecdc.heartbeat', {overload})")
