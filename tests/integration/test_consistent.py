"""Consistent points (temporary slot + exported snapshot) and the chunked truth count."""

from __future__ import annotations

import random
import threading

import pytest
from psycopg import sql

from core.captured import COUNTED
from pipelines.source.consistent import consistent_point, count_at, emit_marker
from pipelines.source.truth import count_truth, source_counts
from tests.integration.workload import archive, insert, transition

pytestmark = pytest.mark.integration


def _populate(source_db, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with source_db.connect() as conn:
        insert(conn, rng, n)
        transition(conn, 0.5, "delivered")
        archive(conn, 0.4)


def test_chunked_count_equals_one_group_by_and_reports_every_row(source_db):
    _populate(source_db, 1000, 1)
    with source_db.connect() as conn:
        expected = source_counts(conn, COUNTED)
        seen: list[int] = []
        for chunk in (97, 1000, 5000):
            seen.clear()
            assert count_truth(conn, COUNTED, seen.append, chunk_rows=chunk) == expected
            assert sum(seen) == 1000
        assert len(seen) == 2                 # one chunk per table at 5000 rows a chunk


def test_a_consistent_point_counts_exactly_what_committed_before_it(source_db):
    _populate(source_db, 300, 2)
    with source_db.connect() as conn:
        before = source_counts(conn, COUNTED)
    with consistent_point(source_db.dsn) as point:
        with source_db.connect() as conn:       # committed after the point: not counted
            insert(conn, random.Random(3), 50)
            transition(conn, 1.0, "sending")
        assert count_at(source_db.dsn, point, COUNTED) == before
        marker = emit_marker(source_db.dsn, "test")
        assert marker > point.lsn
        with source_db.connect() as conn:
            temp = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE temporary"
                                ).fetchone()[0]
        assert temp == 1
    with source_db.connect() as conn:          # nothing left pinning WAL, at once
        assert conn.execute("SELECT count(*) FROM pg_replication_slots "
                            "WHERE database = current_database()").fetchone()[0] == 0


def test_counting_does_not_block_writers(source_db):
    _populate(source_db, 2000, 4)
    committed = []
    stop = threading.Event()
    wrote = threading.Condition()

    def write():
        rng = random.Random(5)
        with source_db.connect() as conn:
            while not stop.is_set():
                insert(conn, rng, 1)
                with wrote:
                    committed.append(1)
                    wrote.notify_all()

    def chunk_counted(_rows) -> None:
        """After each chunk, wait (up to 30 s) for a writer commit: a count that blocked
        writers would time out here."""
        with wrote:
            seen = len(committed)
            wrote.wait_for(lambda: len(committed) > seen, timeout=30)
            progress.append(len(committed))

    with consistent_point(source_db.dsn) as point:
        writer = threading.Thread(target=write)
        writer.start()
        try:
            with source_db.connect() as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                    sql.Literal(point.snapshot_name)))
                progress = []
                counts = count_truth(conn, COUNTED, chunk_counted, chunk_rows=50)
                conn.rollback()
        finally:
            stop.set()
            writer.join()
    assert sum(counts.values()) == 2000
    assert progress[-1] > progress[0], "no writer committed while the count ran"
