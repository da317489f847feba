"""One micro-batch of bronze rows into silver, exactly once (docs/silver.md).

``SilverWriter`` is the silver half of the one-pass stream (``pipelines.run.stream``):
``parse`` brings the batch's bronze rows to the driver as Arrow (``batch_rows``) and
parses them once (``silver.parse``) for silver and gold alike; ``append`` appends one row
per bronze row to ``silver/changes`` and the batch's failed rows (raw JSON and the error)
to ``silver/quarantine``, both through the pipeline's engine (``core.engine``: delta-rs, or,
where only Spark reaches storage, Spark's Delta: ``LAKECDC_WRITER=spark``). The stream
bounds a batch's size, and so the driver's memory (``pipelines.run.stream.BATCH_BYTES``).

- **Exactly once per table.** Each append carries a Delta app transaction
  (``lakecdc-silver`` / ``lakecdc-quarantine``, version = the stream's batch id) and the
  batch id in its metadata: a batch that re-runs after a kill between the append and
  Spark's checkpoint commit is recognised by the app transaction and skipped by this writer
  (delta-rs records a transaction but skips nothing; Spark would skip it too). Never by the
  metadata: a pipeline stopped longer than the log
  retention finds that commit cleaned away, its app transaction still in the checkpoint
  (F30). The stream's checkpoint is the record of which bronze rows a batch id covers, so
  ``pipelines.run.stream.check_checkpoint`` refuses to stream into a table that holds
  streamed batches its checkpoint does not know (F18, ``last_batch``).
- **Arrow and delta-rs, not Spark jobs.** A Spark parse and append cost a continuous
  batch 0.6-0.75 s whatever its size, and a catch-up about 45 CPU-µs a row; the Arrow parse
  and delta-rs append cost a fraction of either (docs/silver.md, "Delivery").
- **Append-only.** Both tables are created up front with an explicit schema and
  ``delta.appendOnly=true``, so analysts and other engines can read them as streams.
- **Never raises on data.** A row that cannot be parsed becomes an ``error`` row in
  ``silver/changes`` and a quarantine row; gold decides what that means.
- **Ordering.** Rows within a batch are unordered; every row carries
  ``(commit_lsn, seq, tx_changes)`` so readers order by key and know when they hold a whole
  transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterable
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from core.commits import commit_metadata
from core.engine.api import Engine
from core.engine.spark_delta import recorded
from core.errors import UserError
from core.handle import CHECKPOINTS
from core.layout import QUARANTINE, SILVER, Table
from core.spark_tables import create_table
from core.switches import NONE, Switches
from silver.parse import BRONZE_COLUMNS, parse_table, quarantine_table
from silver.schema import SILVER_ADDED, SILVER_CHANGES, SILVER_QUARANTINE

log = logging.getLogger("lakecdc.silver")

APP_ID = "lakecdc-silver"
# Set on a silver table that gained columns (``ensure_table``'s ``added``) after holding rows:
# the version of the ALTER that added them (the mirrors read silver from the next one).
ADDED_AT_PROPERTY = "lakecdc.addedColumnsAfterVersion"
QUARANTINE_APP_ID = "lakecdc-quarantine"
TABLE_PROPERTIES = {
    "delta.appendOnly": "true",
    **CHECKPOINTS,              # one append per micro-batch (core.handle)
    # File statistics on the columns readers select silver rows by (``STATS_COLUMNS``), not
    # on the keys, maps and messages after them: Delta computes them row by row as it
    # writes, a fifth to a third of an append's time in a continuous stream (docs/silver.md).
    "delta.dataSkippingNumIndexedCols": "9",
}
STATS_COLUMNS = SILVER_CHANGES.names[:int(TABLE_PROPERTIES["delta.dataSkippingNumIndexedCols"])]


@dataclass(frozen=True)
class SilverLocations:
    """Where silver reads and writes, as Spark must see the paths (``s3a://`` for S3
    outside Databricks)."""

    bronze_path: str
    silver_path: str
    quarantine_path: str

    @classmethod
    def from_config(cls, config) -> "SilverLocations":
        from core.storage import on_databricks, spark_path

        def path(table: Table) -> str:
            return spark_path(config.table_path(table), on_databricks())

        return cls(bronze_path=spark_path(config.bronze_path, on_databricks()),
                   silver_path=path(SILVER),
                   quarantine_path=path(QUARANTINE))


@dataclass(frozen=True)
class ParsedBatch:
    """One micro-batch on the driver: its bronze rows and their silver rows, row for row."""

    bronze: pa.Table
    rows: pa.Table              # ``silver.parse.CHANGES_ARROW``
    errors: int                 # rows with ``error`` set
    commit_lsn: int | None      # the newest source commit among the rows
    commit_ts: datetime | None


@dataclass(frozen=True)
class SilverBatch:
    """What one batch added to silver (nothing when ``replayed``: Delta skipped it)."""

    rows: int
    quarantined: int
    commit_lsn: int | None          # the newest source commit among the batch's rows
    commit_ts: datetime | None


class SilverWriter:
    def __init__(self, silver_path: str, quarantine_path: str,
                 known_tables: Iterable[str], switches: Switches = NONE,
                 counted_tables: Iterable[str] | None = None,
                 refresh_known: Callable[[], Iterable[str]] | None = None,
                 storage_options: dict | None = None, engine: Engine | None = None) -> None:
        self.silver_path = silver_path
        self.storage_options = storage_options      # delta-rs's, for a lakehouse on S3
        self.quarantine_path = quarantine_path
        self.known_tables = tuple(known_tables)
        # Read before each batch when the captured set can change while running (``lakecdc
        # tables add``): a batch is parsed with a set at least as new as its rows.
        self.refresh_known = refresh_known
        # The tables whose changes must carry id and the dims (``silver.parse``).
        self.counted_tables = None if counted_tables is None else tuple(counted_tables)
        # ``silver_txn`` off: no txn ids (negative controls only).
        self.guard = switches.on("silver_txn")
        # path -> the newest batch id this writer knows the table holds (read once per
        # process, or again after a failure); a replayed batch is skipped before any write.
        self._written: dict[str, int] = {}
        # Every append goes through ``engine`` (None: delta-rs, with ``storage_options``),
        # which keeps its handle on each table between commits (``core.engine.delta_rs``).
        if engine is None:
            from core.engine.delta_rs import DeltaRs

            engine = DeltaRs(storage_options)
        self.engine = engine
        # A performance choice, not a semantic one: on delta-rs the batch's bronze files are
        # read here by pyarrow where they are local (``batch_rows``); where every read must
        # go through Spark (``LAKECDC_WRITER=spark``), Spark collects the batch.
        self._local_files = engine.name == "delta-rs"

    def prepare(self, spark: SparkSession) -> None:
        """Create both tables if absent; refuse a table of another schema."""
        ensure_silver_tables(spark, self.silver_path, self.quarantine_path)

    def parse(self, bronze: DataFrame) -> ParsedBatch:
        """The batch's bronze rows on the driver (``batch_rows``), parsed once."""
        if self.refresh_known is not None:
            self.known_tables = tuple(self.refresh_known())
        table = batch_rows(bronze, local_files=self._local_files)
        rows = parse_table(table, self.known_tables, self.counted_tables)
        lsn = rows.column("commit_lsn").to_numpy()
        newest = int(np.argmax(lsn)) if len(lsn) else None
        return ParsedBatch(
            table, rows, rows.num_rows - rows.column("error").null_count,
            None if newest is None else int(lsn[newest]),
            None if newest is None else rows.column("commit_ts")[newest].as_py())

    def append(self, spark: SparkSession, parsed: ParsedBatch, batch_id: int) -> SilverBatch:
        """Append the parsed batch to ``silver/changes`` and its failed rows to
        ``silver/quarantine``; returns what was written.

        A replay (a table's app transaction records the batch id already) appends nothing
        to that table."""
        try:
            rows = self._append(spark, parsed.rows, self.silver_path, APP_ID, batch_id)
            quarantined = 0
            if parsed.errors:
                quarantined = self._append(spark, quarantine_table(parsed.bronze, parsed.rows),
                                           self.quarantine_path, QUARANTINE_APP_ID, batch_id)
                log.warning("silver batch %d: %d bronze rows failed to parse; see %s",
                            batch_id, parsed.errors, self.quarantine_path)
        except BaseException:
            self._written.clear()          # a failed append may have committed: read again
            raise
        return SilverBatch(rows, quarantined, parsed.commit_lsn, parsed.commit_ts)

    def _append(self, spark: SparkSession, rows: pa.Table, path: str, app_id: str,
                batch_id: int) -> int:
        """Append ``rows`` as batch ``batch_id`` with the app transaction ``(app_id,
        batch_id)``; returns the rows written (0: the table records the batch already).
        ``silver_txn`` off: no app transaction, nothing skipped."""
        meta = commit_metadata("silver", batch_id=batch_id, rows=rows.num_rows)
        app = (app_id, batch_id) if self.guard else None
        if self.guard:
            # delta-rs records app transactions and skips nothing (Spark would skip a
            # recorded one itself): the version the table records is read once per process
            # (this writer is the table's only one), and after a failure, which may have
            # committed.
            if path not in self._written:
                found = self.engine.recorded(path)
                version = None if found is None else found.version_of(app_id)
                self._written[path] = -1 if version is None else version
            if self._written[path] >= batch_id:
                return 0
        if not self.engine.append(path, rows, meta=meta, app=app):
            return 0                                # Spark skipped it: recorded already
        self._written[path] = batch_id
        return rows.num_rows


