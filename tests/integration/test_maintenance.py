"""Maintenance as the pipeline's own job (``pipelines.maintain``, docs/operations.md,
"Running for months") on the real pipeline: Postgres with wal2json, Spark with Delta.

- ``lakecdc maintain --once`` compacts and vacuums every table, passes over the tables of a
  writer that is running, and never deletes a file the stopped stream has still to read
  (F17; negative control: with the reader's floor off, the stream finds its files gone);
- ``lakecdc run`` maintains its tables between its batches under traffic, through a kill
  right after a compaction (F25) and kills of its whole process group at random moments
  (F26: maintenance and writers side by side), and I1-I5 hold afterwards.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

from core.config import reader_retention
from core.features import READER_FEATURES, WRITER_FEATURES, unreadable
from core.layout import GOLD, SILVER, mirror_path
from core.maintenance import MAINTENANCE_FILE, UNREFERENCED_HOURS
from pipelines.maintain.once import maintain_once
from pipelines.run.pipeline import Pipeline
from silver.mirrors.tail import TAIL_DIR
from tests.integration.workload import insert, transition
from tests.invariants import check_invariants
from tests.tests_support import cli_env, one_sentence, run_cli, wait_for

pytestmark = [pytest.mark.integration]


@pytest.fixture
def pipeline(config, spark):
    return Pipeline(config, spark_factory=lambda: spark)


def traffic_then_ship(source_db, config, rng: random.Random, rounds: int = 1) -> None:
    """Rounds of inserts and transitions, each shipped: one bronze commit per round."""
    from bronze.ship import Shipper

    for _ in range(rounds):
        with source_db.connect() as conn:
            insert(conn, rng, 20)
            transition(conn, 0.3, rng.choice(["sending", "delivered"]))
        Shipper(config).run(once=True)


def maintained_since(table: str, at: float) -> bool:
    """Whether the table's maintenance record was written after ``at`` (a wall clock)."""
    record = Path(table) / MAINTENANCE_FILE
    try:
        return record.stat().st_mtime > at
    except FileNotFoundError:
        return False


def line_of(reports: list, table: str) -> str:
    """The line ``maintain --once`` prints for ``table``, of ``maintain_once``'s reports."""
    return next(r.line() for r in reports if r.line().startswith(f"{table}:"))


@pytest.mark.spark
@pytest.mark.parametrize("guarded", [True, False], ids=["reader_floor", "negative_control"])
def test_maintain_once_never_deletes_what_the_stopped_stream_has_still_to_read(
        source_db, config, witness, pipeline, guarded):
    """The stream has read bronze up to some version, then stops; bronze moves on by six
    commits. ``maintain --once`` at a retention of 0 hours compacts bronze, but vacuums
    none of it while the stream is behind: the stream then reads every row once, and
    every table is exact. Without the floor (``reader_floor`` guard off) the files are
    deleted and the stream stops on them (what F17's test shows of a careless VACUUM)."""
    rng = random.Random(17)
    traffic_then_ship(source_db, config, rng, 2)
    pipeline.run_once()
    traffic_then_ship(source_db, config, rng, 6)
    bronze_files = len(DeltaTable(config.bronze_path).file_uris())
    reports = maintain_once(config.with_(
        retention_hours=0,
        disabled_guards=frozenset() if guarded else frozenset({"reader_floor"})))
    assert len(DeltaTable(config.bronze_path).file_uris()) < bronze_files
    assert "compacted" in line_of(reports, "bronze")
    if not guarded:
        with pytest.raises(Exception) as failed:
            pipeline.stream(once=True)
        assert "FileNotFound" in str(failed.value) or "does not exist" in str(failed.value), \
            str(failed.value)[:2000]
        return
    assert "nothing vacuumed" in line_of(reports, "bronze"), reports
    pipeline.run_once()
    check_invariants(config, witness)
    # Caught up now (the checker's last shipper commit read too): the next maintenance
    # deletes bronze's compacted-away files, and every table keeps its live files only,
    # once files no commit names are past UNREFERENCED_HOURS (aged here).
    pipeline.run_once()
    aged = time.time() - UNREFERENCED_HOURS * 3600 - 60
    for table in (config.bronze_path, config.table_path(SILVER), config.table_path(GOLD)):
        for data in Path(table).glob("*.parquet"):
            os.utime(data, (aged, aged))
    # (The tables others read keep their removed files as long as their log: a minute here.)
    reports = maintain_once(config.with_(retention_hours=0,
                                       reader_retention=reader_retention("1m")))
    assert "nothing vacuumed" not in line_of(reports, "bronze"), reports
    for table in (config.bronze_path, config.table_path(SILVER), config.table_path(GOLD)):
        live = {Path(u).name for u in DeltaTable(table).file_uris()}
        assert {p.name for p in Path(table).glob("*.parquet")} == live, table
        assert json.loads((Path(table) / MAINTENANCE_FILE).read_text())["at"] > 0
    pipeline.run_once()
    check_invariants(config, witness)


