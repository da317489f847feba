"""Spark's Delta (an engine of ``core.engine``): lakecdc's tables read and written through
Spark, for workspaces where only Spark can reach storage (``LAKECDC_WRITER=spark``; Unity
Catalog external locations), and so the one place that turns a driver's Arrow rows into a
governed Delta commit.

Each writer (bronze's shipper, silver, gold, the mirrors) keeps one ``SparkDelta``. The
rows come as Arrow, as on the delta-rs path, and every commit carries what that path's
carries:

- lakecdc's metadata as ``commitInfo.userMetadata`` (``core.commits``), where both engines'
  readers find it;
- at most one Delta app transaction ``(app id, version)``: Spark records one per commit
  (``txnAppId``/``txnVersion``) and skips a write whose version it has recorded already
  (delta-rs records several and skips none). Whoever needs more progress than one number
  keeps it in the metadata (``bronze.spark_table``).

An append or overwrite takes the transaction as write options. A MERGE takes it, and the
metadata, as the session's SQL settings (``spark.databricks.delta.write.txnAppId``,
``…txnVersion``, ``…commitInfo.userMetadata``), so each ``SparkWrites`` works in a session
of its own (``newSession``: the same JVM and cluster, its own settings) and one MERGE at a
time: settings set for one writer's commit never reach another's.

Spark commits a MERGE that changes no row, so ``merge`` needs no stand-in commit for the
metadata (``core.engine.delta_rs.merge_recorded`` does on delta-rs).

What a table records for an app id (``recorded``) is read from Delta's snapshot of it in the
JVM: Spark's Delta has no public reader of app transactions but its own skip of a recorded
write, and a decision taken before a write (gold's step handed to the dashboard, which
steps of ``_deltas`` gold holds) needs the number itself. The commit history would do only
while the log keeps the commit (F30).
"""

from __future__ import annotations

import threading

import pyarrow as pa

from core.commits import Commit, Recorded, parse_commit_metadata
from core.maintenance import TableReport, TableSize
from core.storage import on_databricks, spark_path
from core.switches import NONE

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# Copied into a writer's own session from the one it was made from.
_INHERITED = ("spark.sql.session.timeZone",)


