"""The documented least-privilege roles (infra/postgres/roles.sql) run the whole pipeline,
and cannot do more than they need."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from bronze.source import ensure_replica_identity
from tests.tests_support import cli_env, run_cli
from tests.truth import check_gold
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SQL = Path(__file__).resolve().parents[2] / "infra" / "postgres"


def _roles(source_db) -> tuple[str, str]:
    with source_db.connect() as admin:
        admin.execute((SQL / "dashboard_schema.sql").read_text())
        admin.execute((SQL / "roles.sql").read_text())
        admin.execute("CREATE TABLE payroll (salary int)")       # not lakecdc's business
    return (source_db.cluster.dsn(source_db.name, user="lakecdc_replicator"),
            source_db.cluster.dsn(source_db.name, user="lakecdc_dashboard"))


def test_roles_run_the_pipeline_exactly_and_nothing_more(source_db, config, cli_here):
    replicator, dashboard = _roles(source_db)
    env = cli_env(config.with_(source_dsn=replicator, dashboard_dsn=dashboard))

    # The replica identity needs the owner: the replicator says so and changes nothing.
    refused = run_cli(["setup"], env)
    assert refused.returncode == 2 and "needs its owner" in refused.stderr, refused.stderr
    with source_db.connect() as owner:
        for table in config.tables:
            ensure_replica_identity(owner, table)

    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-2000:]
    purged = mixed(source_db.dsn, seed=111)
    result = cli_here(["run", "--once"], env)
    assert result.returncode == 0, result.stderr[-2000:]
    check_gold(config.lakehouse, source_db.dsn, source_db.dsn, purged)

    denied = psycopg.errors.InsufficientPrivilege
    with psycopg.connect(replicator, autocommit=True) as conn:
        for statement in ("SELECT * FROM payroll",
                          "DELETE FROM notifications",
                          "INSERT INTO service_stats VALUES ('a','b','c','d',1)",
                          "CREATE TABLE mine (x int)"):
            with pytest.raises(denied):
                conn.execute(statement)
    with psycopg.connect(dashboard, autocommit=True) as conn:
        for statement in ("SELECT * FROM notifications", "SELECT * FROM payroll",
                          "CREATE TABLE mine (x int)",
                          "SELECT pg_create_logical_replication_slot('x', 'wal2json')"):
            with pytest.raises(denied):
                conn.execute(statement)
