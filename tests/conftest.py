"""Shared fixtures: one real Postgres 15 + wal2json cluster per test session, a fresh
database, slot name and lakehouse per test, and one local Spark session with Delta.

Every slot a test creates is dropped in teardown (a forgotten slot pins WAL). Set
``LAKECDC_TEST_PG_DIR`` to keep the cluster somewhere specific.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from infra.localpg import LocalPostgres
from core.config import Config

SCHEMA_SQL = Path(__file__).resolve().parents[1] / "infra" / "postgres" / "source_schema.sql"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` (minutes each on 2 cores) first on both workers. pytest-xdist's
    ``worksteal`` gives each of the two workers one half of this order and an idle worker
    steals from the end of the other's: so each half starts with half of the long tests, and
    the run ends on short ones instead of one long test while the other worker idles."""
    long = [item for item in items if item.get_closest_marker("long")]
    short = [item for item in items if not item.get_closest_marker("long")]
    first = max(0, len(items) // 2 - len(long[0::2]))
    items[:] = long[0::2] + short[:first] + long[1::2] + short[first:]


@pytest.fixture(scope="session")
def pg_cluster():
    base = os.environ.get("LAKECDC_TEST_PG_DIR") or tempfile.mkdtemp(prefix="lakecdc-testpg-")
    cluster = LocalPostgres(Path(base)).start()
    yield cluster
    cluster.destroy()


@dataclass
class SourceDb:
    """A fresh database with the Notify-like schema, and names unique to one test."""

    cluster: LocalPostgres
    name: str
    slot: str

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.name)

    def connect(self, **kw) -> psycopg.Connection:
        return psycopg.connect(self.dsn, **{"autocommit": True, **kw})

    def execute(self, query, params=None) -> None:
        with self.connect() as conn:
            conn.execute(query, params)


def fresh_database(cluster: LocalPostgres) -> Iterator[SourceDb]:
    """A new database on ``cluster`` with the Notify-like schema, for one test; dropped after
    it, with its slots (a fixture's body: ``yield from``)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    db = SourceDb(cluster, name, slot=f"s_{name[2:]}")
    with db.connect() as conn:
        conn.execute(SCHEMA_SQL.read_text())
    yield db
    with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
        if cluster.data_dir.joinpath("postmaster.pid").exists():
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                          "WHERE database = %s AND active_pid IS NULL", [name])
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def source_db(pg_cluster):
    yield from fresh_database(pg_cluster)


@pytest.fixture
def config(source_db, tmp_path) -> Config:
    """Configuration pointing at the test's database, slot and lakehouse. Without mirrors
    (``LAKECDC_MIRRORS=none``): they have tests of their own (``test_mirrors.py``,
    ``test_other_tables.py``, the demo), and a mirror query in every ``run --once`` of the
    other tests would add minutes to the suite without testing anything new. A continuous
    mirrors' query starts a batch every 5 s (``LAKECDC_MIRROR_INTERVAL``, through
    ``cli_env`` too), so tests that wait for it are not paced by the default."""
    return Config.load(env={}, source_dsn=source_db.dsn, lakehouse=str(tmp_path / "lakehouse"),
                       slot=source_db.slot, poll_interval_s=0.05, mirrors=(),
                       mirror_interval_s=5.0)


@pytest.fixture(scope="session")
def spark():
    from core.spark import get_or_create

    session = get_or_create("lakecdc-tests")
    yield session
    session.stop()


@pytest.fixture
def witness(source_db, config):
    """A second slot on the source, created after ``setup``: the independent truth of what
    the WAL held (``truth.Witness``)."""
    from pipelines.setup.prepare import setup
    from tests.truth import Witness

    setup(config)
    w = Witness(source_db.dsn, source_db.slot + "_w")
    yield w
    w.drop()


@pytest.fixture
def cli_here(monkeypatch, capsys, spark):
    """``run_cli``'s twin in this process: ``lakecdc ARGS`` through the real CLI entry point,
    with ``env``'s variables for the one call and the test's Spark session instead of a new
    JVM (a fresh one costs 20-40 s here before its first batch is done). For every call
    whose subject is not the process itself: a kill, a signal, its exit, its own JVM."""
    from pipelines import cli

    for name in [n for n in os.environ if n.startswith("LAKECDC_")]:
        monkeypatch.delenv(name)
    logger = logging.getLogger("lakecdc")

    def run(args: list[str], env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        capsys.readouterr()
        saved = logger.handlers[:], logger.level, logger.propagate
        with monkeypatch.context() as m:
            for key in [n for n in os.environ if n.startswith("LAKECDC_")]:
                m.delenv(key)
            for key, value in (env or {}).items():
                if os.environ.get(key) != value:
                    m.setenv(key, value)
            try:
                code = cli.main(list(args))
            finally:   # the CLI points lakecdc's log at captured stderr: undo that
                logger.handlers[:], logger.level, logger.propagate = saved
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["lakecdc", *args], code, out.out, out.err)
    return run


@pytest.fixture
def lakecdc(cli_here):
    """``lakecdc ARGS`` for ``config``'s source, lakehouse and slot, in this process (as
    ``cli_here``): its exit code, stdout and stderr. ``env`` sets LAKECDC_* variables for
    the one call (fault points, guards)."""

    def run(config, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        flags = ["--source-dsn", config.source_dsn, "--lakehouse", config.lakehouse,
                 "--slot", config.slot]
        done = cli_here([*flags, *args], env)
        return done.returncode, done.stdout, done.stderr
    return run


@pytest.fixture
def traffic(source_db):
    """Notify-like traffic in a thread; calling the fixture's value stops it and returns
    the number of steps done."""
    import threading

    from pipelines.demo.traffic import Traffic

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