def batch_rows(batch: DataFrame, columns: Iterable[str] = BRONZE_COLUMNS, *,
               local_files: bool = True) -> pa.Table:
    """A stream micro-batch's rows (``columns``) on the driver, as Arrow; by default the
    bronze columns the parse reads.

    A Delta stream's batch of an append-only table (bronze; ``silver/changes`` for the
    mirrors) is a set of whole Parquet files: the Delta source refuses any other commit,
    and neither table is partitioned or has deletion vectors, so its files hold exactly its
    rows. When the batch is such files on a local lakehouse (``batch_files``), pyarrow reads
    them itself: 0.3-1.0 s for the benchmark's 308,289 bronze rows, where Spark's
    ``toArrow`` took 2-4 s (docs/silver.md, "Parsing"). Otherwise (S3, Databricks, any other
    plan) Spark collects the batch, and always with ``local_files=False`` (every read through
    Spark: ``LAKECDC_WRITER=spark``)."""
    files = batch_files(batch) if local_files else None
    if files:
        try:
            return pq.ParquetDataset(files).read(columns=list(columns))
        except (OSError, pa.ArrowException, KeyError):    # unreadable here: Spark reads it
            log.debug("batch files read by Spark instead", exc_info=True)
    return batch.select(*columns).toArrow()


