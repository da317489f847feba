"""F5: the source restarting or becoming unreachable while `lakecdc ship` runs.

The continuous shipper must reconnect by itself (backoff, start-up checks re-run, an
interrupted advance completed) and never advance the slot past a bronze commit. Network
cuts go through a small TCP proxy (tests/proxy.py) between the shipper and Postgres, cut at
a chosen statement: in the middle of a peek's result, before an advance reaches the server,
and after the server ran an advance whose answer never arrives. Restarts stop the test's
own cluster (fast shutdown, then a crash) under load. Each ends with the bronze check
against a witness slot (I1) and the slot back at the end of the WAL (I5); the negative
control advances before committing and must lose data to the same cut.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from deltalake import DeltaTable

from infra.localpg import LocalPostgres
from tests.invariants import check_i5
from core.config import Config
from pipelines.setup.prepare import setup
from tests.proxy import TcpProxy
from tests.tests_support import ROOT, cli_env, run_cli, wait_for
from tests.truth import Witness, check_bronze
from tests.integration.workload import insert, mixed, transition

pytestmark = pytest.mark.integration

SCHEMA_SQL = ROOT / "infra" / "postgres" / "source_schema.sql"


@pytest.fixture
def proxy(pg_cluster):
    p = TcpProxy(pg_cluster.port)
    yield p
    p.close()


class Shipping:
    """`lakecdc ship` (continuous) in a subprocess, its log in a file."""

    def __init__(self, env: dict, log: Path, *args: str) -> None:
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "ship", "--poll-interval", "0.05", *args],
            env=env, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True)

    def text(self) -> str:
        return self.log.read_text()

    def logged(self, pattern: str) -> bool:
        return re.search(pattern, self.text()) is not None

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


def with_password(dsn: str) -> str:
    """The test cluster's DSNs carry its superuser's password (TCP asks for it): it must
    never reach a log line."""
    assert ":" in dsn.split("@", 1)[0].removeprefix("postgresql://"), "no password in DSN"
    return dsn


def bronze_commit_lsn(config: Config) -> int:
    return DeltaTable(config.bronze_path).transaction_version(config.slot) or 0


def drained(config: Config, witness: Witness) -> bool:
    """Bronze holds the newest transaction the witness saw."""
    return bronze_commit_lsn(config) >= max(witness.transactions())


# --- a network cut at a chosen statement --------------------------------------------------

# In the shipper's peek (``bronze.slot.peek_query``) alone: its start-up question to the
# slot (``prints_numbers_as_text``) calls pg_logical_slot_peek_changes too.
PEEK = b"ascii(a.action)"

CUTS = {
    # The client is reading the peek's result when the connection goes.
    "mid_peek": (PEEK, 2, 20_000),
    # Bronze committed, the advance never reaches the server.
    "advance_never_sent": (b"pg_replication_slot_advance", 2, None),
    # The server advanced; the client never learns it did.
    "advance_unanswered": (b"pg_replication_slot_advance", 2, 0),
}


@pytest.mark.parametrize("where", list(CUTS))
def test_network_cut_then_restore_reconnects_and_ends_exact(
        source_db, config, witness, proxy, tmp_path, where):
    mixed(source_db.dsn, scale=2)                      # a backlog of several batches
    marker, nth, reply_bytes = CUTS[where]
    proxy.cut_on(marker, nth, reply_bytes)
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": with_password(proxy.dsn(source_db.dsn))}
    ship = Shipping(env, tmp_path / "ship.log", "--max-changes", "200")
    try:
        wait_for(lambda: proxy.cuts >= 1, timeout=60)
        assert proxy.fired == ("statement dropped" if reply_bytes is None
                               else "cut inside the reply")
        # While cut, the shipper retries (and is refused) instead of giving up.
        wait_for(lambda: proxy.refused >= 1 and ship.logged("reconnect attempt 2"), timeout=30)
        assert ship.proc.poll() is None, ship.text()
        version_while_cut = DeltaTable(config.bronze_path).version()
        proxy.restore()
        cut_at = time.monotonic()
        wait_for(lambda: ship.logged("reconnected to the source"), timeout=30)
        reconnect_s = time.monotonic() - cut_at
        with source_db.connect() as conn:               # more work after the restore
            insert(conn, random.Random(5), 10)
        wait_for(lambda: drained(config, witness), timeout=60)
    finally:
        rc = ship.stop()
    assert rc == 0, ship.text()
    assert "Traceback" not in ship.text()
    assert source_db.cluster.password not in ship.text() and "***@" in ship.text()
    assert DeltaTable(config.bronze_path).version() > version_while_cut
    check_bronze(config.bronze_path, witness.transactions())
    check_i5(config)
    print(f"{where}: reconnected {reconnect_s:.2f}s after the network came back")


def test_without_commit_before_advance_a_cut_after_the_advance_loses_data(
        source_db, config, witness, proxy, tmp_path):
    """Negative control: the same cut as ``advance_unanswered``, with the slot advanced
    before the bronze commit. The shipper stops (the slot is past bronze) and the checker
    sees the loss."""
    mixed(source_db.dsn, scale=2)
    proxy.cut_on(b"pg_replication_slot_advance", 1, 0)
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": proxy.dsn(source_db.dsn),
           "LAKECDC_UNSAFE_DISABLE_GUARDS": "commit_before_advance"}
    ship = Shipping(env, tmp_path / "ship.log", "--max-changes", "200")
    try:
        wait_for(lambda: proxy.cuts >= 1, timeout=60)
        proxy.restore()
        ship.proc.wait(timeout=60)
    finally:
        ship.kill()
    assert ship.proc.returncode == 2, ship.text()
    assert "past bronze" in ship.text()
    with pytest.raises(AssertionError, match="missing"):
        check_bronze(config.bronze_path, witness.transactions())


def test_ship_once_fails_with_one_sentence_when_the_source_goes_away(
        source_db, config, witness, proxy):
    """``--once`` does not retry: its caller decides when to run it again."""
    mixed(source_db.dsn)
    proxy.cut_on(PEEK, 1, 20_000)
    env = {**cli_env(config), "LAKECDC_SOURCE_DSN": with_password(proxy.dsn(source_db.dsn))}
    with source_db.connect() as conn:
        before = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE "
                              "slot_name = %s", [config.slot]).fetchone()[0]
    failed = run_cli(["ship", "--once"], env)
    assert proxy.fired == "cut inside the reply"
    assert failed.returncode == 2, failed.stderr
    assert "lost the source" in failed.stderr and "rerun it" in failed.stderr
    assert "Traceback" not in failed.stderr and source_db.cluster.password not in failed.stderr
    assert DeltaTable(config.bronze_path).version() == 0
    with source_db.connect() as conn:
        assert conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE "
                            "slot_name = %s", [config.slot]).fetchone()[0] == before
    proxy.restore()
    assert run_cli(["ship", "--once"], env).returncode == 0
    check_bronze(config.bronze_path, witness.transactions())


# --- Postgres restarting under load -------------------------------------------------------

@pytest.fixture
def own_cluster():
    pg = LocalPostgres(Path(tempfile.mkdtemp(prefix="lakecdc-restart-"))).start()
    yield pg
    pg.destroy()


class Load:
    """Captured-table traffic that rides out the server going away."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.stop, self.errors = dsn, threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng = random.Random(17)
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=2) as conn:
                    while not self.stop.is_set():
                        insert(conn, rng, 10)
                        transition(conn, 0.02, rng.choice(["sending", "delivered"]))
                        time.sleep(0.01)
            except psycopg.Error:
                self.errors += 1
                self.stop.wait(0.1)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_postgres_restart_and_crash_under_load_shipper_reconnects_exact(own_cluster, tmp_path):
    pg = own_cluster
    with psycopg.connect(pg.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE notify")
    with psycopg.connect(pg.dsn("notify"), autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text())
    config = Config.load(env={}, source_dsn=pg.dsn("notify"),
                         lakehouse=str(tmp_path / "lakehouse"), slot="lakecdc", mirrors=())
    setup(config)
    witness = Witness(config.source_dsn, "lakecdc_w")
    ship = Shipping(cli_env(config), tmp_path / "ship.log", "--max-changes", "500")
    load = Load(config.source_dsn)
    reconnect_s = {}
    try:
        for how in ("stop", "crash"):
            before = DeltaTable(config.bronze_path).version()
            wait_for(lambda: DeltaTable(config.bronze_path).version() >= before + 2, timeout=60)
            reconnected = ship.text().count("reconnected to the source")
            attempts = ship.text().count("reconnect attempt")
            pg.stop() if how == "stop" else pg.crash()
            # The shipper keeps retrying while the server is down (and does not exit).
            wait_for(lambda: ship.text().count("reconnect attempt") >= attempts + 2,
                     timeout=60)
            assert ship.proc.poll() is None, ship.text()
            pg.restart()
            up = time.monotonic()
            wait_for(lambda: ship.text().count("reconnected to the source") > reconnected,
                     timeout=60)
            reconnect_s[how] = time.monotonic() - up
        after = DeltaTable(config.bronze_path).version()
        wait_for(lambda: DeltaTable(config.bronze_path).version() >= after + 2, timeout=60)
    finally:
        load.finish()
    try:
        with psycopg.connect(config.source_dsn, autocommit=True) as conn:
            insert(conn, random.Random(3), 5)
        wait_for(lambda: drained(config, witness), timeout=60)
        rc = ship.stop()
        assert rc == 0, ship.text()
        check_bronze(config.bronze_path, witness.transactions())
        check_i5(config)
        assert load.errors >= 2                      # the load really saw both outages
        print(f"reconnected {reconnect_s['stop']:.2f}s after a restart, "
              f"{reconnect_s['crash']:.2f}s after a crash (from the server accepting again)")
    finally:
        ship.kill()
        witness.drop()
