"""Source workloads for tests: Notify-like traffic written with plain SQL."""

from __future__ import annotations

import random
import uuid
from collections import Counter

import psycopg

STATUSES = ("created", "sending", "delivered", "permanent-failure", "temporary-failure")
TYPES = ("email", "sms", "letter")
SERVICES = [uuid.UUID(int=0x1000 + i) for i in range(4)]
TEMPLATES = [uuid.UUID(int=0x2000 + i) for i in range(3)]

INSERT = ("INSERT INTO notifications (id, service_id, template_id, notification_type, "
          "notification_status, key_type, created_at) VALUES (%s, %s, %s, %s, 'created', "
          "'normal', now())")


def new_row(rng: random.Random) -> tuple:
    return (uuid.uuid4(), rng.choice(SERVICES), rng.choice(TEMPLATES), rng.choice(TYPES))


def insert(conn: psycopg.Connection, rng: random.Random, n: int) -> None:
    with conn.cursor() as cur:
        cur.executemany(INSERT, [new_row(rng) for _ in range(n)])


def multi_row_insert(conn: psycopg.Connection, rng: random.Random, n: int) -> None:
    """One INSERT statement with n rows (its changes may share an LSN)."""
    conn.execute("INSERT INTO notifications (id, service_id, template_id, notification_type, "
                 "notification_status, key_type, created_at) SELECT gen_random_uuid(), "
                 "s, t, 'sms', 'created', 'normal', now() FROM generate_series(1, %s) g, "
                 "LATERAL (SELECT %s::uuid AS s, %s::uuid AS t) d",
                 [n, rng.choice(SERVICES), rng.choice(TEMPLATES)])


def copy_rows(conn: psycopg.Connection, rng: random.Random, n: int) -> None:
    with conn.cursor().copy("COPY notifications (id, service_id, template_id, "
                            "notification_type, notification_status, key_type, created_at) "
                            "FROM STDIN") as copy:
        for _ in range(n):
            copy.write_row((*new_row(rng), "created", "normal", "2026-01-01T00:00:00Z"))


def transition(conn: psycopg.Connection, fraction: float, to: str) -> None:
    conn.execute("UPDATE notifications SET notification_status = %s "
                 "WHERE random() < %s", [to, fraction])


def archive(conn: psycopg.Connection, fraction: float) -> None:
    """Move some rows to history in one transaction (INSERT history + DELETE)."""
    with conn.transaction():
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS moving (id uuid) ON COMMIT DROP")
        conn.execute("INSERT INTO moving SELECT id FROM notifications WHERE random() < %s",
                     [fraction])
        conn.execute("INSERT INTO notification_history SELECT n.* FROM notifications n "
                     "JOIN moving m USING (id)")
        conn.execute("DELETE FROM notifications n USING moving m WHERE n.id = m.id")


def hard_delete(conn: psycopg.Connection, fraction: float) -> None:
    conn.execute("DELETE FROM notifications WHERE random() < %s", [fraction])


def purge_history(conn: psycopg.Connection, fraction: float) -> Counter:
    """Retention purge of history; returns the purged rows' dims (the truth still counts
    them: docs/gold.md)."""
    rows = conn.execute("DELETE FROM notification_history WHERE random() < %s RETURNING "
                        "service_id::text, template_id::text, notification_type::text, "
                        "notification_status", [fraction]).fetchall()
    return Counter(tuple(r) for r in rows)


def mixed(dsn: str, seed: int = 7, scale: int = 1) -> Counter:
    """Inserts, transitions, archival moves, deletes, rollbacks, savepoints, COPY,
    multi-row inserts, uncaptured-table writes, logical messages and a history purge.
    Returns the purged history rows' dims."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS uncaptured (x int)")
        insert(conn, rng, 50 * scale)
        multi_row_insert(conn, rng, 30 * scale)
        copy_rows(conn, rng, 40 * scale)
        conn.execute("INSERT INTO uncaptured VALUES (1)")
        # Messages: one lakecdc reads (markers travel through every layer), one it never
        # asks wal2json for.
        conn.execute("SELECT pg_logical_emit_message(false, 'lakecdc.marker', 'solo')")
        conn.execute("SELECT pg_logical_emit_message(true, 'another.app', 'not ours')")
        transition(conn, 0.5, "sending")
        with conn.transaction():
            insert(conn, rng, 5)
            conn.execute("SELECT pg_logical_emit_message(true, 'lakecdc.marker', 'in-tx')")
            try:
                with conn.transaction():            # savepoint rolled back
                    insert(conn, rng, 7)
                    raise RuntimeError("roll back to savepoint")
            except RuntimeError:
                pass
        try:
            with conn.transaction():                # whole transaction rolled back
                insert(conn, rng, 9)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        transition(conn, 0.3, "delivered")
        archive(conn, 0.2)
        hard_delete(conn, 0.1)
        return purge_history(conn, 0.3)
