"""``lakecdc silver [--once]``: the bronze → silver streaming job (DESIGN §3.2).

Two Structured Streaming queries, each with its own checkpoint under ``checkpoint_root``:

- ``changes``: bronze → ``parse_changes`` → ``silver/changes`` through the built-in Delta
  sink, one row per bronze row. The only query that parses JSON.
- ``quarantine``: ``silver/changes`` → ``silver/quarantine`` (``QuarantineWriter``): the
  rows that failed, with their raw JSON looked up in bronze by key and the error silver
  gave them. A batch without failed rows (the normal case) reads one column and writes
  nothing.

Why quarantine reads ``silver/changes`` rather than bronze: parsing bronze a second time to
find the failures doubled silver's cost (measured: 2.0x the CPU of the changes query alone
on the benchmark backlog), and the failures are already in ``silver/changes`` (``error``
set). The raw JSON is not a silver column (carrying it for every row to serve the rare
failed one would nearly double silver), so it comes from bronze, which is append-only and
keyed like silver. Quarantine thus holds exactly the keys of ``silver/changes`` rows with
``error`` set, once its query has caught up (one trigger behind ``changes``; ``--once``
runs it after ``changes``).

Delivery guarantees:

- **Exactly once per table.** The Delta sink commits each ``changes`` micro-batch with the
  query id and batch id as a Delta app transaction; a batch that re-runs after a crash
  between the sink's commit and the checkpoint's commit file (F11) is recognised and
  skipped. The checkpoint is the record of progress: deleting it while the table holds
  streamed rows would append every bronze row again, so ``start_silver`` refuses to start
  then (F18). Quarantine writes are insert-only MERGEs on ``(commit_lsn, seq)`` of rows not
  there yet: a replayed batch, or a lost quarantine checkpoint, adds nothing twice.
- **Append-only.** Both tables are created up front with an explicit schema and
  ``delta.appendOnly=true`` (an insert-only MERGE only adds files), so downstream streams
  (gold) can read them as streaming sources, and the quarantine table exists before its
  first row.
- **The stream keeps going.** Parsing never raises on data (see ``silver.parse``); a bad
  row becomes an ``error`` row and a quarantine row.
- **Ordering.** A bronze commit can be split across micro-batches and rows within a batch
  are unordered; every row carries ``(commit_lsn, seq, tx_changes)`` so readers order by
  key and know when they hold a whole transaction.
- ``once`` uses the ``availableNow`` trigger: everything in bronze when the query starts,
  then stop. Stopping a continuous run mid-batch is safe: the batch re-runs next time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterable

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from pipelines.checkpoints import remove_incomplete_writes
from pipelines.config import Config
from pipelines.errors import UserError
from silver.parse import parse_changes
from silver.schema import SILVER_CHANGES, SILVER_QUARANTINE

log = logging.getLogger("lakecdc.silver")

TABLE_PROPERTIES = {
    "delta.appendOnly": "true",
    # Streaming appends make many small commits: checkpoint the log often (DESIGN §5).
    "delta.checkpointInterval": "20",
    "delta.logRetentionDuration": "interval 30 days",
}
DEFAULT_TRIGGER_INTERVAL = "10 seconds"
QUARANTINE_CHECKPOINT = "quarantine_from_changes"


@dataclass(frozen=True)
class SilverLocations:
    """Where the silver job reads and writes; ``checkpoint_root`` holds one dir per query."""

    bronze_path: str
    silver_path: str
    quarantine_path: str
    checkpoint_root: str

    @classmethod
    def from_config(cls, config: Config) -> "SilverLocations":
        """Paths as Spark must see them (``s3a://`` for S3 outside Databricks)."""
        from pipelines.storage import on_databricks, spark_path

        def path(layer: str, name: str) -> str:
            return spark_path(config.table_path(layer, name), on_databricks())

        return cls(bronze_path=spark_path(config.bronze_path, on_databricks()),
                   silver_path=path("silver", "changes"),
                   quarantine_path=path("silver", "quarantine"),
                   checkpoint_root=path("_checkpoints", "silver"))


@dataclass(frozen=True)
class SilverRun:
    changes_rows: int        # rows appended to silver/changes by this run
    quarantined_rows: int    # rows appended to silver/quarantine by this run
    seconds: float


def start_silver(spark: SparkSession, bronze_path: str, silver_path: str,
                 quarantine_path: str, checkpoint_root: str, known_tables: Iterable[str],
                 once: bool, trigger_interval: str = DEFAULT_TRIGGER_INTERVAL,
                 ) -> list[StreamingQuery]:
    """Create the silver tables if absent and start both queries; returns them running,
    ``changes`` first (drain them in that order: quarantine reads what ``changes`` wrote).

    Raises ``UserError`` if bronze is missing, a silver table has another schema, or
    ``silver/changes`` holds streamed rows but its checkpoint is gone.
    """
    _prepare(spark, bronze_path, silver_path, quarantine_path, checkpoint_root)
    queries = [_start_changes(spark, bronze_path, silver_path, checkpoint_root, known_tables,
                              once, trigger_interval)]
    try:
        queries.append(_start_quarantine(spark, bronze_path, silver_path, quarantine_path,
                                         checkpoint_root, once, trigger_interval))
    except BaseException:
        queries[0].stop()
        raise
    return queries


def run_silver(spark: SparkSession, bronze_path: str, silver_path: str, quarantine_path: str,
               checkpoint_root: str, known_tables: Iterable[str], once: bool = True,
               stop: threading.Event | None = None, poll_s: float = 1.0,
               trigger_interval: str = DEFAULT_TRIGGER_INTERVAL) -> SilverRun:
    """Run both queries until they finish (``once``), ``stop`` is set, or one fails.

    ``once`` runs ``changes`` to the end, then ``quarantine`` over what it wrote. A failure
    of either query stops the other and is raised. Returns what this run added.
    """
    started = time.monotonic()
    before = {p: _version(spark, p) for p in (silver_path, quarantine_path)}
    if once:
        _prepare(spark, bronze_path, silver_path, quarantine_path, checkpoint_root)
        _await([_start_changes(spark, bronze_path, silver_path, checkpoint_root,
                               known_tables, True, trigger_interval)], stop, poll_s)
        if not (stop is not None and stop.is_set()):
            _await([_start_quarantine(spark, bronze_path, silver_path, quarantine_path,
                                      checkpoint_root, True, trigger_interval)], stop, poll_s)
    else:
        _await(start_silver(spark, bronze_path, silver_path, quarantine_path, checkpoint_root,
                            known_tables, once, trigger_interval), stop, poll_s)
    run = SilverRun(_rows_since(spark, silver_path, before[silver_path]),
                    _rows_since(spark, quarantine_path, before[quarantine_path]),
                    time.monotonic() - started)
    log.info("silver: %d rows, %d quarantined, in %.1fs", run.changes_rows,
             run.quarantined_rows, run.seconds)
    if run.quarantined_rows:
        log.warning("silver: %d bronze rows failed to parse; see %s", run.quarantined_rows,
                    quarantine_path)
    return run


class QuarantineWriter:
    """The ``foreachBatch`` function of the quarantine query (see the module docstring).

    Per batch of ``silver/changes`` rows: the failed ones (``error`` set), minus those
    already in quarantine, joined to their bronze rows for the raw JSON, then one
    insert-only MERGE on ``(commit_lsn, seq)``. A batch without failures costs one read of
    its ``error`` column.
    """

    KEY = ("commit_lsn", "seq")

    def __init__(self, bronze_path: str, quarantine_path: str) -> None:
        self.bronze_path = bronze_path
        self.quarantine_path = quarantine_path

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        failed = batch.where(F.col("error").isNotNull()).select(*self.KEY, "error")
        if failed.isEmpty():
            return
        spark = batch.sparkSession
        target = DeltaTable.forPath(spark, self.quarantine_path)
        new = failed.join(target.toDF().select(*self.KEY), list(self.KEY), "left_anti")
        bounds = new.agg(F.min("commit_lsn").alias("lo"), F.max("commit_lsn").alias("hi")
                         ).first()
        if bounds.lo is None:          # a replay: every failed row is already there
            return
        # Bronze's files carry commit_lsn statistics: the range prunes them to a few.
        raw = (spark.read.format("delta").load(self.bronze_path)
               .where(F.col("commit_lsn").between(bounds.lo, bounds.hi)))
        rows = new.join(raw, list(self.KEY)).select(
            *[F.col(f.name).cast(f.dataType).alias(f.name) for f in SILVER_QUARANTINE.fields])
        on = " AND ".join(f"q.{c} = r.{c}" for c in self.KEY)
        (target.alias("q").merge(rows.alias("r"), on).whenNotMatchedInsertAll().execute())


def _prepare(spark: SparkSession, bronze_path: str, silver_path: str, quarantine_path: str,
             checkpoint_root: str) -> None:
    if not DeltaTable.isDeltaTable(spark, bronze_path):
        raise UserError(f"no bronze table at {bronze_path}: run `lakecdc setup` first.")
    ensure_table(spark, silver_path, SILVER_CHANGES, "lakecdc silver/changes")
    ensure_table(spark, quarantine_path, SILVER_QUARANTINE, "lakecdc silver/quarantine")
    _require_checkpoint_if_written(spark, silver_path, _checkpoint(checkpoint_root, "changes"))


def _checkpoint(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def _start_changes(spark: SparkSession, bronze_path: str, silver_path: str,
                   checkpoint_root: str, known_tables: Iterable[str], once: bool,
                   trigger_interval: str) -> StreamingQuery:
    bronze = spark.readStream.format("delta").load(bronze_path)
    writer = (parse_changes(bronze, tuple(known_tables)).writeStream.format("delta")
              .outputMode("append"))
    return _start(spark, writer, "changes", _checkpoint(checkpoint_root, "changes"), once,
                  trigger_interval, silver_path)


def _start_quarantine(spark: SparkSession, bronze_path: str, silver_path: str,
                      quarantine_path: str, checkpoint_root: str, once: bool,
                      trigger_interval: str) -> StreamingQuery:
    # skipChangeCommits: reprocess-silver's replacing commits are not new rows (it writes
    # the quarantine of its range itself).
    changes = (spark.readStream.format("delta").option("skipChangeCommits", "true")
               .load(silver_path).select(*QuarantineWriter.KEY, "error"))
    writer = changes.writeStream.foreachBatch(QuarantineWriter(bronze_path, quarantine_path))
    # A checkpoint directory of its own: the quarantine query used to read bronze (its
    # checkpoint was "quarantine"), and a checkpoint cannot change its source table.
    return _start(spark, writer, "quarantine",
                  _checkpoint(checkpoint_root, QUARANTINE_CHECKPOINT), once, trigger_interval)


def _start(spark: SparkSession, writer, name: str, checkpoint: str, once: bool,
           trigger_interval: str, path: str | None = None) -> StreamingQuery:
    remove_incomplete_writes(spark, checkpoint)      # a kill mid-write must not wedge it
    writer = writer.queryName(f"lakecdc_silver_{name}").option("checkpointLocation",
                                                                checkpoint)
    writer = (writer.trigger(availableNow=True) if once
              else writer.trigger(processingTime=trigger_interval))
    return writer.start(path) if path is not None else writer.start()


def _await(queries: list[StreamingQuery], stop: threading.Event | None,
           poll_s: float) -> None:
    """Until every query has ended or ``stop`` is set; a failure stops them all and is
    raised."""
    try:
        while any(q.isActive for q in queries) and not (stop is not None and stop.is_set()):
            for query in queries:
                query.awaitTermination(poll_s)     # raises the query's error if it failed
        for query in queries:
            if query.exception() is not None:
                raise query.exception()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()


def ensure_table(spark: SparkSession, path: str, schema: StructType, description: str) -> None:
    """Create the append-only Delta table at ``path`` if absent; check its schema if not."""
    table = (DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
             .comment(description))
    for key, value in TABLE_PROPERTIES.items():
        table = table.property(key, value)
    table.execute()
    actual = DeltaTable.forPath(spark, path).toDF().schema
    if [(f.name, f.dataType) for f in actual] != [(f.name, f.dataType) for f in schema]:
        raise UserError(f"the table at {path} does not have the silver schema of this "
                        f"lakecdc version (found {actual.simpleString()}); move it away and "
                        "rebuild silver from bronze.")


def _require_checkpoint_if_written(spark: SparkSession, path: str, checkpoint: str) -> None:
    """Refuse to stream into a table that has streamed commits but no checkpoint (F18).

    Version 0 is ``ensure_table``'s creation; anything later was written by the stream, and
    without its checkpoint (query id and offsets) the sink could not recognise its own
    batches: every bronze row would be appended a second time.
    """
    if _version(spark, path) <= 0 or _exists(spark, f"{checkpoint}/metadata"):
        return
    raise UserError(f"the Delta table {path} already holds streamed rows but its checkpoint "
                    f"{checkpoint} is missing: restore the checkpoint, or rebuild by moving "
                    "away both the table and the checkpoint (then rebuild what reads it).")


def _exists(spark: SparkSession, path: str) -> bool:
    # Through Spark, so that the same check works for local paths and object stores.
    try:
        spark.read.format("text").load(path)
        return True
    except AnalysisException:
        return False


def _version(spark: SparkSession, path: str) -> int:
    """The table's latest version; -1 if there is no table yet."""
    if not DeltaTable.isDeltaTable(spark, path):
        return -1
    return DeltaTable.forPath(spark, path).history(1).collect()[0]["version"]


def _rows_since(spark: SparkSession, path: str, version: int) -> int:
    """Rows added after ``version``, from the commits' operation metrics (log only): an
    append's ``numOutputRows``, an insert-only MERGE's ``numTargetRowsInserted``."""
    history = DeltaTable.forPath(spark, path).history().where(f"version > {version}")
    total = 0
    for row in history.select("operationMetrics").collect():
        metrics = row["operationMetrics"] or {}
        total += int(metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0)))
    return total
