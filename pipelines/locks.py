"""One writer at a time where exactness needs it, with Postgres advisory locks.

- the shipper holds ``lakecdc.ship:<slot>`` on the source (``bronze.ship``);
- whoever writes gold - the gold stream of ``lakecdc gold`` / ``lakecdc run``, a rebuild,
  ``verify --repair``, ``backfill reprocess-silver`` - holds ``lakecdc.gold:<gold path>`` on
  the dashboard database (every gold writer already talks to it to push).

Session-level locks: held while the connection is open, released by the server when the
process dies, so a ``kill -9`` never leaves a stale lock behind.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import psycopg

from bronze.source import connect
from pipelines.errors import UserError


def gold_lock_name(gold_path: str) -> str:
    """One name per gold table, however an engine spells its path (``gold.push.gold_key``:
    ``s3a://`` locally and ``s3://`` on Databricks are the same table)."""
    from gold.push import gold_key

    return f"lakecdc.gold:{gold_key(gold_path)}"


def ship_lock_name(slot: str) -> str:
    return f"lakecdc.ship:{slot}"


def is_held(conn: psycopg.Connection, name: str) -> bool:
    """Whether any session holds the advisory lock ``name`` (on ``conn``'s database)."""
    row = conn.execute("""
        WITH k AS (SELECT hashtextextended(%s, 0) AS key)
        SELECT count(*) FROM pg_locks, k
        WHERE locktype = 'advisory' AND granted AND objsubid = 1
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND classid::text::bigint = (k.key >> 32) & 4294967295
          AND objid::text::bigint = k.key & 4294967295""", [name]).fetchone()
    return bool(row[0])


@contextmanager
def exclusive(dsn: str, name: str, busy: str, what: str = "dashboard") -> Iterator[None]:
    """Hold advisory lock ``name`` for the block; ``UserError(busy)`` if someone has it."""
    with connect(dsn, what=what) as conn:
        got = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                           [name]).fetchone()[0]
        if not got:
            raise UserError(busy)
        try:
            yield
        finally:
            try:
                conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [name])
            except psycopg.Error:
                pass    # the session is gone (server restart): so is its lock


@contextmanager
def gold_writer_lock(dashboard_dsn: str, gold_path: str) -> Iterator[None]:
    with exclusive(dashboard_dsn, gold_lock_name(gold_path),
                   f"another lakecdc process is writing gold at {gold_path} (`lakecdc run`, "
                   "`lakecdc gold` or a rebuild); stop it first, only one may write gold."):
        yield
