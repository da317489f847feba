"""Shared fixtures: one real Postgres 15 + wal2json cluster per test session, a fresh
database, slot name and lakehouse per test, and one local Spark session with Delta.

Every slot a test creates is dropped in teardown (a forgotten slot pins WAL). Set
``LAKECDC_TEST_PG_DIR`` to keep the cluster somewhere specific.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from infra.localpg import LocalPostgres
from core.config import Config

SCHEMA_SQL = Path(__file__).resolve().parents[1] / "infra" / "postgres" / "source_schema.sql"


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


@pytest.fixture
def source_db(pg_cluster):
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    db = SourceDb(pg_cluster, name, slot=f"s_{name[2:]}")
    with db.connect() as conn:
        conn.execute(SCHEMA_SQL.read_text())
    yield db
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as admin:
        if pg_cluster.data_dir.joinpath("postmaster.pid").exists():
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                          "WHERE database = %s AND active_pid IS NULL", [name])
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def config(source_db, tmp_path) -> Config:
    """Configuration pointing at the test's database, slot and lakehouse. Without mirrors
    (``LAKECDC_MIRRORS=none``): they have tests of their own (``test_mirrors.py``,
    ``test_other_tables.py``, the demo), and a mirror query in every ``run --once`` of the
    other tests would add minutes to the suite without testing anything new."""
    return Config.load(env={}, source_dsn=source_db.dsn, lakehouse=str(tmp_path / "lakehouse"),
                       slot=source_db.slot, poll_interval_s=0.05, mirrors=())


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
    from pipelines.setup_source import setup
    from tests.truth import Witness

    setup(config)
    w = Witness(source_db.dsn, source_db.slot + "_w")
    yield w
    w.drop()


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
