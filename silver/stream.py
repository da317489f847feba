"""``lakecdc silver [--once]``: the bronze → silver streaming job (DESIGN §3.2).

Two Structured Streaming queries read bronze, each through the built-in Delta sink with its
own checkpoint under ``checkpoint_root``:

- ``changes``: ``parse_changes`` → ``silver/changes``, one row per bronze row;
- ``quarantine``: ``quarantine_rows`` → ``silver/quarantine``, the failed rows with their
  raw JSON and error.

Why quarantine reads bronze, not ``silver/changes``: the raw JSON is not a silver column
(carrying it for every row to serve the rare failed one would nearly double silver), and
both queries apply the same deterministic rules to the same rows, so ``silver/changes``
rows with ``error`` set and ``silver/quarantine`` hold the same keys once both have
drained. The price is a second JSON parse of each bronze row. (One ``foreachBatch`` query
writing both tables would parse once, but would have to re-create the sink's idempotence
by hand; DESIGN §3.2 asks for the built-in sink.)

Delivery guarantees:

- **Exactly once per table.** The Delta sink commits each micro-batch with the query id
  and batch id as a Delta app transaction; a batch that re-runs after a crash between the
  sink's commit and the checkpoint's commit file (F11) is recognised and skipped. The
  checkpoint is the record of progress: deleting it while the table holds streamed rows
  would append every bronze row again, so ``start_silver`` refuses to start then (F18).
- **Append-only.** Both tables are created up front with an explicit schema and
  ``delta.appendOnly=true``, so downstream streams (gold) can read them as streaming
  sources, and the quarantine table exists before its first row.
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
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from pipelines.config import Config
from pipelines.errors import UserError
from silver.parse import parse_changes, quarantine_rows
from silver.schema import SILVER_CHANGES, SILVER_QUARANTINE

log = logging.getLogger("lakecdc.silver")

TABLE_PROPERTIES = {
    "delta.appendOnly": "true",
    # Streaming appends make many small commits: checkpoint the log often (DESIGN §5).
    "delta.checkpointInterval": "20",
    "delta.logRetentionDuration": "interval 30 days",
}
DEFAULT_TRIGGER_INTERVAL = "10 seconds"


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
    """Create the silver tables if absent and start both queries; returns them running.

    Raises ``UserError`` if bronze is missing, a silver table has another schema, or a
    table holds streamed rows but its checkpoint is gone.
    """
    known = tuple(known_tables)
    if not DeltaTable.isDeltaTable(spark, bronze_path):
        raise UserError(f"no bronze table at {bronze_path}: run `lakecdc setup` first.")
    cp_root = checkpoint_root.rstrip("/")
    plan = [("changes", silver_path, SILVER_CHANGES, parse_changes),
            ("quarantine", quarantine_path, SILVER_QUARANTINE, quarantine_rows)]
    for name, path, schema, _ in plan:
        ensure_table(spark, path, schema, f"lakecdc silver/{name}")
        _require_checkpoint_if_written(spark, path, f"{cp_root}/{name}")

    queries: list[StreamingQuery] = []
    try:
        for name, path, _, transform in plan:
            bronze = spark.readStream.format("delta").load(bronze_path)
            queries.append(_start(transform(bronze, known), path, f"{cp_root}/{name}",
                                  f"lakecdc_silver_{name}", once, trigger_interval))
    except BaseException:
        for query in queries:
            query.stop()
        raise
    return queries


def run_silver(spark: SparkSession, bronze_path: str, silver_path: str, quarantine_path: str,
               checkpoint_root: str, known_tables: Iterable[str], once: bool = True,
               stop: threading.Event | None = None, poll_s: float = 1.0,
               trigger_interval: str = DEFAULT_TRIGGER_INTERVAL) -> SilverRun:
    """Run both queries until they finish (``once``), ``stop`` is set, or one fails.

    A failure of either query stops the other and is raised. Returns what this run added.
    """
    started = time.monotonic()
    before = {p: _version(spark, p) for p in (silver_path, quarantine_path)}
    queries = start_silver(spark, bronze_path, silver_path, quarantine_path, checkpoint_root,
                           known_tables, once, trigger_interval)
    try:
        while any(q.isActive for q in queries) and not (stop is not None and stop.is_set()):
            for query in queries:
                # Raises the query's exception if it failed.
                query.awaitTermination(poll_s)
        for query in queries:
            if query.exception() is not None:
                raise query.exception()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
    run = SilverRun(_rows_since(spark, silver_path, before[silver_path]),
                    _rows_since(spark, quarantine_path, before[quarantine_path]),
                    time.monotonic() - started)
    log.info("silver: %d rows, %d quarantined, in %.1fs", run.changes_rows,
             run.quarantined_rows, run.seconds)
    if run.quarantined_rows:
        log.warning("silver: %d bronze rows failed to parse; see %s", run.quarantined_rows,
                    quarantine_path)
    return run


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


def _start(rows: DataFrame, path: str, checkpoint: str, name: str, once: bool,
           trigger_interval: str) -> StreamingQuery:
    writer = (rows.writeStream.format("delta").outputMode("append").queryName(name)
              .option("checkpointLocation", checkpoint))
    writer = (writer.trigger(availableNow=True) if once
              else writer.trigger(processingTime=trigger_interval))
    return writer.start(path)


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
    """Rows appended after ``version``, from the commits' operation metrics (log only)."""
    history = DeltaTable.forPath(spark, path).history().where(f"version > {version}")
    return sum(int((row["operationMetrics"] or {}).get("numOutputRows", 0))
               for row in history.select("operationMetrics").collect())
