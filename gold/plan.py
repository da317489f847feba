"""What one gold batch applies, from its aggregated contributions: pure Arrow, no I/O.

The stream's batch becomes its contribution lines on the driver (``gold.deltas.line_table``:
a few per source transaction and key), joined by the lines ``_pending``
carried from earlier batches. ``plan`` then decides, as ``gold.apply`` documents:

- a source transaction is *complete* when its lines hold ``tx_changes`` rows, and *broken*
  when they hold more, or disagree about its size (silver delivered something twice);
- the *cutoff* is the lowest commit LSN of an incomplete or broken transaction: gold applies
  exactly the transactions below it, so it always holds a prefix of the source's commit
  order and its watermark means "exact as of this commit";
- the applied transactions' net delta per key (zero nets dropped), each with the newest
  applied commit that touched it; the lines at or past the cutoff are carried.

Lines are rows in ``gold.deltas.CONTRIBUTIONS`` order: ``(commit_lsn, tx_changes,
service_id, template_id, notification_type, notification_status, commit_ts, delta, rows)``,
dims all None on a transaction's row-count line; ``plan`` takes them as an Arrow table
(``lines_table`` makes one of tuples) and returns the key deltas as an Arrow table of
``KEY_DELTAS`` (the MERGE's source, as they are) and the carried lines as tuples.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from core.captured import DIMS
from core.spark import arrow_rows
from gold.deltas import CONTRIBUTIONS, KEY_DELTAS, LINE_KEY

Line = tuple   # CONTRIBUTIONS order, see the module docstring
LINES = to_arrow_schema(CONTRIBUTIONS)
KEY_DELTA_COLUMNS = to_arrow_schema(KEY_DELTAS)


@dataclass(frozen=True)
class Plan:
    transactions: int                   # source transactions the lines belong to
    applied: int                        # of them, applied now (below the cutoff)
    commit_lsn: int | None              # gold's watermark after this batch (None: unchanged)
    commit_ts: datetime | None
    key_deltas: pa.Table                # KEY_DELTA_COLUMNS: dims, delta, last_commit_lsn; none 0
    carried: list[Line]                 # lines of the transactions not applied yet
    broken_at: int | None = None        # the lowest broken transaction, if any

    @property
    def carried_transactions(self) -> int:
        return self.transactions - self.applied


def lines_table(lines: Iterable[Line]) -> pa.Table:
    """Lines (tuples in ``CONTRIBUTIONS`` order) as an Arrow table of ``LINES``."""
    return arrow_rows(list(lines), CONTRIBUTIONS)


def tuples(table: pa.Table) -> list[tuple]:
    """``table``'s rows as tuples in its column order."""
    return list(zip(*(column.to_pylist() for column in table.columns)))


def aggregate(lines: pa.Table) -> pa.Table:
    """Sum lines per (commit_lsn, tx_changes, dims): associative, so the carried lines of
    earlier batches combine with a new batch's by concatenation and this."""
    summed = lines.group_by(list(LINE_KEY), use_threads=False).aggregate(
        [("commit_ts", "max"), ("delta", "sum"), ("rows", "sum")])
    return summed.rename_columns({"commit_ts_max": "commit_ts", "delta_sum": "delta",
                                  "rows_sum": "rows"}).select(LINES.names).cast(LINES)


def plan(lines: pa.Table) -> Plan:
    """The plan for ``lines`` (``LINES``: a batch's and the carried ones), in Arrow: the
    work follows the lines' count, and a catch-up's batch has hundreds of thousands."""
    lines = aggregate(lines)
    txs = lines.group_by("commit_lsn", use_threads=False).aggregate(
        [("rows", "sum"), ("tx_changes", "min"), ("tx_changes", "max"), ("commit_ts", "max")])
    lsn = txs.column("commit_lsn").to_numpy()
    rows = txs.column("rows_sum").to_numpy()
    lo, hi = (txs.column(f"tx_changes_{f}").to_numpy() for f in ("min", "max"))
    broken = (rows > lo) | (lo != hi) | (lo < 1)
    waiting = rows != lo
    stops = lsn[broken | waiting]
    cutoff = int(stops.min()) if len(stops) else None
    applied = lsn < cutoff if cutoff is not None else np.ones(len(lsn), bool)
    newest = int(np.argmax(np.where(applied, lsn, np.iinfo(np.int64).min))) \
        if applied.any() else None
    at = lines.column("commit_lsn").to_numpy()
    later = at >= cutoff if cutoff is not None else np.zeros(len(at), bool)
    keyed = lines.filter(pa.array(~later & np.asarray(
        pc.is_valid(lines.column("service_id")))))
    deltas = keyed.group_by(list(DIMS), use_threads=False).aggregate(
        [("delta", "sum"), ("commit_lsn", "max")])
    deltas = deltas.filter(pc.not_equal(deltas.column("delta_sum"), 0))
    key_deltas = deltas.select([*DIMS, "delta_sum", "commit_lsn_max"]).rename_columns(
        KEY_DELTA_COLUMNS.names).cast(KEY_DELTA_COLUMNS)
    carried = lines.filter(pa.array(later))
    return Plan(transactions=len(lsn), applied=int(applied.sum()),
                commit_lsn=None if newest is None else int(lsn[newest]),
                commit_ts=None if newest is None else
                txs.column("commit_ts_max")[newest].as_py(),
                key_deltas=key_deltas,
                carried=tuples(carried.select(LINES.names)),
                broken_at=int(lsn[broken].min()) if broken.any() else None)