_PASS_THROUGH_RDDS = ("org.apache.spark.sql.execution.SQLExecutionRDD",
                      "org.apache.spark.rdd.MapPartitionsRDD")
_FILE_SCAN_RDD = "org.apache.spark.sql.execution.datasources.FileScanRDD"


def batch_files(bronze: DataFrame) -> list[str] | None:
    """The local files whose rows are exactly ``bronze``'s, or None.

    ``foreachBatch`` hands over a batch as a plan over the RDD Spark computed for it; that
    RDD is a file scan under row-by-row steps (a projection, columnar to rows). The files
    are taken only when that chain is all there is (no union, no shuffle, no other source)
    and the scan reads every byte of every file it names (its splits of each file, put
    together, cover it from 0 to its size); anything else is None."""
    try:
        plan = bronze._jdf.queryExecution().logical()
        if not plan.getClass().getName().endswith(".LogicalRDD"):
            return None
        rdd = plan.rdd()
        while rdd.getClass().getName() in _PASS_THROUGH_RDDS:
            dependencies = rdd.dependencies()
            if dependencies.size() != 1:
                return None
            rdd = dependencies.apply(0).rdd()
        if rdd.getClass().getName() != _FILE_SCAN_RDD:
            return None
        partitions = rdd.filePartitions()
        splits = [(split.filePath().toString(), split.start(), split.length(),
                   split.fileSize())
                  for i in range(partitions.size()) for split in partitions.apply(i).files()]
    except Exception:                                   # not a classic session, or no plan
        return None
    return whole_local_files(splits)


