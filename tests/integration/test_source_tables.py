"""``setup`` on source tables of shapes a user may really have: a counted table without the
dimension columns is refused before anything changes (other captured tables need none:
``test_other_tables.py``); nullable identity columns (GOV.UK
Notify's own schema) are made NOT NULL online, without writers waiting on it."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.tests_support import cli_env, error_line, run_cli, wait_for

pytestmark = [pytest.mark.integration]

COUNTED = "public.notifications,public.notification_history"


def source_state(conn) -> tuple:
    """What setup may change: slots, lakecdc's indexes, replica identities, NOT NULLs."""
    return (conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone()[0],
            conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname LIKE "
                         "'%lakecdc%'").fetchone()[0],
            conn.execute("SELECT array_agg(relreplident ORDER BY relname) FROM pg_class "
                         "WHERE relname IN ('notifications', 'notification_history')"
                         ).fetchone()[0],
            conn.execute("SELECT array_agg(attname || ':' || attnotnull ORDER BY attrelid, "
                         "attnum) FROM pg_attribute WHERE attrelid IN "
                         "('notifications'::regclass, 'notification_history'::regclass) "
                         "AND attnum > 0").fetchone()[0])


def test_a_counted_table_without_the_dims_is_refused_and_nothing_changes(source_db,
                                                                          config):
    with source_db.connect() as conn:
        conn.execute("CREATE TABLE services (id uuid PRIMARY KEY, name text NOT NULL)")
        before = source_state(conn)
    env = {**cli_env(config), "LAKECDC_TABLES": COUNTED + ",public.services",
           "LAKECDC_NOTIFICATIONS_TABLE": "public.services"}
    line = error_line(run_cli(["setup"], env), "counted table public.services", "service_id",
                      "LAKECDC_NOTIFICATIONS_TABLE")
    assert "nothing was changed" in line
    with source_db.connect() as conn:
        assert source_state(conn) == before


class Writer(threading.Thread):
    """Single-row inserts into ``notifications``, each one's duration recorded."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop, self.waits = dsn, threading.Event(), []

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                started = time.monotonic()
                conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                             "notification_type, notification_status, key_type, created_at) "
                             "VALUES (gen_random_uuid(), gen_random_uuid(), "
                             "gen_random_uuid(), 'sms', 'created', 'normal', now())")
                self.waits.append(time.monotonic() - started)
                time.sleep(0.01)


def hold_access_share(dsn: str, table: str, seconds: float) -> threading.Thread:
    """A long reader of ``table``: an open transaction holding ACCESS SHARE for a while."""
    def body():
        with psycopg.connect(dsn) as conn:
            conn.execute(f"SELECT 1 FROM {table} LIMIT 1")
            time.sleep(seconds)
            conn.rollback()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def notify_shaped(source_db):
    """Notify's own nullability (service_id, template_id nullable in both tables,
    notification_status in history) on populated tables."""
    with source_db.connect() as conn:
        for table, columns in (("notifications", ("service_id", "template_id")),
                               ("notification_history", ("service_id", "template_id",
                                                         "notification_status"))):
            for column in columns:
                conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL")
        conn.execute("INSERT INTO notification_history (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at) "
                     "SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'email', "
                     "'delivered', 'normal', now() FROM generate_series(1, 200000)")
    return source_db


def test_nullable_identity_columns_are_made_not_null_online_while_writers_keep_going(
        notify_shaped, config):
    db = notify_shaped
    refused = error_line(run_cli(["setup"], cli_env(config)))
    assert "--online-not-null" in refused and "REPLICA IDENTITY FULL" in refused, refused

    writer = Writer(db.dsn)
    writer.start()
    try:
        # A long reader of each table: a plain ALTER would queue behind it, and every
        # writer behind the ALTER.
        readers = [hold_access_share(db.dsn, t, 4.0)
                   for t in ("notifications", "notification_history")]
        result = run_cli(["setup", "--online-not-null"], cli_env(config))
        for reader in readers:
            reader.join()
    finally:
        writer.stop.set()
        writer.join()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "VALIDATE CONSTRAINT" in result.stdout and "SET NOT NULL" in result.stdout
    assert len(writer.waits) > 20 and max(writer.waits) < 2.0, max(writer.waits)
    with db.connect() as conn:
        nullable = conn.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid IN ('notifications'::regclass, "
            "'notification_history'::regclass) AND attname IN ('id', 'service_id', "
            "'template_id', 'notification_type', 'notification_status') "
            "AND NOT attnotnull").fetchone()[0]
        checks = conn.execute("SELECT count(*) FROM pg_constraint WHERE conname LIKE "
                              "'lakecdc_nn_%'").fetchone()[0]
        slot = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            [config.slot]).fetchone()[0]
    assert (nullable, checks, slot) == (0, 0, 1)


def test_negative_control_a_plain_set_not_null_makes_writers_wait(notify_shaped):
    """Without the lock timeout, the ALTER queues behind the long reader and the writers
    queue behind the ALTER: the bound above is what the online path buys."""
    db = notify_shaped
    writer = Writer(db.dsn)
    writer.start()
    try:
        reader = hold_access_share(db.dsn, "notifications", 3.0)
        with db.connect() as conn:
            wait_for(lambda: conn.execute(       # the reader holds its lock before the ALTER
                "SELECT count(*) FROM pg_locks WHERE relation = 'notifications'::regclass "
                "AND mode = 'AccessShareLock' AND granted AND pid <> pg_backend_pid()"
            ).fetchone()[0] > 0, timeout=30)
            conn.execute("ALTER TABLE notifications ALTER COLUMN service_id SET NOT NULL")
        reader.join()
    finally:
        writer.stop.set()
        writer.join()
    assert max(writer.waits) > 2.0, max(writer.waits)
