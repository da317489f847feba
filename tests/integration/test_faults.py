"""The fault matrix of RELIABILITY.md where the other suites leave a gap (map:
docs/reliability.md). Every scenario ends with ``tests/invariants.py`` checking I1-I5 from
independent sources (a witness slot, a GROUP BY on the source, ``pg_replication_slots``),
and every guard it relies on has a negative control: switched off, the checker fails.

Faults are real: fault points (``LAKECDC_FAULT``, ``os._exit(137)``), SIGKILL to the whole
process group of ``lakecdc run`` (the Spark JVM included), ``pg_ctl stop -m immediate``, a
full tmpfs under the lakehouse, deleted checkpoints, OPTIMIZE/VACUUM of bronze under a
running stream, poison rows in bronze. Stages that need Spark run in this process on the
shared test session where no kill is involved (a JVM start costs ~20-40 s here).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from invariants import check_i1, check_i2, check_i3_i4, check_i5, check_invariants
from pipelines.run import Pipeline
from pipelines.setup_source import setup
from tests_support import cli_env, run_cli, wait_for
from truth import Witness
from workload import insert, mixed, transition

pytestmark = [pytest.mark.integration]


# --- shared fixtures and helpers -------------------------------------------------------------

@pytest.fixture
def witness(source_db, config):
    setup(config)
    w = Witness(source_db.dsn, source_db.slot + "_w")
    yield w
    w.drop()


@pytest.fixture
def pipeline(config, spark):
    return Pipeline(config, spark_factory=lambda: spark)


@pytest.fixture
def lakecdc(monkeypatch, capsys):
    """``lakecdc ARGS`` through the real CLI entry point in this process: its exit code and
    stderr, with the test's Spark session instead of a new JVM. ``env`` sets LAKECDC_*
    variables for the one call (fault points, guards)."""
    from pipelines import cli

    for name in [n for n in os.environ if n.startswith("LAKECDC_")]:
        monkeypatch.delenv(name)
    logger = logging.getLogger("lakecdc")

    def run(config, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        flags = ["--source-dsn", config.source_dsn, "--lakehouse", config.lakehouse,
                 "--slot", config.slot]
        capsys.readouterr()
        saved = logger.handlers[:], logger.level, logger.propagate
        with monkeypatch.context() as m:
            for key, value in (env or {}).items():
                m.setenv(key, value)
            try:
                code = cli.main([*flags, *args])
            finally:   # the CLI points lakecdc's log at captured stderr: undo that
                logger.handlers[:], logger.level, logger.propagate = saved
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def one_sentence(code: int, err: str, *phrases: str) -> str:
    """Exit 2 with exactly one ``lakecdc: error:`` line, no traceback; returns the line."""
    lines = [ln for ln in err.splitlines() if ln.startswith("lakecdc: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def slot_confirmed(config) -> int:
    with psycopg.connect(config.source_dsn, autocommit=True) as conn:
        return conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM "
                            "pg_replication_slots WHERE slot_name = %s",
                            [config.slot]).fetchone()[0]


def bronze_version(config) -> int:
    return DeltaTable(config.bronze_path).version()


def dashboard_rows(dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return sorted(conn.execute("SELECT service_id, template_id, notification_type, "
                                   "notification_status, count FROM service_stats").fetchall())


# --- F1, F2, F3, F4, F6, F8: the shipper's fault points and a Postgres crash, end to end ----

SHIPPER_FAULTS = [
    # (fault point, bronze committed before the kill, slot advanced before the kill)
    ("after_peek:1", False, False),             # F1
    ("during_bronze_write:2", False, False),    # F3: files written, no log entry
    ("after_bronze_commit:1", True, False),     # F2
    ("after_advance:1", True, True),            # the step after the whole delivery rule
]


def test_shipper_killed_at_every_fault_point_and_postgres_crashing_end_exact(
        source_db, config, witness, pipeline, pg_cluster, tmp_path):
    """One source, one lakehouse: every fault point of the delivery rule in turn, each
    followed by a restart and I1; then a Postgres crash right after an advance (F4); then a
    drain through silver, gold and the push, and I1-I5. Along the way a transaction stays
    open across two restarts (F6) and COPY / multi-row inserts share LSNs (F8, in
    ``mixed``). Finally the checker itself must see planted damage of each kind."""
    env = cli_env(config)
    purged = Counter()
    long_tx = source_db.connect(autocommit=False)            # F6: open across restarts
    insert(long_tx, random.Random(1), 15)
    for n, (fault, committed, advanced) in enumerate(SHIPPER_FAULTS):
        purged += mixed(source_db.dsn, seed=n, scale=2)
        version, confirmed = bronze_version(config), slot_confirmed(config)
        killed = run_cli(["ship", "--once", "--chunk-mb", "0.02", "--memory-budget-mb", "1"],
                         {**env, "LAKECDC_FAULT": fault})
        assert killed.returncode == 137, killed.stderr[-2000:]
        assert bronze_version(config) == version + committed, fault
        assert (slot_confirmed(config) > confirmed) == advanced, fault
        if n == 1:
            insert(long_tx, random.Random(2), 15)
            long_tx.commit()
        restarted = run_cli(["ship", "--once"], env)
        assert restarted.returncode == 0, restarted.stderr[-2000:]
        check_i1(config.bronze_path, witness, config.tables)
    long_tx.close()

    # F4: the slot's advance is not durable before a checkpoint; after a crash it goes back
    # and re-delivers what bronze holds. The version check drops it.
    purged += mixed(source_db.dsn, seed=10)
    assert run_cli(["ship", "--once"], env).returncode == 0
    advanced_to = slot_confirmed(config)
    pg_cluster.crash()
    pg_cluster.restart()
    assert slot_confirmed(config) < advanced_to, "the crash did not move the slot back"
    purged += mixed(source_db.dsn, seed=11)
    assert run_cli(["ship", "--once"], env).returncode == 0
    check_i1(config.bronze_path, witness, config.tables)

    pipeline.run_once()
    verdict = check_invariants(config, witness, purged)
    assert verdict.bronze_rows > 1000 and verdict.notifications > 500
    assert_the_checker_sees_damage(config, witness, purged, tmp_path)


def assert_the_checker_sees_damage(config, witness, purged, tmp_path):
    """The checker's own negative controls, on a drained, exact pipeline: each kind of
    damage is caught by the invariant that owns it. Lakehouse damage is done to a copy."""
    copy = tmp_path / "damaged"
    shutil.copytree(config.lakehouse, copy)
    bronze = DeltaTable(str(copy / "bronze" / "wal2json_changes"))
    one = bronze.to_pyarrow_table().slice(0, 1)
    write_deltalake(str(copy / "bronze" / "wal2json_changes"), one, mode="append")
    with pytest.raises(AssertionError, match=r"^I1 bronze: .*duplicate"):
        check_i1(str(copy / "bronze" / "wal2json_changes"), witness, config.tables)

    bronze_rows = DeltaTable(config.bronze_path).to_pyarrow_table(
        columns=["commit_lsn", "seq", "data"]).to_pylist()
    silver = copy / "silver" / "changes"
    write_deltalake(str(silver), DeltaTable(str(silver)).to_pyarrow_table().slice(0, 1),
                    mode="append")
    with pytest.raises(AssertionError, match=r"^I2 silver: silver/changes holds 1 duplicate"):
        check_i2(str(copy), bronze_rows)
    with pytest.raises(AssertionError, match=r"^I2 silver: 1 bronze rows neither"):
        check_i2(config.lakehouse, bronze_rows + [dict(commit_lsn=1, seq=0, data="{}")])

    dsn = config.source_dsn
    lost = "00000000-0000-4000-8000-00000000f00d"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at) VALUES "
                     "(%s, gen_random_uuid(), gen_random_uuid(), 'sms', 'created', 'normal', "
                     "now())", [lost])                           # gold is behind the source
        with pytest.raises(AssertionError, match=r"^I3 gold: gold differs"):
            check_i3_i4(config.lakehouse, dsn, config.dashboard, purged)
        conn.execute("DELETE FROM notifications WHERE id = %s", [lost])
        check_i3_i4(config.lakehouse, dsn, config.dashboard, purged)
        conn.execute("UPDATE service_stats SET count = count + 1 WHERE ctid = "
                     "(SELECT min(ctid) FROM service_stats WHERE count > 0)")
        with pytest.raises(AssertionError, match=r"^I4 dashboard"):
            check_i3_i4(config.lakehouse, dsn, config.dashboard, purged)
        # A pipeline that stopped moving the slot while changes wait behind it.
        insert(conn, random.Random(3), 300)
    with pytest.raises(AssertionError, match=r"^I5 liveness: .* lags"):
        check_i5(config, drain=lambda: None)


# --- F10: the lakehouse's disk fills up under bronze ------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 48 MB tmpfs for the lakehouse, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the filesystem is full; delete it to free the space again."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as exc:
            assert exc.errno == 28, exc
    return filler


@pytest.fixture
def on_small_disk(source_db, config, small_disk):
    """The test's source, set up with its lakehouse on the small disk, and a witness."""
    moved = config.with_(lakehouse=str(small_disk / "lakehouse"))
    setup(moved)
    witness = Witness(source_db.dsn, source_db.slot + "_w")
    try:
        yield moved, witness, small_disk
    finally:
        witness.drop()


