"""WAL safety (F9, I5): heartbeats, wal_status alerts, a lost or dropped slot.

All tests run on this module's own cluster with ``max_slot_wal_keep_size = 64MB``, so a
slot can be pushed to ``unreserved`` and ``lost`` in a second (``pg_switch_wal()`` moves the
WAL position a whole 16 MB segment) without touching the session's shared cluster.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

from bronze.heartbeat import MIN_LAG_BYTES, Heartbeat
from bronze.heartbeat import PREFIX as HEARTBEAT_PREFIX
from bronze.session_loss import transient
from bronze.ship import Shipper
from infra.localpg import LocalPostgres
from core.config import Config
from core.errors import UserError
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT, cli_env, run_cli, wait_for
from tests.truth import Witness, check_bronze
from tests.integration.workload import insert

pytestmark = pytest.mark.integration

KEEP = "64MB"
MB = 1 << 20
SLOT_SQL = ("SELECT wal_status, (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, "
            "(restart_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = %s")


@pytest.fixture(scope="module")
def cluster():
    pg = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-walsafety-")),
                       extra_settings={"max_slot_wal_keep_size": f"'{KEEP}'"}).start()
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE other")           # WAL our slot cannot decode
    yield pg
    pg.destroy()


class Db:
    def __init__(self, cluster: LocalPostgres, tmp_path: Path) -> None:
        self.cluster = cluster
        self.name = f"w_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        self.dsn = cluster.dsn(self.name)
        with self.connect() as conn:
            conn.execute((ROOT / "infra/postgres/source_schema.sql").read_text())
            conn.execute("CREATE TABLE uncaptured (x int, pad text)")
        self.config = Config.load(env={}, source_dsn=self.dsn, slot="s_" + self.name[2:],
                                  lakehouse=str(tmp_path / "lakehouse"), poll_interval_s=0.05,
                                  mirrors=())

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True)

    def slot(self) -> tuple[str | None, int, int | None]:
        """(wal_status, lag bytes behind the WAL, restart_lsn) of the shipper's slot."""
        with self.connect() as conn:
            return conn.execute(SLOT_SQL, [self.config.slot]).fetchone()

    def drop(self) -> None:
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", [self.name])
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                          " WHERE database = %s", [self.name])
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@pytest.fixture
def db(cluster, tmp_path):
    d = Db(cluster, tmp_path)
    yield d
    d.drop()


def without_heartbeats(witnessed: dict[int, list[str]]) -> dict[int, list[str]]:
    """The witness slot sees every message; the shipper filters its own heartbeats out
    (they are not data). Drop transactions that hold nothing but heartbeats."""
    return {lsn: rows for lsn, rows in witnessed.items()
            if not all(json.loads(r).get("prefix") == HEARTBEAT_PREFIX for r in rows)}


def start_shipper(config: Config, log: Path, **env) -> tuple[subprocess.Popen, object]:
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "pipelines", "ship", "--poll-interval",
                             "0.05"], env={**cli_env(config), **env}, cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT)
    return proc, out


def other_db_wal(cluster: LocalPostgres, megabytes: int) -> None:
    """WAL in another database: nothing our slot can decode."""
    with psycopg.connect(cluster.dsn("other"), autocommit=True) as conn:
        for _ in range(megabytes):
            conn.execute("SELECT pg_logical_emit_message(false, 'elsewhere', repeat('y', %s))",
                         [MB])


# --- the rules, without a server ----------------------------------------------------------

def test_heartbeat_is_due_only_when_the_slot_stood_still_and_the_wal_ran_ahead():
    hb = Heartbeat(interval_s=30)
    assert not hb.due(10 * MB, slot_moved_at=100, now=120)         # moved 20 s ago
    assert not hb.due(MIN_LAG_BYTES - 1, slot_moved_at=0, now=120)  # nothing worth it
    assert not hb.due(None, slot_moved_at=0, now=120)
    assert hb.due(MIN_LAG_BYTES, slot_moved_at=0, now=120)
    hb.sent_one(lsn=5000, now=120)
    assert not hb.due(10 * MB, slot_moved_at=0, now=130)           # one in flight
    assert not hb.passed(5000) and hb.passed(5040) and not hb.passed(None)
    hb.recorded()
    assert not hb.passed(5040)
    assert not Heartbeat(interval_s=0).due(10 * MB, slot_moved_at=0, now=1e6)