def whole_local_files(splits: list[tuple[str, int, int, int]]) -> list[str] | None:
    """The local paths of the files a scan's splits ``(uri, start, length, file size)``
    read whole, or None when a split is not local or a byte of a file is left out."""
    spans: dict[str, list[tuple[int, int]]] = {}
    sizes: dict[str, set[int]] = {}
    for uri, start, length, size in splits:
        spans.setdefault(uri, []).append((start, length))
        sizes.setdefault(uri, set()).add(size)
    for uri, parts in spans.items():
        if urlparse(uri).scheme != "file" or len(sizes[uri]) != 1:
            return None
        end = 0
        for start, length in sorted(parts):
            if start != end:                # a gap, or bytes read twice
                return None
            end = start + length
        if end != sizes[uri].pop():
            return None
    return [unquote(urlparse(uri).path) for uri in spans]


def ensure_silver_tables(spark: SparkSession, silver_path: str, quarantine_path: str) -> None:
    """``silver/changes`` and ``silver/quarantine``, created if absent (by the stream, or by
    ``setup`` to register them by name), their schemas checked if not."""
    ensure_table(spark, silver_path, SILVER_CHANGES, "lakecdc silver/changes", SILVER_ADDED)
    ensure_table(spark, quarantine_path, SILVER_QUARANTINE, "lakecdc silver/quarantine")


def ensure_table(spark: SparkSession, path: str, schema: StructType, description: str,
                 added: tuple[str, ...] = ()) -> None:
    """Create the append-only Delta table at ``path`` if absent; check its schema if not.

    ``added``: trailing columns of ``schema`` a table of an older lakecdc lacks; they are
    added (one ``ALTER TABLE``, NULL in the rows already there)."""
    create_table(spark, path, schema, TABLE_PROPERTIES, comment=description)
    actual = DeltaTable.forPath(spark, path).toDF().schema
    fields = [(f.name, f.dataType) for f in schema]
    if added and [(f.name, f.dataType) for f in actual] == fields[:-len(added)]:
        missing = ", ".join(f"`{f.name}` {f.dataType.simpleString()}"
                            for f in schema.fields[-len(added):])
        before = DeltaTable.forPath(spark, path).history(1).first()["version"]
        if before > 0:      # rows are there: mark where the new columns start
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                      f"('{ADDED_AT_PROPERTY}' = '{before + 2}')")
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({missing})")
        log.info("silver table %s: added columns %s", path, ", ".join(added))
        actual = DeltaTable.forPath(spark, path).toDF().schema
    if [(f.name, f.dataType) for f in actual] != fields:
        raise UserError(f"the table at {path} does not have the silver schema of this "
                        f"lakecdc version (found {actual.simpleString()}); move it away and "
                        "rebuild silver from bronze.")


def last_batch(spark: SparkSession, path: str) -> int | None:
    """The newest stream batch id appended to the silver table at ``path`` (its app
    transaction ``lakecdc-silver``), or None."""
    found = recorded(spark, path)
    return None if found is None else found.version_of(APP_ID)
