"""What the shipper (``bronze.ship``) reports of each batch, and hands on.

``ShipBatch`` is one bounded peek and its bronze commit; ``ShipTotals`` a run's sum of them.
``Downstream`` is the shipper's one hand-off: the shipper calls it, in its own thread and in
bronze's order, at three points of each batch. ``lakecdc ship`` hears of each batch after it
(metrics, bronze's maintenance); ``lakecdc run`` also hands each batch's step to the
dashboard as soon as bronze holds it (``pipelines.run.shipping``, ``gold.ahead``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa

from bronze.records import BRONZE_SCHEMA
from bronze.table import Progress

# The most rows, and bytes of them, a batch keeps in memory for ``Downstream.rows``: a
# continuous batch (about 500 rows at 2,000 changes/s) is far below. ``lakecdc run`` peeks
# at most ``FOLLOWED_PEEK`` changes, so that each batch of a catch-up is kept too (a peek
# ends at a transaction's end, past its bound) and the dashboard follows the shipper
# through it (``gold.ahead``); where rows are wide, fewer (``KeptRows.next_peek``). A batch
# bigger still (one big transaction) is left to the stream, and memory stays bounded by the
# peek's chunk.
FOLLOWED_PEEK = 50_000
KEPT_ROWS = 64_000
KEPT_BYTES = 96 << 20
# A catch-up's first peek; each full peek after it may ask for twice as many. Neither asks
# for more than ``KEPT_BYTES`` keeps at the width of the rows just shipped, nor for fewer
# than ``NARROWEST_PEEK`` (``KeptRows.next_peek``).
FIRST_FOLLOWED_PEEK = 20_000
NARROWEST_PEEK = 1_000


@dataclass
class ShipBatch:
    peek_rows: int
    changes: int
    transactions: int
    full: bool              # the peek hit upto_nchanges: more may be waiting
    committed: bool         # a bronze commit was made
    seconds: float          # the peek and the bronze commit (not the slot's advance)
    read_rows: int = 0      # snapshot backfill rows appended (not counted in ``changes``)
    # Set by ``Shipper.run`` for ``Downstream.shipped``: what happened since the previous
    # batch it reported - heartbeats sent, and why each reconnect's session was lost
    # (``reconnect_reason``). Events of a failed attempt are reported with the next batch.
    heartbeats: int = 0
    reconnects: tuple[str, ...] = ()
    # Logical messages under lakecdc's prefixes skipped as not lakecdc's: malformed, or
    # backfill marks of runs never staged (docs/security.md).
    skipped_messages: int = 0
    # The newest source commit this batch stored in bronze (None: none).
    commit_lsn: int | None = None
    commit_ts: datetime | None = None
    # For a batch that stored changes: the newest source commit bronze held before it (None:
    # none).
    after_lsn: int | None = None
    # Set by ``Downstream.stored`` in ``lakecdc run`` (``pipelines.run.shipping``) when the
    # dashboard took this batch's step as soon as bronze held it (``gold.ahead``): the
    # seconds that took, right after ``seconds``. 0.0: not taken, or not waited for (a
    # catch-up's batch, its step pushed beside the next peek).
    ahead_seconds: float = 0.0
    started_at: float = 0.0     # when the peek began (wall clock, ``time.time()``)


@dataclass
class ShipTotals:
    batches: int = 0
    changes: int = 0
    transactions: int = 0
    commits: int = 0
    read_rows: int = 0
    heartbeats: int = 0     # heartbeats sent (bronze/heartbeat.py)
    reconnects: int = 0     # times the source went away and the shipper reconnected


class Downstream:
    """What the shipper hands each batch to; this one takes nothing. None of its calls may
    raise: the shipper's delivery does not depend on them."""

    # Whether ``rows`` is to be called (the shipper then keeps a batch's rows, when they
    # are few: ``KEPT_ROWS``, ``KEPT_BYTES``).
    takes_rows = False

    def rows(self, after_lsn: int | None, rows: pa.Table, known: tuple[str, ...]) -> None:
        """Right before a batch's bronze commit: the newest source commit bronze held
        before it (``ShipBatch.after_lsn``), its rows, and the tables bronze may hold
        changes of as of its peek (``bronze.capture_list.ShipperSet.known``), so their
        parse can overlap the commit."""

    def stored(self, batch: ShipBatch) -> ShipBatch:
        """Right after a commit that stored changes, before the slot's advance; returns
        the batch as ``shipped`` is to hear of it."""
        return batch

    def shipped(self, batch: ShipBatch, progress: Progress) -> None:
        """After every batch, with bronze's progress: what ``lakecdc ship`` reports."""


class KeptRows:
    """A batch's bronze rows, as they are written, while they stay within ``KEPT_ROWS`` and
    ``KEPT_BYTES``."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] | None = []
        self.rows = self.bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        if self.batches is None:
            return
        if self.rows > KEPT_ROWS or self.bytes > KEPT_BYTES:
            self.batches = None
        else:
            self.batches.append(batch)

    def next_peek(self, most: int, asked: int, full: bool) -> int:
        """The next peek's bound, after one that asked for ``asked`` changes and came back
        ``full`` or not, holding these rows: after a full one twice ``asked``, else (a
        catch-up's first) ``FIRST_FOLLOWED_PEEK``; never more than ``most``, nor than three
        quarters of ``KEPT_BYTES`` holds at these rows' width (a peek counts wal2json's
        rows, a transaction's begin and commit too, so the bound is on the safe side), nor
        fewer than ``NARROWEST_PEEK``."""
        grown = 2 * asked if full else FIRST_FOLLOWED_PEEK
        fits = int(KEPT_BYTES * 0.75 * self.rows / max(self.bytes, 1)) if self.rows else most
        return min(most, max(NARROWEST_PEEK, min(grown, fits)))

    def table(self) -> pa.Table:
        return pa.Table.from_batches(self.batches, BRONZE_SCHEMA)


def newest_stored(summary, committed: bool) -> dict:
    """``ShipBatch``'s newest stored source commit, from a peek's summary."""
    if not committed or summary.max_commit_lsn is None:
        return {}
    ts = summary.max_commit_ts_us
    return {"commit_lsn": summary.max_commit_lsn,
            "commit_ts": None if ts is None else
            datetime.fromtimestamp(ts / 1e6, timezone.utc)}