class SparkDelta:
    """The ``core.engine.api.Engine`` of Spark's Delta: one writer's reads and commits, in a
    session of its own (see the module's text)."""

    name = "spark"

    def __init__(self, spark) -> None:
        self._spark = spark.newSession()
        for key in _INHERITED:
            value = spark.conf.get(key, None)
            if value is not None:
                self._spark.conf.set(key, value)
        self._lock = threading.Lock()

    @property
    def spark(self):
        """This writer's session (reads it makes see what its writes committed)."""
        return self._spark

    def frame(self, rows: pa.Table, path: str | None = None):
        """``rows`` as a Spark DataFrame; with ``path``, in that table's column order and
        types, so an append never changes its schema (Delta checks NOT NULL as it writes)."""
        from pyspark.sql import functions as F

        frame = self._spark.createDataFrame(rows)
        if path is None:
            return frame
        schema = self._spark.read.format("delta").load(_p(path)).schema
        return frame.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name)
                              for f in schema])

    # -- reading -------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        from core.spark_tables import is_table

        return is_table(self._spark, _p(path))

    def version(self, path: str) -> int | None:
        return self._version(_p(path)) if self.exists(path) else None

    def read(self, path: str, columns: list[str] | None = None, where: str | None = None,
             version: int | None = None) -> pa.Table:
        reader = self._spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        frame = reader.load(_p(path))
        if where is not None:
            frame = frame.where(where)
        return (frame if columns is None else frame.select(*columns)).toArrow()

    def properties(self, path: str) -> dict[str, str]:
        from delta.tables import DeltaTable

        return dict(DeltaTable.forPath(self._spark, _p(path)).detail().first().properties)

    def recorded(self, path: str) -> Recorded | None:
        return recorded(self._spark, _p(path))

    def commits(self, path: str, layer: str = "gold", limit: int | None = None,
                up_to: int | None = None, mentioning: str | None = None) -> list[Commit]:
        return read_commits(self._spark, _p(path), layer, limit, up_to, mentioning)

    def commit_time(self, path: str, version: int) -> float | None:
        from core.engine.spark_maintenance import commit_time_spark

        return commit_time_spark(self._spark, _p(path), version)

    def size(self, path: str) -> TableSize | None:
        from core.engine.spark_maintenance import table_size_spark

        return table_size_spark(self._spark, _p(path))

    def maxima(self, path: str, columns: list[str]) -> tuple[int, dict] | None:
        """(A MAX aggregate, which Delta answers from the same per-file statistics.)"""
        import datetime as dt

        from pyspark.sql import functions as F

        if not self.exists(path):
            return None
        version = self._version(_p(path))
        row = self._spark.read.format("delta").option("versionAsOf", version).load(
            _p(path)).agg(*[F.max(c).alias(c) for c in columns]).first()
        found = {}
        for column in columns:
            value = row[column]
            if isinstance(value, dt.datetime) and value.tzinfo is None:   # the local time
                value = value.astimezone(dt.timezone.utc)
            found[column] = value
        return version, found

    def count(self, path: str) -> int | None:
        """(Delta answers the count from the per-file statistics.)"""
        if not self.exists(path):
            return None
        return self._spark.read.format("delta").load(_p(path)).count()

    def stream_position(self, checkpoint_dir: str, replayed: bool = False) -> int | None:
        from core.engine.spark_maintenance import stream_position_spark

        return stream_position_spark(self._spark, _p(checkpoint_dir), replayed=replayed)

    # -- writing -------------------------------------------------------------------------
    def create(self, path: str, schema: pa.Schema, properties: dict[str, str] | None = None,
               comment: str | None = None, partitioned_by: tuple[str, ...] = ()) -> None:
        """(``core.spark_tables.create_table``: ``append`` writes only into an existing table.)
        An Arrow timestamp without a zone is Spark's ``TIMESTAMP_NTZ``, as on delta-rs (a
        mirror of a ``timestamp without time zone`` column keeps its wall-clock values)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from core.spark_tables import create_table

        create_table(self._spark, _p(path), from_arrow_schema(schema, prefer_timestamp_ntz=True),
                     properties or {}, comment=comment, partitioned_by=partitioned_by)

    def delete(self, path: str, where: str, *, meta: str | None = None) -> None:
        from delta.tables import DeltaTable

        with self._lock:
            if meta is not None:
                self._spark.conf.set(_METADATA, meta)
            try:
                DeltaTable.forPath(self._spark, _p(path)).delete(where)
            finally:
                self._spark.conf.unset(_METADATA)

    def append(self, path: str, rows: pa.Table, *, meta: str | None = None,
               app: tuple[str, int] | None = None, overwrite: bool = False) -> bool:
        path = _p(path)
        before = self._version(path) if app is not None else None
        writer = (self.frame(rows, path).write.format("delta")
                  .mode("overwrite" if overwrite else "append"))
        if meta is not None:
            writer = writer.option("userMetadata", meta)
        if app is not None:
            writer = writer.option("txnAppId", app[0]).option("txnVersion", str(app[1]))
        with self._lock:
            writer.save(path)
        return before is None or self._version(path) != before

    def merge(self, path: str, source: pa.Table, on: str, *, update: dict | None = None,
              insert: dict | None = None, delete: str | None = None,
              update_when: str | None = None, insert_when: str | None = None,
              delete_unmatched: bool = False, meta: str | None = None,
              app: tuple[str, int] | None = None) -> dict:
        """(Zeros when Spark skipped it: ``app`` recorded.)"""
        from delta.tables import DeltaTable

        with self._lock:
            conf = {_TXN_APP: app[0], _TXN_VERSION: str(app[1])} if app is not None else {}
            if meta is not None:
                conf[_METADATA] = meta
            for key, value in conf.items():
                self._spark.conf.set(key, value)
            try:
                builder = (DeltaTable.forPath(self._spark, _p(path)).alias("t")
                           .merge(self.frame(source).alias("s"), on))
                if delete is not None:
                    builder = builder.whenMatchedDelete(condition=delete)
                if update is not None:
                    builder = builder.whenMatchedUpdate(condition=update_when, set=update)
                if insert is not None:
                    builder = builder.whenNotMatchedInsert(condition=insert_when,
                                                           values=insert)
                if delete_unmatched:
                    builder = builder.whenNotMatchedBySourceDelete()
                result = builder.execute()
            finally:
                for key in conf:
                    self._spark.conf.unset(key)
        row = result.first() if result is not None else None
        counts = row.asDict() if row is not None else {}
        return {"num_target_rows_updated": int(counts.get("num_updated_rows") or 0),
                "num_target_rows_inserted": int(counts.get("num_inserted_rows") or 0),
                "num_target_rows_deleted": int(counts.get("num_deleted_rows") or 0)}

    # -- keeping a table small -----------------------------------------------------------
    def maintain(self, name: str, path: str, *, retention_hours: int,
                 log_retention_minutes: int, reader_floor: int | None = None,
                 log_floor: int | None = None, now: float | None = None,
                 target_bytes: int | None = None, switches=NONE) -> TableReport:
        """(``switches``: no fault point on this engine's steps.)"""
        from core.engine.spark_maintenance import maintain_table_spark

        extra = {} if target_bytes is None else {"target_bytes": target_bytes}
        return maintain_table_spark(self, name, _p(path), retention_hours=retention_hours,
                                    log_retention_minutes=log_retention_minutes,
                                    reader_floor=reader_floor, log_floor=log_floor, now=now,
                                    **extra)

    def clean_log(self, path: str, *, log_retention_minutes: int,
                  log_floor: int | None = None) -> str | None:
        from core.engine.spark_maintenance import clean_log_spark

        return clean_log_spark(self, _p(path), log_retention_minutes=log_retention_minutes,
                               log_floor=log_floor)

    def check_writable(self, root: str, lakehouse=None) -> None:
        """(``core.store_checks.check_spark_writable``: Spark, the only engine holding the
        credentials then, writes and reads back a probe.)"""
        from core.store_checks import check_spark_writable

        check_spark_writable(self._spark, root)

    def sibling(self) -> "SparkDelta":
        """Another ``SparkDelta`` in a session of its own, so its commits never wait for
        this one's (each takes one commit at a time)."""
        return SparkDelta(self._spark)

    def reset(self, path: str) -> None:
        """Nothing to do: Spark's Delta reads a table's newest snapshot at each commit."""

    def _version(self, path: str) -> int:
        from delta.tables import DeltaTable

        return int(DeltaTable.forPath(self._spark, path).history(1).first()["version"])


def _p(path: str) -> str:
    """How Spark must be given the table at ``path``."""
    return spark_path(path, on_databricks())


def read_commits(spark, path: str, layer: str = "gold", limit: int | None = None,
                 up_to: int | None = None, mentioning: str | None = None) -> list[Commit]:
    """The latest ``limit`` commits (all if None) of the Delta table at ``path`` with
    versions ``<= up_to`` (any if None), newest first; [] if there is no table.
    ``mentioning``: only commits whose metadata text contains it (filtered before the
    driver collects a long history).

    A local table's log is read by delta-rs: a Spark history is a job or two, 0.3-0.7 s on
    2 cores, and a ``run --once`` reads several before its first batch."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from core.engine.delta_rs import read_commits_rs
    from core.storage import delta_rs_uri

    if path.startswith(("/", "file:")) and not on_databricks():
        from deltalake import DeltaTable as RsTable

        uri = delta_rs_uri(path)
        return read_commits_rs(uri, layer=layer, limit=limit, up_to=up_to,
                               mentioning=mentioning) if RsTable.is_deltatable(uri) else []
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    history = DeltaTable.forPath(spark, path).history(limit)
    if up_to is not None:
        history = history.where(F.col("version") <= up_to)
    if mentioning is not None:
        history = history.where(F.col("userMetadata").contains(mentioning))
    rows = history.select("version", "userMetadata").orderBy(F.desc("version")).collect()
    return [Commit(r.version, parse_commit_metadata(r.userMetadata, layer)) for r in rows]


def recorded(spark, path: str) -> Recorded | None:
    """What the newest snapshot of the Delta table at ``path`` (Spark's path) records, or
    None if there is no table. A local table is read by delta-rs (as ``read_commits``:
    no Spark job); any other through Spark (``recorded_spark``: a classic session)."""
    from core.engine.delta_rs import recorded_rs
    from core.storage import delta_rs_uri

    if path.startswith(("/", "file:")) and not on_databricks():
        return recorded_rs(delta_rs_uri(path))
    return recorded_spark(spark, path)


def recorded_spark(spark, path: str) -> Recorded | None:
    """What the newest snapshot of the Delta table at ``path`` records
    (``core.commits.Recorded``), read by Spark's Delta in the JVM; None if there is no table.

    One snapshot, brought up to date (``DeltaLog.update`` with its defaults, whatever their
    number), and its app transactions (``Snapshot.transactions``, the map Spark's own skip of
    a recorded write reads). Reached through ``io.delta.tables.DeltaTable``, which every
    distribution of Delta has, not by the name of Delta's log class. Needs a classic
    session: Spark Connect has no JVM handle, and lakecdc's writers refuse it
    (``core.spark.require_classic``)."""
    from delta.tables import DeltaTable

    from core.spark import is_connect

    if is_connect(spark):
        raise RuntimeError("the version a Delta table records for an app id is read in a "
                           "classic Spark session only")
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    log = DeltaTable.forPath(spark, path)._jdt.deltaLog()
    snapshot = log.update(*_defaults(log, "update"))
    transactions = snapshot.transactions()

    def version_of(app_id: str) -> int | None:
        found = transactions.get(app_id)
        return int(found.get()) if found.isDefined() else None

    return Recorded(int(snapshot.version()), version_of)


def _defaults(target, method: str) -> list:
    """The default arguments of the Scala ``method`` of JVM object ``target`` (Scala names
    them ``method$default$1``, …), so a call leaves each as it is."""
    from py4j.protocol import Py4JError

    found = []
    while True:
        try:
            found.append(getattr(target, f"{method}$default${len(found) + 1}")())
        except Py4JError:
            return found