def test_disk_full_under_bronze_fails_before_the_commit_and_resumes_once_freed(
        source_db, on_small_disk, spark):
    config, witness, disk = on_small_disk
    env = cli_env(config)
    purged = mixed(source_db.dsn, seed=21, scale=4)
    filler = fill(disk)
    version, confirmed = bronze_version(config), slot_confirmed(config)
    full = run_cli(["ship", "--once"], env)
    assert full.returncode not in (0, 137), full.stdout
    assert "No space left on device" in full.stderr, full.stderr[-2000:]
    assert bronze_version(config) == version, "a failed write must not commit"
    assert slot_confirmed(config) == confirmed, "the slot must not move without a commit"

    filler.unlink()
    purged += mixed(source_db.dsn, seed=22)
    resumed = run_cli(["ship", "--once"], env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    check_i1(config.bronze_path, witness, config.tables)
    Pipeline(config, spark_factory=lambda: spark).run_once()
    check_invariants(config, witness, purged)


def test_negative_control_advancing_before_the_commit_loses_changes_on_a_full_disk(
        source_db, on_small_disk):
    """With ``commit_before_advance`` off the slot moves before the write that then fails:
    the changes are gone from the slot, and I1 must say so."""
    config, witness, disk = on_small_disk
    env = {**cli_env(config), "LAKECDC_UNSAFE_DISABLE_GUARDS": "commit_before_advance"}
    mixed(source_db.dsn, seed=23, scale=4)
    filler = fill(disk)
    confirmed = slot_confirmed(config)
    assert run_cli(["ship", "--once"], env).returncode not in (0, 137)
    assert slot_confirmed(config) > confirmed
    filler.unlink()
    one_sentence(*_code_err(run_cli(["ship", "--once"], env)), "past bronze")
    with pytest.raises(AssertionError, match=r"^I1 bronze: .* missing"):
        check_i1(config.bronze_path, witness, config.tables)


def _code_err(result: subprocess.CompletedProcess) -> tuple[int, str]:
    return result.returncode, result.stderr


# --- F12 (and F11/F13 by chance): SIGKILL of the whole `lakecdc run` process group ------------

@pytest.fixture
def traffic(source_db):
    """Notify-like traffic in a thread until the test stops it (``stop()``)."""
    import threading

    from pipelines.traffic import Traffic

    stop = threading.Event()
    load = Traffic(source_db.dsn, seed=31)
    thread = threading.Thread(target=load.run, args=(stop, 0.5, 5))
    thread.start()

    def halt() -> int:
        stop.set()
        thread.join()
        return load.steps
    yield halt
    halt()


@pytest.mark.spark
def test_kill_9_of_the_run_process_group_in_the_gold_batch_and_mid_flight_ends_exact(
        source_db, config, witness, pipeline, traffic, tmp_path):
    """The continuous ``lakecdc run`` under traffic, in its own process group. Cycle 1: the
    driver dies inside a gold batch right after the MERGE commit, before the checkpoint
    (F12); the rest of the group - the Spark JVM and its workers - gets SIGKILL. Cycle 2:
    restarted, and SIGKILLed as a group as soon as the dashboard has moved again, with the
    shipper, silver, gold and the push all busy. Then a drain, and I1-I5."""
    from bronze.ship import Shipper
    from soak import Positions, Soak

    # The fault point is passed in every gold batch, MERGE or not, and a new gold
    # checkpoint's batch 0 is the empty snapshot of silver's creation. With changes in
    # bronze before the run starts, silver's first commit has rows and gold's batch 1
    # merges them: the 2nd pass is right after a real MERGE commit.
    wait_for(lambda: Shipper(config).run(once=True).changes > 0, timeout=60)
    soak = Soak(config, tmp_path)
    crashed = soak.cycle(fault="after_gold_merge:2")
    assert crashed.exit_code == 137
    gold = DeltaTable(config.table_path("gold", "service_stats"))
    last = gold.history(1)[0]
    assert last["operation"] == "MERGE", last
    batch = json.loads(last["userMetadata"])["batch_id"]
    checkpoint = Path(config.lakehouse) / "_checkpoints" / "gold"
    assert (checkpoint / "offsets" / str(batch)).exists()
    assert not (checkpoint / "commits" / str(batch)).exists(), \
        "the kill was meant to land between the MERGE and the checkpoint"

    silver = Positions.read(config).silver
    busy = soak.cycle(until=lambda: Positions.read(config).silver > silver)
    assert "java" in busy.killed, busy.killed              # the JVM died with the group
    assert traffic() > 0
    pipeline.run_once()
    verdict = check_invariants(config, witness)
    assert verdict.notifications > 0