def test_only_a_vanished_session_is_retried():
    assert transient(psycopg.OperationalError("server closed the connection"), None)
    assert transient(psycopg.errors.AdminShutdown("terminating connection"), None)
    assert transient(psycopg.errors.CannotConnectNow("the database system is starting up"),
                      None)
    assert not transient(psycopg.errors.QueryCanceled("statement timeout"), None)
    assert not transient(psycopg.errors.ObjectNotInPrerequisiteState("slot invalidated"),
                          None)
    assert not transient(psycopg.errors.UndefinedObject("slot does not exist"), None)
    assert not transient(OSError("disk full"), None)


@pytest.mark.parametrize("value,ok", [("0", 0.0), ("2.5", 2.5), ("abc", None), ("-1", None)])
def test_heartbeat_interval_from_the_environment(value, ok):
    env = {"LAKECDC_HEARTBEAT_INTERVAL": value}
    if ok is None:
        with pytest.raises(UserError, match="LAKECDC_HEARTBEAT_INTERVAL"):
            Config.load(env=env)
    else:
        assert Config.load(env=env).heartbeat_interval_s == ok
    assert Config.load(env={}).heartbeat_interval_s == 30
    assert Config.load(env={"LAKECDC_RECONNECT_MAX_BACKOFF": "5"}).reconnect_max_backoff_s == 5


# --- heartbeats -------------------------------------------------------------------------

@pytest.mark.parametrize("heartbeat", ["0.2", "0"], ids=["heartbeats", "no_heartbeats"])
def test_heartbeats_keep_the_slot_close_while_only_uncaptured_writes_happen(
        cluster, db, tmp_path, heartbeat):
    config = db.config
    setup(config)
    witness = Witness(db.dsn, config.slot + "_w")
    rng = random.Random(4)
    proc, out = start_shipper(config, tmp_path / "ship.log",
                              LAKECDC_HEARTBEAT_INTERVAL=heartbeat)
    try:
        with db.connect() as conn:
            insert(conn, rng, 5)                      # captured, then idle for a while
            wait_for(lambda: DeltaTable(config.bronze_path).version() >= 1, timeout=60)
            _, _, restart_before = db.slot()
            start, start_at = conn.execute("SELECT pg_current_wal_lsn(), (pg_current_wal_lsn()"
                                           " - '0/0'::pg_lsn)::bigint").fetchone()
            lags, statuses = [], set()
            for i in range(32):                       # ~32 MB: uncaptured + other database
                if i % 2:
                    conn.execute("INSERT INTO uncaptured SELECT g, repeat('x', 900) "
                                 "FROM generate_series(1, 1100) g")
                else:
                    other_db_wal(cluster, 1)
                if i == 16:                           # a running-xacts record to restart at
                    conn.execute("CHECKPOINT")
                status, lag, _ = db.slot()
                lags.append(lag)
                statuses.add(status)
                time.sleep(0.05)                      # the workload's pace, ~10 MB/s
            written = conn.execute("SELECT (pg_current_wal_lsn() - %s::pg_lsn)::bigint",
                                   [start]).fetchone()[0]
            if heartbeat != "0":
                # The last heartbeat brings the slot to the end of the WAL.
                wait_for(lambda: db.slot()[1] < MIN_LAG_BYTES, timeout=30)
            _, _, restart_after = db.slot()
            insert(conn, rng, 5)                      # captured again: exact, whatever came
            wait_for(lambda: (DeltaTable(config.bronze_path).transaction_version(config.slot)
                              or 0) >= max(witness.transactions()), timeout=60)
    finally:
        proc.terminate()
        rc = proc.wait(timeout=60)
        out.close()
        log = (tmp_path / "ship.log").read_text()
    try:
        assert rc == 0, log
        assert written > 30 * MB
        check_bronze(config.bronze_path, without_heartbeats(witness.transactions()))
        print(f"heartbeat={heartbeat}: {written / MB:.1f} MB written elsewhere, slot lag max "
              f"{max(lags) / MB:.1f} MB, wal_status {sorted(statuses)}")
        if heartbeat == "0":
            # Negative control: nothing to advance to, the slot pins everything.
            assert max(lags) >= written - 2 * MB
            # Not one byte of it released (the advance after the first bronze commit may
            # still move restart_lsn a little, short of it).
            assert restart_after < start_at, (restart_before, start_at, restart_after)
        else:
            assert max(lags) < 12 * MB, f"lag reached {max(lags) / MB:.1f} MB"
            assert statuses == {"reserved"}
            # WAL is really released: restart_lsn moved on (to a running-xacts record the
            # heartbeats passed; the checkpoint guarantees there is one).
            assert restart_after > restart_before
    finally:
        witness.drop()


