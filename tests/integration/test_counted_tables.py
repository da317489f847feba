"""The counted tables are configuration (``LAKECDC_NOTIFICATIONS_TABLE`` /
``LAKECDC_HISTORY_TABLE``), schema-qualified everywhere: gold's rules, the baseline, the
truth of ``verify``. With both tables in another schema and same-named decoys in ``public``
receiving other traffic, the whole chain stays exact; a counted table that is not captured
is refused with one sentence before anything changes."""

from __future__ import annotations

import random
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.invariants import check_invariants
from core.config import Config
from tests.tests_support import cli_env, error_line, run_cli
from tests.truth import Witness
from tests.integration.workload import insert, mixed, transition

pytestmark = [pytest.mark.integration]

NOTIFY = "notify.notifications,notify.notification_history"
SCHEMA_SQL = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "source_schema.sql"


def in_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema``: unqualified names resolve there."""
    return f"{dsn}?options={quote(f'-c search_path={schema}')}"


def notify_env(config: Config) -> dict[str, str]:
    return {**cli_env(config), "LAKECDC_TABLES": NOTIFY,
            "LAKECDC_NOTIFICATIONS_TABLE": "notify.notifications",
            "LAKECDC_HISTORY_TABLE": "notify.notification_history"}


@pytest.fixture
def notify_schema(source_db):
    """The Notify-like tables again in schema ``notify``, with rows before setup; the
    ``public`` ones (from the fixture) are the decoys."""
    with source_db.connect() as conn:
        conn.execute("CREATE SCHEMA notify")
    with psycopg.connect(in_schema(source_db.dsn, "notify"), autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text())
        rng = random.Random(31)
        insert(conn, rng, 200)
        transition(conn, 0.5, "sending")
    with source_db.connect() as conn:                      # decoy rows before setup too
        insert(conn, random.Random(32), 150)
    return in_schema(source_db.dsn, "notify")


@pytest.mark.spark
@pytest.mark.long
def test_counted_tables_in_another_schema_are_exact_beside_decoys_in_public(
        source_db, config, notify_schema, cli_here):
    env = notify_env(config)
    setup = run_cli(["setup"], env)
    assert setup.returncode == 0, setup.stderr[-3000:]
    witness = Witness(source_db.dsn, source_db.slot + "_w", NOTIFY)
    try:
        purged = mixed(notify_schema, seed=33)
        mixed(source_db.dsn, seed=34)                       # decoy traffic, never counted
        done = cli_here(["run", "--once"], env)
        assert done.returncode == 0, done.stderr[-3000:]
        captured = config.with_(tables=tuple(NOTIFY.split(",")),
                                notifications_table="notify.notifications",
                                history_table="notify.notification_history")
        check_invariants(captured, witness, purged, schema="notify")
        verified = cli_here(["verify"], env)
        assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    finally:
        witness.drop()


def test_a_counted_table_that_is_not_captured_is_refused_before_anything_changes(
        source_db, config, cli_here):
    env = {**cli_env(config), "LAKECDC_TABLES": "public.notifications",
           "LAKECDC_HISTORY_TABLE": "public.notification_history"}
    result = run_cli(["setup"], env)
    error_line(result, "public.notification_history", "LAKECDC_TABLES")
    with source_db.connect() as conn:
        slots = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                             [config.slot]).fetchone()[0]
        indexes = conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname LIKE "
                               "'%%lakecdc%%'").fetchone()[0]
    assert (slots, indexes) == (0, 0)
    for command in (["run", "--once"], ["ship", "--once"], ["verify"]):
        refused = cli_here(command, env)
        assert refused.returncode == 2 and "LAKECDC_HISTORY_TABLE" in refused.stderr, \
            refused.stderr[-2000:]
