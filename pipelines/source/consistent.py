"""A consistent point of the source: an LSN and the exact table state at it.

``consistent_point(dsn)`` creates a TEMPORARY logical slot with an exported snapshot: the
snapshot sees exactly the transactions the slot will not decode, i.e. those committed
before its consistent point - the same cut ``setup`` uses for the baseline, so counting in
it gives ``service_stats`` as of that LSN. The slot is dropped by the server when the
replication connection closes (even if this process is killed), so nothing pins WAL after
the ``with`` block. Creating it waits for transactions already running to end (that is how
Postgres finds a consistent point); it never blocks writers.

``emit_marker`` writes a transactional logical message: it commits after every transaction
in the snapshot, travels through bronze, silver and gold like any captured transaction
(count-neutral), and so tells a waiting command when each layer has moved past the point.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import psycopg
from psycopg import sql

from bronze import slot as slots
from core.captured import MARKER_PREFIX, CountedTables
from core.postgres import connect, emit_message
from core.progress import ProgressBar
from pipelines.source.truth import count_truth, estimated_rows


@dataclass(frozen=True)
class ConsistentPoint:
    lsn: int               # the slot's consistent point
    snapshot_name: str     # importable while the ``with`` block runs


@contextmanager
def consistent_point(dsn: str) -> Iterator[ConsistentPoint]:
    name = f"lakecdc_tmp_{uuid.uuid4().hex[:16]}"
    with slots.replication_connection(dsn) as rconn:
        created = slots.create_slot(rconn, name, temporary=True)
        try:
            yield ConsistentPoint(created.consistent_point, created.snapshot_name)
        finally:
            # Dropped now, not when the server gets round to ending the session after the
            # connection closes: once this returns, the slot pins no WAL. (If the session
            # is already gone, so is the slot.)
            with contextlib.suppress(psycopg.Error):
                rconn.execute(sql.SQL("DROP_REPLICATION_SLOT {}").format(sql.Identifier(name)))


def count_at(dsn: str, point: ConsistentPoint, tables: CountedTables,
             label: str = "counting source rows") -> Counter:
    """``service_stats`` truth of the counted ``tables`` as of ``point`` (source rows only),
    with a progress bar."""

    with connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
            sql.Literal(point.snapshot_name)))
        with ProgressBar(label, estimated_rows(conn, tables)) as progress:
            counts = count_truth(conn, tables, progress)
        conn.rollback()
    return counts


def emit_marker(dsn: str, purpose: str) -> int:
    """Commit a count-neutral marker transaction; returns its message's LSN (its commit LSN
    is higher). Once gold's watermark reaches it, gold includes every earlier commit."""
    with connect(dsn) as conn:
        return emit_message(conn, MARKER_PREFIX, purpose)