def test_ship_once_sends_one_heartbeat_after_draining_when_the_wal_ran_ahead(cluster, db):
    config = db.config
    setup(config)
    witness = Witness(db.dsn, config.slot + "_w")
    try:
        with db.connect() as conn:
            insert(conn, random.Random(2), 3)
        other_db_wal(cluster, 4)
        Shipper(config.with_(heartbeat_interval_s=0)).run(once=True)
        assert db.slot()[1] >= 4 * MB                 # heartbeats off: still behind
        shipper = Shipper(config)
        shipper.run(once=True)
        assert shipper.heartbeat.sent == 1
        assert db.slot()[1] < 1024                    # one heartbeat: at the end of the WAL
        Shipper(config).run(once=True)                # nothing left: no heartbeat, no commit
        check_bronze(config.bronze_path, without_heartbeats(witness.transactions()))
        assert len(DeltaTable(config.bronze_path).to_pyarrow_table()) == 3
    finally:
        witness.drop()


# --- wal_status: unreserved alerts, lost stops loudly --------------------------------------

def switch_wal_until(cluster: LocalPostgres, db: Db, status: str) -> None:
    """Whole WAL segments, written elsewhere, until the slot reports ``status``."""
    with psycopg.connect(cluster.dsn("other"), autocommit=True) as conn:
        for _ in range(12):
            if db.slot()[0] == status:
                return
            conn.execute("SELECT pg_logical_emit_message(false, 'elsewhere', 'x')")
            conn.execute("SELECT pg_switch_wal()")
    raise AssertionError(f"slot never became {status}: {db.slot()}")


def test_unreserved_alerts_then_lost_stops_with_the_recovery_command(cluster, db, tmp_path):
    config = db.config
    setup(config)
    with db.connect() as conn:
        insert(conn, random.Random(1), 3)
    assert run_cli(["ship", "--once"], cli_env(config)).returncode == 0
    version = DeltaTable(config.bronze_path).version()
    proc, out = start_shipper(config, tmp_path / "ship.log", LAKECDC_HEARTBEAT_INTERVAL="0")
    log = tmp_path / "ship.log"
    alert = f"ALERT slot {config.slot} wal_status=unreserved"
    try:
        switch_wal_until(cluster, db, "unreserved")
        wait_for(lambda: alert in log.read_text(), timeout=30)
        line = next(ln for ln in log.read_text().splitlines() if alert in ln)
        assert f"max_slot_wal_keep_size = {KEEP}" in line and "lag " in line
        assert proc.poll() is None                     # an alert, not a stop
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CHECKPOINT")                # removes the WAL: the slot is lost
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    text = log.read_text()
    assert rc == 2, text
    assert "Traceback" not in text
    assert f"replication slot {config.slot} was invalidated (wal_status=lost)" in text
    assert "lakecdc setup --rebaseline" in text and "never recreates it" in text
    # Loud, not helpful behind the operator's back: bronze and the slot are as they were.
    assert DeltaTable(config.bronze_path).version() == version
    assert db.slot()[0] == "lost"
    # A later start refuses the same way, before touching anything.
    again = run_cli(["ship", "--once"], cli_env(config))
    assert again.returncode == 2 and "was invalidated" in again.stderr, again.stderr
    assert "rebaseline" in again.stderr
    assert DeltaTable(config.bronze_path).version() == version
    assert db.slot()[0] == "lost"


def test_slot_dropped_while_shipping_stops_with_the_recovery_command(cluster, db, tmp_path):
    config = db.config
    setup(config)
    proc, out = start_shipper(config, tmp_path / "ship.log")
    try:
        with db.connect() as conn:
            insert(conn, random.Random(1), 3)
        wait_for(lambda: len(DeltaTable(config.bronze_path).to_pyarrow_table()) == 3,
                 timeout=60)

        def dropped() -> bool:                         # only between two peeks
            with db.connect() as conn:
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", [config.slot])
                    return True
                except psycopg.errors.ObjectInUse:
                    return False

        wait_for(dropped, timeout=30)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    text = (tmp_path / "ship.log").read_text()
    assert rc == 2, text
    assert f"replication slot {config.slot} does not exist" in text
    assert "lakecdc setup --rebaseline" in text
    assert db.slot() is None                           # not recreated