@pytest.mark.spark
def test_maintain_once_passes_over_the_tables_of_a_running_writer(
        source_db, config, pipeline):
    """While a gold writer holds its lock (a running ``stream`` or ``run``), the command
    maintains bronze and the mirrors and passes over silver, quarantine, gold and
    ``_pending``, saying so: their writer maintains them itself. Bad settings end in one
    sentence, exit 2."""
    from pipelines.setup.prepare import setup

    setup(config)
    rng = random.Random(3)
    traffic_then_ship(source_db, config, rng, 3)
    pipeline.run_once()
    with pipeline.gold_lock():
        reports = maintain_once(config)
    for table in ("silver", "quarantine", "gold", "gold_pending"):
        assert "passed over: its writer (stream) is running" in line_of(reports, table), reports
    assert "passed over" not in line_of(reports, "bronze")
    bad = run_cli(["maintain", "--once"], {**cli_env(config), "LAKECDC_RETENTION_HOURS": "a day"})
    one_sentence(bad.returncode, bad.stderr, "LAKECDC_RETENTION_HOURS", "whole number")
    for value, words in (("ten", "whole number"), ("0", "1 or more")):
        bad = run_cli(["maintain", "--once"],
                      {**cli_env(config), "LAKECDC_LOG_RETENTION_MINUTES": value})
        one_sentence(bad.returncode, bad.stderr, "LAKECDC_LOG_RETENTION_MINUTES", words)


@pytest.mark.spark
@pytest.mark.long
def test_run_maintains_its_tables_under_traffic_and_kills_and_stays_exact(
        source_db, config, witness, traffic, tmp_path, pipeline):
    """``lakecdc run`` with maintenance every 2 s and a retention of 0 hours, under
    traffic: first killed right after a compaction's commit (fault point
    ``after_compaction``, F25), then its process group is SIGKILLed at a random moment
    after it maintained silver and gold, twice (maintenance and the writers side by side,
    F26).
    After a drain, I1-I5 hold, bronze, silver and gold were maintained by the run, and
    bronze holds fewer live files than it had commits. Then the log is cleaned and the
    stream resumes after it: I1-I5 again. The drains are ``run --once`` in this process's
    Spark (``pipeline``, as test_faults' kill tests drain): a ``run --once`` does not
    maintain, so what was maintained was maintained by the killed runs, and a JVM start per
    drain proves nothing more."""
    from bronze.ship import Shipper
    from tests.soak import Soak

    env = {"LAKECDC_MAINTAIN_INTERVAL": "2", "LAKECDC_RETENTION_HOURS": "0"}
    Shipper(config).run(once=True)
    soak = Soak(config, tmp_path, env=env)
    crashed = soak.cycle(fault="after_compaction:1")
    assert crashed.exit_code == 137
    # Each kill lands a random 0-6 s after the restarted run has maintained silver and
    # gold once: past its JVM's start, its writers and maintenance side by side (a fixed
    # time from the start lands in the JVM's start-up on a loaded machine, and a run that
    # never maintains them fails here, by the timeout).
    rng = random.Random(26)
    for _ in range(2):
        started = time.time()
        soak.cycle(until=lambda: all(maintained_since(t, started) for t in (
            config.table_path(SILVER), config.table_path(GOLD))), then_s=rng.uniform(0, 6))
    assert traffic() > 0
    pipeline.run_once()
    check_invariants(config, witness)
    for table in (config.bronze_path, config.table_path(SILVER), config.table_path(GOLD)):
        assert (Path(table) / MAINTENANCE_FILE).exists(), f"{table} was never maintained"
    bronze = DeltaTable(config.bronze_path)
    assert len(bronze.file_uris()) < bronze.version() / 2, (len(bronze.file_uris()),
                                                            bronze.version())
    # The log: entries past the log retention go at maintenance (aged an hour here), and
    # the stream resumes from its checkpoint after them, exactly. The log is kept from the
    # start of the stream's newest batch, so one more batch first: on a loaded machine the
    # killed runs may have committed none, and the drain's one batch started at version 0.
    with psycopg.connect(source_db.dsn, autocommit=True) as conn:
        insert(conn, random.Random(35), 5)
    pipeline.run_once()
    for table in (config.bronze_path, config.table_path(SILVER)):
        for entry in (Path(table) / "_delta_log").iterdir():
            os.utime(entry, (time.time() - 3600,) * 2)
    maintain_once(config)
    assert not (Path(config.bronze_path) / "_delta_log" / f"{0:020d}.json").exists()
    with psycopg.connect(source_db.dsn, autocommit=True) as conn:
        insert(conn, random.Random(36), 20)
    pipeline.run_once()
    check_invariants(config, witness)


