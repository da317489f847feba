"""slot → bronze exactly once, on real Postgres 15 + wal2json and real Delta.

Every test compares bronze with a witness slot (tests/truth.py) that saw the same WAL and
is never advanced (the data files' statistics are compared with delta-rs's). Crash tests
run the real CLI in a subprocess and end it with a fault point (os._exit, like kill -9) or
kill -9 itself, then restart and check again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from bronze.records import BRONZE_SCHEMA, UTC_US
from bronze.ship import Shipper
from bronze.table import BronzeTable, Progress, SourceIdentity
from tests.tests_support import cli_env, run_cli, wait_for
from tests.truth import bronze_rows, check_bronze
from tests.integration.workload import (archive, copy_rows, insert, mixed, multi_row_insert,
                                        transition)

pytestmark = pytest.mark.integration


def slot_confirmed(source_db) -> int:
    with source_db.connect() as conn:
        return conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                            "pg_replication_slots WHERE slot_name = %s",
                            [source_db.slot]).fetchone()[0]


def test_mixed_workload_lands_exactly_once_in_small_batches(source_db, config, witness):
    mixed(source_db.dsn)
    totals = Shipper(config.with_(upto_nchanges=50, memory_budget_mb=1)).run(once=True)
    witnessed = witness.transactions()
    check_bronze(config.bronze_path, witnessed)
    assert totals.changes == sum(map(len, witnessed.values())) > 200
    assert totals.batches > 3
    rows = bronze_rows(config.bronze_path)
    assert not any("uncaptured" in r["data"] for r in rows)
    # Slot drained: its position is the end of the last transaction it returned.
    with source_db.connect() as conn:
        lag = conn.execute("SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM "
                           "pg_replication_slots WHERE slot_name = %s", [source_db.slot]
                           ).fetchone()[0]
    assert lag < 1024


def test_rolled_back_work_never_reaches_bronze(source_db, config, witness):
    with source_db.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at) VALUES "
                     "('00000000-0000-0000-0000-00000000dead', gen_random_uuid(), "
                     "gen_random_uuid(), 'sms', 'created', 'normal', now())")
        conn.execute("ROLLBACK")
        insert(conn, random.Random(1), 3)
    Shipper(config).run(once=True)
    check_bronze(config.bronze_path, witness.transactions())
    assert not any("dead" in r["data"] for r in bronze_rows(config.bronze_path))


def test_copy_and_multi_row_inserts_sharing_lsns_are_keyed_apart(source_db, config, witness):
    rng = random.Random(3)
    with source_db.connect() as conn:
        copy_rows(conn, rng, 500)
        multi_row_insert(conn, rng, 300)
    Shipper(config).run(once=True)
    check_bronze(config.bronze_path, witness.transactions())
    rows = bronze_rows(config.bronze_path)
    assert len(rows) == 800
    assert len({r["lsn"] for r in rows}) < len(rows) or len({(r["commit_lsn"], r["seq"])
                                                           for r in rows}) == 800


def test_large_transaction_spills_to_disk_and_lands_whole_in_one_commit(
        source_db, config, witness, tmp_path):
    with source_db.connect() as conn:
        multi_row_insert(conn, random.Random(5), 20_000)
    before = DeltaTable(config.bronze_path).version()
    shipper = Shipper(config.with_(memory_budget_mb=1, chunk_mb=0.25,
                                   spill_dir=str(tmp_path)))
    totals = shipper.run(once=True)
    assert totals.changes == 20_000 and totals.transactions == 1
    assert DeltaTable(config.bronze_path).version() == before + 1
    check_bronze(config.bronze_path, witness.transactions())
    assert not list(tmp_path.glob("lakecdc-spill-*"))          # spill files removed


def test_rows_written_while_the_peek_streams_land_whole_and_in_one_commit(
        source_db, config, witness, tmp_path):
    """Tiny chunks: transactions close in every chunk, many span several, and a large one
    waits spilled to disk while the small ones around it are written."""
    mixed(source_db.dsn, seed=1)
    with source_db.connect() as conn:
        multi_row_insert(conn, random.Random(9), 5000)
    mixed(source_db.dsn, seed=2)
    spill = tmp_path / "spill"
    spill.mkdir()
    before = DeltaTable(config.bronze_path).version()
    totals = Shipper(config.with_(chunk_mb=0.01, memory_budget_mb=1,
                                  spill_dir=str(spill))).run(once=True)
    assert totals.commits == 1 and totals.transactions > 10
    assert DeltaTable(config.bronze_path).version() == before + 1
    check_bronze(config.bronze_path, witness.transactions())
    assert not list(spill.iterdir())


def test_long_open_transaction_committed_after_a_restart_arrives_whole(
        source_db, config, witness):
    rng = random.Random(11)
    long_tx = source_db.connect(autocommit=False)
    try:
        insert(long_tx, rng, 20)                               # open, not committed
        with source_db.connect() as conn:
            insert(conn, rng, 5)
            transition(conn, 0.5, "sending")
        Shipper(config).run(once=True)                         # ships the short ones
        first = len(bronze_rows(config.bronze_path))
        insert(long_tx, rng, 20)
        long_tx.commit()
    finally:
        long_tx.close()
    with source_db.connect() as conn:
        insert(conn, rng, 3)
    Shipper(config).run(once=True)                             # a new shipper: a restart
    witnessed = witness.transactions()
    check_bronze(config.bronze_path, witnessed)
    assert first > 0 and max(len(v) for v in witnessed.values()) == 40


def test_data_files_carry_the_statistics_delta_rs_would_write(tmp_path):
    """Readers prune bronze files by these statistics (Spark, the backfill's bronze
    lookups): ours must be what delta-rs writes for the same rows - nulls, strings and
    timestamps truncated to milliseconds included."""
    rng = np.random.default_rng(1)
    n = 5000
    ts = rng.integers(1_700_000_000_000_000, 1_800_000_000_000_000, n)
    batch = pa.RecordBatch.from_arrays([
        pa.array(["s1"] * n), pa.array(rng.integers(0, 10**12, n)),
        pa.array(rng.integers(0, 10**6, n).astype(np.int32)),
        pa.array(rng.integers(1, 10**6, n).astype(np.int32)),
        pa.array(rng.integers(0, 10**9, n), mask=rng.random(n) < 0.3),
        pa.array(rng.integers(0, 10**12, n)),
        pa.array(ts, pa.int64(), mask=rng.random(n) < 0.3).cast(UTC_US),
        pa.array(rng.choice(["I", "U", "D", "M"], n)),
        pa.array(np.full(n, ts[0]), pa.int64()).cast(UTC_US),
        pa.array([f'{{"n":{i}}}' for i in range(n)])], schema=BRONZE_SCHEMA)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for path in (ours, theirs):
        BronzeTable(path).create(SourceIdentity("s1", "db", "1"), 0)
    BronzeTable(ours).append(iter([batch]), "s1", Progress(1, 1))
    write_deltalake(theirs, pa.RecordBatchReader.from_batches(BRONZE_SCHEMA, [batch]),
                    mode="append")

    def stats(path):
        with open(f"{path}/_delta_log/00000000000000000001.json") as log:
            return [json.loads(json.loads(line)["add"]["stats"]) for line in log
                    if '"add"' in line]
    assert stats(ours) == stats(theirs)
    assert DeltaTable(ours).to_pyarrow_table().equals(pa.Table.from_batches([batch]))


# --- crashes ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["after_peek:1", "during_bronze_write:2",
                                   "after_bronze_commit:1", "after_advance:1"])
def test_shipper_killed_at_each_step_then_restarted_is_exact(source_db, config, witness, fault):
    mixed(source_db.dsn, scale=4)
    env = cli_env(config)
    killed = run_cli(["ship", "--once", "--chunk-mb", "0.02", "--memory-budget-mb", "1"],
                     {**env, "LAKECDC_FAULT": fault})
    assert killed.returncode == 137, killed.stderr
    version = DeltaTable(config.bronze_path).version()
    if fault in ("after_peek:1", "during_bronze_write:2"):
        assert version == 0, "a crash before the commit must leave bronze unchanged"
    restarted = run_cli(["ship", "--once"], env)
    assert restarted.returncode == 0, restarted.stderr
    check_bronze(config.bronze_path, witness.transactions())


def test_kill_9_of_a_running_shipper_under_load_then_restart_is_exact(
        source_db, config, witness):
    env = cli_env(config)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "ship", "--max-changes", "200",
                             "--poll-interval", "0.05"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()

    def load():
        rng = random.Random(21)
        with source_db.connect() as conn:
            while not stop.is_set():
                insert(conn, rng, 20)
                transition(conn, 0.05, rng.choice(["sending", "delivered"]))

    writer = threading.Thread(target=load)
    writer.start()
    try:
        wait_for(lambda: DeltaTable(config.bronze_path).version() >= 3, timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        stop.set()
        writer.join()
    assert run_cli(["ship", "--once"], env).returncode == 0
    check_bronze(config.bronze_path, witness.transactions())


def test_postgres_crash_right_after_an_advance_causes_no_duplicates(
        source_db, config, witness, pg_cluster):
    rng = random.Random(8)
    with source_db.connect() as conn:
        insert(conn, rng, 100)
        archive(conn, 0.5)
    Shipper(config).run(once=True)
    advanced_to = slot_confirmed(source_db)
    pg_cluster.crash()                         # no shutdown checkpoint: the slot may go back
    pg_cluster.restart()
    after_crash = slot_confirmed(source_db)
    with source_db.connect() as conn:
        insert(conn, rng, 10)
    Shipper(config).run(once=True)
    check_bronze(config.bronze_path, witness.transactions())
    # The advance was not flushed before the crash: the slot really went back, and the
    # re-delivered transactions were dropped by bronze's recorded progress.
    assert after_crash < advanced_to


def test_sigterm_stops_a_continuous_shipper_cleanly(source_db, config, witness):
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "ship", "--poll-interval",
                             "0.05"], env=cli_env(config), stderr=subprocess.PIPE, text=True)
    with source_db.connect() as conn:
        insert(conn, random.Random(2), 10)
    wait_for(lambda: len(bronze_rows(config.bronze_path)) == 10, timeout=60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    check_bronze(config.bronze_path, witness.transactions())


def test_an_idle_shipper_peeks_again_only_once_more_wal_is_flushed(source_db, config, witness,
                                                                 monkeypatch):
    """A peek that found nothing is not repeated until the source flushes more WAL: each
    would decode again from the slot's restart point (after a burst, all of the burst). A
    change committed later is still shipped by the next step, and WAL that holds nothing
    for the slot (a checkpoint) costs one more peek."""
    import bronze.ship

    peeks = []
    real_peek = bronze.ship.slots.peek

    def counted(*args, **kwargs):
        peeks.append(1)
        yield from real_peek(*args, **kwargs)

    monkeypatch.setattr(bronze.ship.slots, "peek", counted)
    shipper = Shipper(config)
    conn, progress = shipper.open()

    def step():
        nonlocal progress
        result, progress = shipper._step(conn, progress, once=False)
        return result

    def commit_one(seed: int) -> None:
        with source_db.connect() as source:
            insert(source, random.Random(seed), 1)

    try:
        commit_one(1)
        assert step().changes == 1 and len(peeks) == 1
        assert step().peek_rows == 0 and len(peeks) == 2          # found nothing
        for _ in range(5):
            assert step().changes == 0
        assert len(peeks) == 2                                      # nothing new flushed
        with source_db.connect() as source:
            source.execute("CHECKPOINT")                            # WAL, no transaction
        assert step().peek_rows == 0 and len(peeks) == 3
        assert step().changes == 0 and len(peeks) == 3
        commit_one(2)
        assert step().changes == 1 and len(peeks) == 4
    finally:
        conn.close()
    check_bronze(config.bronze_path, witness.transactions())


# --- negative controls: each guard switched off must let the checker fail -------------------

def test_without_the_version_check_a_restart_after_the_commit_duplicates(
        source_db, config, witness):
    mixed(source_db.dsn)
    env = {**cli_env(config), "LAKECDC_UNSAFE_DISABLE_GUARDS": "version_check"}
    assert run_cli(["ship", "--once"], {**env, "LAKECDC_FAULT": "after_bronze_commit:1"}
                   ).returncode == 137
    assert run_cli(["ship", "--once"], env).returncode == 0
    with pytest.raises(AssertionError, match="duplicate"):
        check_bronze(config.bronze_path, witness.transactions())


def test_advancing_before_the_commit_loses_data_when_killed_between(
        source_db, config, witness):
    mixed(source_db.dsn)
    env = {**cli_env(config), "LAKECDC_UNSAFE_DISABLE_GUARDS": "commit_before_advance"}
    assert run_cli(["ship", "--once"], {**env, "LAKECDC_FAULT": "after_advance:1"}
                   ).returncode == 137
    restarted = run_cli(["ship", "--once"], env)
    # The slot is now ahead of bronze: the shipper notices and refuses...
    assert restarted.returncode == 2 and "past bronze" in restarted.stderr
    # ...but the changes are gone from the slot: the checker must see the loss.
    with pytest.raises(AssertionError, match="missing"):
        check_bronze(config.bronze_path, witness.transactions())
