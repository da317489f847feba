"""lakecdc's writes through Spark's Delta: the path for workspaces where only Spark can
reach storage (``LAKECDC_WRITER=spark``; Unity Catalog external locations), and so the
one place that turns a driver's Arrow rows into a governed Delta commit.

Each writer (bronze's shipper, silver, gold, the mirrors) keeps one ``SparkWrites``. The
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
metadata (``core.commits.merge_recorded`` does on delta-rs).

What a table records for an app id (``recorded``) is read from Delta's snapshot of it in the
JVM: Spark's Delta has no public reader of app transactions but its own skip of a recorded
write, and a decision taken before a write (gold's step handed to the dashboard, which
steps of ``_deltas`` gold holds) needs the number itself. The commit history would do only
while the log keeps the commit (F30).
"""

from __future__ import annotations

import threading

import pyarrow as pa

from core.commits import Recorded

_TXN_APP = "spark.databricks.delta.write.txnAppId"
_TXN_VERSION = "spark.databricks.delta.write.txnVersion"
_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# Copied into a writer's own session from the one it was made from.
_INHERITED = ("spark.sql.session.timeZone",)


class SparkWrites:
    """One writer's commits through Spark (see the module's text)."""

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
        schema = self._spark.read.format("delta").load(path).schema
        return frame.select(*[F.col(f"`{f.name}`").cast(f.dataType).alias(f.name)
                              for f in schema])

    def create(self, path: str, schema: pa.Schema, properties: dict[str, str] | None = None,
               comment: str | None = None, partitioned_by: tuple[str, ...] = ()) -> None:
        """Create the Delta table at ``path`` for Arrow ``schema`` unless one is there
        (``core.tables.create_table``): ``append`` writes only into an existing table."""
        from core.tables import create_table

        create_table(self._spark, path, self._spark.createDataFrame(schema.empty_table()).schema,
                     properties or {}, comment=comment, partitioned_by=partitioned_by)

    def read(self, path: str, columns: list[str], where: str | None = None) -> pa.Table:
        """``columns`` of the rows of the Delta table at ``path`` meeting the SQL condition
        ``where`` (all rows: None), as Arrow on the driver."""
        frame = self._spark.read.format("delta").load(path)
        if where is not None:
            frame = frame.where(where)
        return frame.select(*columns).toArrow()

    def delete(self, path: str, where: str, *, meta: str | None = None) -> None:
        """Delete the rows of the Delta table at ``path`` meeting the SQL condition
        ``where``, in one commit with ``meta``."""
        from delta.tables import DeltaTable

        with self._lock:
            if meta is not None:
                self._spark.conf.set(_METADATA, meta)
            try:
                DeltaTable.forPath(self._spark, path).delete(where)
            finally:
                self._spark.conf.unset(_METADATA)

    def append(self, path: str, rows: pa.Table, *, meta: str | None = None,
               app: tuple[str, int] | None = None, overwrite: bool = False) -> bool:
        """Append ``rows`` to the Delta table at ``path`` (replace its rows: ``overwrite``)
        in one commit with ``meta`` and the app transaction ``app``. Returns False when
        Spark skipped it: ``app``'s version is recorded already. Rows or none, the commit is
        made (a progress-only commit holds no rows)."""
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
              update_when: str | None = None, meta: str | None = None,
              app: tuple[str, int] | None = None, insert_when: str | None = None,
              delete_unmatched: bool = False) -> dict:
        """MERGE ``source`` (alias ``s``) into the Delta table at ``path`` (alias ``t``) on
        ``on``, in one commit with ``meta`` and ``app``:

        - ``delete``: a matched row meeting this condition is deleted (checked first);
        - ``update``: other matched rows (meeting ``update_when``, if given) get these
          column expressions;
        - ``insert``: unmatched source rows (meeting ``insert_when``, if given) are
          inserted with these;
        - ``delete_unmatched``: target rows no source row matches are deleted (a mirror's
          TRUNCATE).

        Returns delta-rs's names for the counts (``num_target_rows_updated`` /
        ``…_inserted`` / ``…_deleted``); zeros when Spark skipped it (``app`` recorded)."""
        from delta.tables import DeltaTable

        with self._lock:
            conf = {_TXN_APP: app[0], _TXN_VERSION: str(app[1])} if app is not None else {}
            if meta is not None:
                conf[_METADATA] = meta
            for key, value in conf.items():
                self._spark.conf.set(key, value)
            try:
                builder = (DeltaTable.forPath(self._spark, path).alias("t")
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

    def version(self, path: str) -> int:
        """The table's newest version."""
        return self._version(path)

    def recorded(self, path: str) -> Recorded | None:
        """``recorded_spark`` in this writer's session."""
        return recorded_spark(self._spark, path)

    def _version(self, path: str) -> int:
        from delta.tables import DeltaTable

        return int(DeltaTable.forPath(self._spark, path).history(1).first()["version"])


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


def start_writes(config, spark_factory=None) -> SparkWrites | None:
    """For a command that starts Spark only to write through it: a ``SparkWrites`` on
    ``spark_factory()``'s session (None: ``core.spark``'s for the lakehouse) when ``config``
    sends every write through Spark; else None, and no JVM starts."""
    if not config.spark_writes:
        return None
    if spark_factory is None:
        from core.spark import get_or_create
        from core.storage import Lakehouse

        return SparkWrites(get_or_create(lakehouse=Lakehouse.from_config(config),
                                         master=config.spark_master))
    return SparkWrites(spark_factory())


def writes_for(spark, config) -> SparkWrites | None:
    """A ``SparkWrites`` through ``spark`` when ``config`` sends every read and write
    through Spark (``LAKECDC_WRITER=spark``), else None: the delta-rs path."""
    return SparkWrites(spark) if spark is not None and config.spark_writes else None