def delta_tables(lakehouse: str) -> list[str]:
    """Every Delta table under ``lakehouse`` (a mirror's tail inside its mirror's folder)."""
    return sorted(str(log.parent) for log in Path(lakehouse).rglob("_delta_log")
                  if DeltaTable.is_deltatable(str(log.parent)))


def outside_features(path: str) -> list[str]:
    """The features of the table at ``path`` outside lakecdc's sets (``core.features``)."""
    protocol = DeltaTable(path).protocol()
    return sorted(set(protocol.reader_features or ()) - READER_FEATURES
                  | set(protocol.writer_features or ()) - WRITER_FEATURES)


@pytest.mark.spark
def test_run_maintains_mirrors_of_timestamp_columns_without_adding_a_table_feature(
        source_db, config, traffic, spark, monkeypatch):
    """``lakecdc run`` under traffic, the mirror of ``notifications`` with ``updated_at`` a
    ``timestamp`` (without time zone; its enum, numeric, timestamptz and uuid columns as
    they are), every batch of it into its tail (``mirror_merge_s`` 0), maintenance every
    3 s and the log cleaning between maintenances every second (30 s in production).
    Ends when the mirror and its tail were maintained, or when either's protocol gained a
    feature, or when the run stopped. Every table's protocol is then inside lakecdc's
    features, the mirror's and the tail's carry the log retention, and the run never
    stopped on its own."""
    import threading

    import pipelines.maintain.schedule as schedule
    from pipelines.setup.prepare import setup

    monkeypatch.setattr(schedule, "LOG_CLEAN_INTERVAL_S", 1.0)
    with source_db.connect() as conn:
        for table in ("notifications", "notification_history"):
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN updated_at TYPE timestamp")
    config = config.with_(mirrors=("public.notifications",), mirror_interval_s=1.0,
                          mirror_merge_s=0, maintain_interval_s=3)
    setup(config)
    mirror = mirror_path(config.lakehouse, "public.notifications")
    kept = [mirror, f"{mirror}/{TAIL_DIR}"]
    started, stop, failures = time.time(), threading.Event(), []

    def run() -> None:
        try:
            Pipeline(config, spark_factory=lambda: spark).run_continuous(stop)
        except BaseException as exc:        # the run stopped on its own: the test fails
            failures.append(exc)
    runner = threading.Thread(target=run)
    runner.start()
    try:
        wait_for(lambda: not runner.is_alive()
                 or any(outside_features(t) for t in kept if DeltaTable.is_deltatable(t))
                 or all(maintained_since(t, started) for t in kept), timeout=150, interval=0.5)
    finally:
        stop.set()
        runner.join(timeout=120)
    assert traffic() > 0 and not runner.is_alive()
    assert failures == []
    tables = delta_tables(config.lakehouse)
    assert set(kept) <= set(tables), tables
    for table in tables:
        assert outside_features(table) == [] and unreadable(DeltaTable(table)) == [], table
    for table in kept:
        assert maintained_since(table, started), f"{table} was not maintained"
        minutes = config.kept_minutes("mirrors") if table == mirror else \
            config.log_retention_minutes
        assert DeltaTable(table).metadata().configuration["delta.logRetentionDuration"] == \
            f"interval {minutes} minutes", table
