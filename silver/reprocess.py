"""``lakecdc backfill reprocess-silver``: re-parse a range of bronze into silver after a fix.

Bronze keeps the exact JSON wal2json emitted, so silver can always be derived again. For a
commit-LSN range (or a commit-time range, turned into the LSN range of the transactions
committed in it), under the gold writer lock:

1. The range is cut at the end of what silver holds *whole*: the newest transaction silver
   has every row of (``tx_changes``), and nothing after a transaction it holds only part
   of. Rows past the cut are the stream's to parse (with the fixed parser too);
   replacing them here would make the stream append them a second time.
2. The bronze rows of the range are parsed with today's ``silver.parse`` and replace the
   range in ``silver/changes`` and in ``silver/quarantine`` (``replaceWhere`` on
   ``commit_lsn``: one commit per table, so each table holds the range exactly once; no
   duplicates, and a rerun replaces the range again). Both tables are append-only for
   their readers' sake; the flag is lifted for this one commit and set back.
3. Gold is rebuilt (``pipelines.backfill.rebuild.reprocess_and_rebuild`` runs all three steps): its
   counts come from a fresh consistent baseline, so whatever the old parse got wrong is not
   carried on; the stream goes on past it. The stream reads bronze, never silver, so the
   replacing commits are not seen as changes.

Why rebuild gold rather than re-derive it from the reprocessed silver: silver does not hold
the baseline (rows older than the slot never had a WAL change), so only the source can say
what the counts were at a point; a rebuild is exact by construction and costs one snapshot
count. Silver's readers other than gold (notebooks, analysts' batch reads) simply see the
corrected rows.

A crash between the silver commit and the quarantine commit leaves quarantine with the old
rows of the range (and possibly the flag lifted): rerun the same command.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from core.errors import UserError
from core.lsn import Lsn, fmt
from silver.parse import parse_changes, quarantine_rows

log = logging.getLogger("lakecdc.silver")


@dataclass(frozen=True)
class ReprocessReport:
    first_lsn: int | None
    last_lsn: int | None
    changes_rows: int
    quarantined_rows: int
    rebuild: object | None = None        # pipelines.backfill.rebuild.RebuildReport
    seconds: float = 0.0

    def summary(self) -> str:
        if self.first_lsn is None:
            text = "reprocess-silver: silver holds no whole transaction in that range"
        else:
            text = (f"reprocessed silver from {fmt(self.first_lsn)} to {fmt(self.last_lsn)}: "
                    f"{self.changes_rows:,} rows ({self.quarantined_rows:,} quarantined)")
        if self.rebuild is not None:
            text += "; " + self.rebuild.summary()
        return text


def _lsn(text: str | None, flag: str) -> int | None:
    if text is None:
        return None
    try:
        return int(Lsn.parse(text))
    except ValueError as exc:
        raise UserError(f"{flag}: {exc}; write an LSN like 0/4A3F2C0.") from None


def _time(text: str | None, flag: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not an ISO 8601 time; write e.g. "
                        "2026-11-21T09:00:00+00:00.") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def whole_prefix_end(spark: SparkSession, silver_path: str) -> int | None:
    """The highest commit LSN up to which silver holds every transaction whole."""
    txs = (spark.read.format("delta").load(silver_path)
           .groupBy("commit_lsn")
           .agg(F.count(F.lit(1)).alias("rows"), F.max("tx_changes").alias("tx_changes")))
    row = txs.agg(
        F.min(F.when(F.col("rows") < F.col("tx_changes"), F.col("commit_lsn"))).alias("part"),
        F.max("commit_lsn").alias("last")).first()
    if row.part is None:
        return row.last
    below = txs.where(F.col("commit_lsn") < F.lit(row.part)).agg(F.max("commit_lsn")).first()[0]
    return below


def reprocess_silver(spark: SparkSession, where, tables: tuple[str, ...],
                     from_lsn: str | None = None, to_lsn: str | None = None,
                     since: str | None = None, until: str | None = None,
                     counted_tables: tuple[str, ...] | None = None) -> ReprocessReport:
    """Steps 1-2 of the module docstring, for silver at ``where`` (``SilverLocations``), the
    captured ``tables`` and the ``counted_tables`` among them; the caller holds the gold
    writer lock and rebuilds gold after (``pipelines.backfill.rebuild.reprocess_and_rebuild``)."""
    started = time.monotonic()
    if (from_lsn or to_lsn) and (since or until):
        raise UserError("give an LSN range (--from-lsn/--to-lsn) or a time range "
                        "(--since/--until), not both.")
    lo, hi = _lsn(from_lsn, "--from-lsn"), _lsn(to_lsn, "--to-lsn")
    t_lo, t_hi = _time(since, "--since"), _time(until, "--until")
    bronze = spark.read.format("delta").load(where.bronze_path)
    if t_lo is not None or t_hi is not None:
        window = bronze
        if t_lo is not None:
            window = window.where(F.col("commit_ts") >= F.lit(t_lo))
        if t_hi is not None:
            window = window.where(F.col("commit_ts") <= F.lit(t_hi))
        lo, hi = window.agg(F.min("commit_lsn"), F.max("commit_lsn")).first()
        if lo is None:
            return ReprocessReport(None, None, 0, 0, seconds=time.monotonic() - started)
    end = whole_prefix_end(spark, where.silver_path)
    lo = lo if lo is not None else 0
    hi = end if hi is None or end is None else min(hi, end)
    if hi is None or lo > hi:
        return ReprocessReport(None, None, 0, 0, seconds=time.monotonic() - started)
    rows = bronze.where(F.col("commit_lsn").between(lo, hi))
    predicate = f"commit_lsn >= {int(lo)} AND commit_lsn <= {int(hi)}"
    counts = {}
    for path, frame in ((where.silver_path, parse_changes(rows, tables, counted_tables)),
                        (where.quarantine_path, quarantine_rows(rows, tables, counted_tables))):
        frame = frame.persist()
        try:
            counts[path] = frame.count()
            _replace(spark, path, frame, predicate)
        finally:
            frame.unpersist()
    log.info("reprocessed silver %s..%s: %d rows, %d quarantined", fmt(lo), fmt(hi),
             counts[where.silver_path], counts[where.quarantine_path])
    return ReprocessReport(lo, hi, counts[where.silver_path], counts[where.quarantine_path],
                           seconds=time.monotonic() - started)


def _replace(spark: SparkSession, path: str, frame, predicate: str) -> None:
    """Replace the rows matching ``predicate`` with ``frame`` in one commit, lifting the
    table's append-only flag around it."""
    table = "delta.`{}`".format(path.replace("`", "``"))
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
    try:
        (frame.write.format("delta").mode("overwrite").option("replaceWhere", predicate)
         .save(path))
    finally:
        spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.appendOnly' = 'true')")
