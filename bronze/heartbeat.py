"""Heartbeats: let the slot move when nothing it can decode is written (WAL safety).

A logical slot only moves when the shipper advances it, and the shipper can only advance
it to the end of a transaction it has decoded and recorded in bronze. WAL that contains no
transaction of the slot's database - writes in *other* databases of the cluster, VACUUM,
checkpoints, full-page images - gives it nothing to advance to: while the captured tables
are idle, the slot pins all of that WAL, however much of it there is.

A heartbeat is a tiny transaction in the slot's own database:
``pg_logical_emit_message(true, 'lakecdc.heartbeat', <slot>)``. It is transactional, so it
commits (and is flushed) at once and the next peek sees it; a non-transactional message only
becomes visible after some later WAL flush. The shipper's peek filters the prefix out
(wal2json ``filter-msg-prefixes``), so the heartbeat arrives as an empty ``B``/``C`` pair,
exactly like a transaction that touched only uncaptured tables: no bronze rows, nothing for
silver or gold. Passing over it is recorded as a progress-only bronze commit (the slot's new
``end_lsn``), and only then is the slot advanced - the exactly-once rule is unchanged: the
slot never moves past what bronze recorded.

When (``Heartbeat.due``): the slot has not moved for ``heartbeat_interval_s`` and the WAL is
at least ``MIN_LAG_BYTES`` ahead of it. Below that nothing is worth releasing (Postgres keeps
``min_wal_size``, 80 MB by default, of WAL anyway), and an idle cluster is not kept busy by
heartbeats and the progress commits they cause. ``lakecdc ship --once`` sends one heartbeat
after draining if the slot is still that far behind, so scheduled runs release WAL too.

Needs EXECUTE on ``pg_logical_emit_message`` (granted to PUBLIC by default on PostgreSQL 15).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from core.errors import UserError
from core.postgres import emit_message

PREFIX = "lakecdc.heartbeat"
MIN_LAG_BYTES = 1 << 20


def emit(conn: psycopg.Connection, slot: str) -> int:
    """Commit one heartbeat (``conn`` is in autocommit); returns its message's LSN. The
    transaction's end, where the slot may then be advanced to, is just past it."""
    try:
        return emit_message(conn, PREFIX, slot)
    except psycopg.errors.InsufficientPrivilege:
        raise UserError("the shipper's role may not call pg_logical_emit_message, which "
                        "heartbeats need: GRANT EXECUTE ON FUNCTION "
                        "pg_logical_emit_message(boolean, text, text) to it, or turn "
                        "heartbeats off with LAKECDC_HEARTBEAT_INTERVAL=0 (WAL written "
                        "elsewhere then stays pinned while the captured tables are idle; "
                        "docs/operations.md).") from None


@dataclass
class Heartbeat:
    """When to send a heartbeat, and whether a peek has passed the one sent."""

    interval_s: float                  # 0: never
    min_lag_bytes: int = MIN_LAG_BYTES
    pending_lsn: int | None = None     # sent, not yet passed by a bronze commit
    sent_at: float = 0.0
    sent: int = 0

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def due(self, lag_bytes: int | None, slot_moved_at: float, now: float | None = None
            ) -> bool:
        now = time.monotonic() if now is None else now
        if not self.enabled or lag_bytes is None or lag_bytes < self.min_lag_bytes:
            return False
        if self.pending_lsn is not None and now - self.sent_at < self.interval_s:
            return False                   # one in flight: the next peek will pass it
        return now - slot_moved_at >= self.interval_s

    def sent_one(self, lsn: int, now: float | None = None) -> None:
        self.pending_lsn = lsn
        self.sent_at = time.monotonic() if now is None else now
        self.sent += 1

    def passed(self, last_lsn: int | None) -> bool:
        """Did a peek ending at ``last_lsn`` include the pending heartbeat?"""
        return (self.pending_lsn is not None and last_lsn is not None
                and last_lsn > self.pending_lsn)

    def recorded(self) -> None:
        """Bronze recorded the pending heartbeat as passed over."""
        self.pending_lsn = None
