"""The bench's replication-protocol witness (``bench.decode.replication_drain``) reads, through
psycopg's ``START_REPLICATION``, exactly the rows a SQL peek of the same WAL returns, up to
the position it is given and no further, and leaves its slot where it was."""

from __future__ import annotations

import time

import psycopg
import pytest

from bench.decode import create_witness, current_lsn, raw_decode, replication_drain
from bench.ship_vs_decode import write_backlog
from bronze.slot import slot_state

pytestmark = pytest.mark.integration

TABLES = ("public.notifications", "public.notification_history")


def _drop_when_released(dsn: str, slot: str, timeout_s: float = 30.0) -> None:
    """Drop ``slot`` once no walsender holds it (its session ends after the client closes)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            dropped = conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NULL", [slot]).fetchall()
            if dropped:
                return
            assert time.monotonic() < deadline, f"slot {slot} still held"
            conn.execute("SELECT pg_sleep(0.05)")


def test_replication_drain_reads_the_peeks_rows_up_to_endpos_and_leaves_the_slot(source_db):
    dsn = source_db.dsn
    for slot in ("w_peek", "w_repl"):
        create_witness(dsn, slot)
    with psycopg.connect(dsn, autocommit=True) as conn:
        created = slot_state(conn, "w_repl").confirmed_flush_lsn
    write_backlog(dsn, 3_000, 500, update_fraction=0.5)
    endpos = current_lsn(dsn)
    rows, _ = raw_decode(dsn, "w_peek", TABLES)
    write_backlog(dsn, 1_000, 500, update_fraction=0.0)        # past endpos: not read

    drain = replication_drain(dsn, "w_repl", TABLES, endpos)

    assert rows > 3_000                  # every insert and update, with B/C rows
    assert drain.messages == rows
    assert drain.seconds > 0 and drain.client_cpu_s > 0
    _drop_when_released(dsn, "w_peek")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert slot_state(conn, "w_repl").confirmed_flush_lsn == created
    _drop_when_released(dsn, "w_repl")
