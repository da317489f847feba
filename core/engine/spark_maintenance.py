"""Keeping one Delta table small through Spark: ``core.maintenance``'s job where only Spark
reaches storage (``LAKECDC_WRITER=spark``; Unity Catalog external locations).

The same contract: called by the table's writer between two of its own commits, or by
``lakecdc maintain`` holding that writer's lock (``pipelines.maintain``), so it never
races a writer of lakecdc's; the same retentions; each step one commit or none. Run in
the caller's ``SparkWrites`` session (its settings reach no other writer). What differs:

1. **compact**: ``OPTIMIZE delta.`path``` with Delta's ``optimize.minFileSize`` and
   ``maxFileSize`` at ``target_bytes``: the files under the target are bin-packed, in one
   commit whose actions carry ``dataChange=false`` (streaming readers skip it), as delta-rs's.
2. **retention**: the same ``log_properties``, except that Delta cleans the log itself:
   Spark cannot be told to stop its cleanup at a version, so expired entries are deleted by
   Delta at its checkpoints (``delta.enableExpiredLogCleanup``, one every
   ``delta.checkpointInterval`` commits) instead of by this module. Where a stream reads the
   table, that cleanup is switched off while the version the stream restarts from is older
   than half the log retention (it would be deleted before the next maintenance could
   stop it), its entry cannot be read, or the stream has committed at most its first batch
   (``stream_needs_log``: where the delta-rs path cleans nothing), and on again once the
   stream caught up: a stream stopped long keeps the log it needs, as on delta-rs, at the
   cost of a longer log meanwhile.
3. **checkpoint**: no explicit one (Spark has no public call for it): Delta writes them every
   ``checkpointInterval`` commits, which the tables set low (``core.handle.CHECKPOINTS``).
4. **vacuum**: ``VACUUM delta.`path` LITE RETAIN n HOURS`` (the log's removed files), then
   a full ``VACUUM`` at ``unreferenced_hours`` (files no commit references, a killed
   writer's orphans too, never younger than ``UNREFERENCED_HOURS``), as on delta-rs; held
   while the table's stream has unread commits older than the retention. A lite vacuum
   that cannot run (Delta refuses it when log entries since the last vacuum were cleaned)
   leaves the removed files to the full one. Retentions under Delta's 7-day check need
   ``retentionDurationCheck.enabled=false`` in this session.
5. **the report** beside the log (``_lakecdc_maintenance.json``) is not written: the table's
   own history records each ``OPTIMIZE`` and ``VACUUM``, and ``lakecdc status`` reads it
   there (``table_size_spark``).

A kill anywhere leaves the table as it was or compacted, as there.
"""

from __future__ import annotations

import json
import logging
import time

from core.config import LOG_RETENTION_MINUTES
from core.maintenance import (
    TARGET_BYTES,
    TableReport,
    TableSize,
    alter_properties_sql,
    held_by_reader,
    log_properties,
    unreferenced_hours,
)
from core.spark_tables import is_table

log = logging.getLogger("lakecdc.maintain")

_SESSION = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
            "spark.databricks.delta.vacuum.logging.enabled": "true"}
_MIN_FILE = "spark.databricks.delta.optimize.minFileSize"
_MAX_FILE = "spark.databricks.delta.optimize.maxFileSize"
_CLEANUP = "delta.enableExpiredLogCleanup"
# VACUUM lists a table's folders in a Spark job of this many tasks, by default 10,000,
# nearly all of them empty for lakecdc's unpartitioned tables: tens of seconds per VACUUM
# of a ten-row table on 2 cores (local or S3), about a second with the cluster's own
# parallelism.
_LISTING = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def _parallelism(spark) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:                   # no context handle (Spark Connect)
        return 8


def maintain_table_spark(writes, name: str, path: str, *, retention_hours: int,
                         log_retention_minutes: int = LOG_RETENTION_MINUTES,
                         reader_floor: int | None = None, log_floor: int | None = None,
                         target_bytes: int = TARGET_BYTES, now: float | None = None
                         ) -> TableReport:
    """``core.maintenance.maintain_table`` through Spark (the module's text); ``path`` as
    Spark names the table; ``reader_floor`` and ``log_floor`` as there."""

    started = time.monotonic()
    spark = writes.spark
    report = TableReport(name)
    if not is_table(spark, path):
        report.notes.append("no table yet")
        return report
    now = now or time.time()
    for key, value in {**_SESSION, _MIN_FILE: str(target_bytes),
                       _MAX_FILE: str(target_bytes), _LISTING: str(_parallelism(spark))
                       }.items():
        spark.conf.set(key, value)
    report.files_before = _live_files(spark, path)
    version = writes.version(path)
    held = held_by_reader(lambda v: commit_time_spark(spark, path, v), version,
                          reader_floor, retention_hours, now)
    done = spark.sql(f"OPTIMIZE delta.`{path}`").first()
    report.compacted = int(done.metrics.numFilesRemoved or 0) if done is not None else 0
    _keep_retention(spark, path, log_retention_minutes,
                    reader_floor if log_floor is None else log_floor, version, now)
    if held:
        report.notes.append(f"its stream {held}: nothing vacuumed until it is within the "
                            "retention")
    else:
        before = writes.version(path)
        try:
            spark.sql(f"VACUUM delta.`{path}` LITE RETAIN {int(retention_hours)} HOURS")
        except Exception as exc:        # a log cleaned since the last vacuum: the full one
            log.debug("lite vacuum of %s not run: %s", path, exc)
        spark.sql(f"VACUUM delta.`{path}` RETAIN {unreferenced_hours(retention_hours)} HOURS")
        report.vacuumed = _vacuumed(spark, path, before)
    report.files_after = _live_files(spark, path)
    report.seconds = time.monotonic() - started
    return report


def clean_log_spark(writes, path: str, *, log_retention_minutes: int = LOG_RETENTION_MINUTES,
                    log_floor: int | None = None, now: float | None = None) -> str | None:
    """``core.maintenance.clean_log`` through Spark: step 2 alone (Delta deletes the
    expired entries at its next checkpoint). Returns None (nothing it could not do)."""

    if is_table(writes.spark, path):
        _keep_retention(writes.spark, path, log_retention_minutes, log_floor,
                        writes.version(path), now or time.time())
    return None


def _keep_retention(spark, path: str, log_retention_minutes: int, log_floor: int | None,
                    version: int, now: float) -> bool:
    """Set the table's retentions and whether Delta cleans its log (step 2) where they
    differ: one metadata-only commit; True: it committed."""
    wanted = log_properties(log_retention_minutes)
    needed = stream_needs_log(lambda v: commit_time_spark(spark, path, v),
                              log_retention_minutes, log_floor, version, now)
    wanted[_CLEANUP] = "false" if needed else "true"
    from delta.tables import DeltaTable

    have = DeltaTable.forPath(spark, path).detail().first().properties
    if all(have.get(k) == v for k, v in wanted.items()):
        return False
    spark.sql(alter_properties_sql(path, wanted))
    return True


def stream_needs_log(committed_at, log_retention_minutes: int, log_floor: int | None,
                     version: int, now: float) -> bool:
    """Whether Delta's own log cleanup, left on until the next maintenance, could delete an
    entry the table's stream reads again when it restarts (``log_floor + 1`` on): the
    cases where the delta-rs path cleans nothing. The stream has committed at most its
    first batch (``log_floor < 0``: a restart reads the log from where that batch began,
    however long ago); the floor's next entry is gone or unreadable; or it is older than
    half the log retention. None, or a stream that has read the whole table: no.
    ``committed_at(version)`` as in ``core.maintenance.held_by_reader``."""
    if log_floor is None or log_floor >= version:
        return False
    if log_floor < 0:
        return True
    since = committed_at(log_floor + 1)
    return since is None or now - since > log_retention_minutes * 30        # half, in s


def commit_time_spark(spark, path: str, version: int) -> float | None:
    """When ``version`` was committed (seconds since the epoch), from its log entry read by
    Spark; None when the entry is gone."""
    entry = f"{path.rstrip('/')}/_delta_log/{version:020d}.json"
    try:
        lines = spark.read.text(entry).collect()
    except Exception as exc:            # AnalysisException: PATH_NOT_FOUND
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            return None
        raise
    for line in lines:
        info = json.loads(line.value).get("commitInfo") if line.value.strip() else None
        if info and info.get("timestamp"):
            return info["timestamp"] / 1000
    return None


def stream_position_spark(spark, checkpoint_dir: str, replayed: bool = False) -> int | None:
    """``core.checkpoints.stream_position``, its checkpoint read by Spark (the same
    answers: None without a checkpoint, -1 before a committed batch)."""
    from pyspark.sql import functions as F

    root = checkpoint_dir.rstrip("/")

    def names(folder: str) -> list[str] | None:
        try:
            rows = (spark.read.format("binaryFile").load(f"{root}/{folder}")
                    .select(F.element_at(F.split("path", "/"), -1).alias("n")).collect())
        except Exception as exc:
            if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
                return None
            raise
        return [r.n for r in rows]

    if names("metadata") is None:
        return None
    committed = sorted(int(n) for n in names("commits") or [] if n.isdigit())
    batch = (committed[-1] - 1 if replayed else committed[-1]) if committed else -1
    if batch < 0:
        return -1
    lines = [r.value for r in spark.read.text(f"{root}/offsets/{batch}").collect()]
    versions = [json.loads(line)["reservoirVersion"] for line in lines[2:]
                if line.strip().startswith("{") and "reservoirVersion" in line]
    return min(versions) - 1 if versions else -1


def _live_files(spark, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).detail().first().numFiles or 0)


def _vacuumed(spark, path: str, before: int) -> int:
    """Files the vacuum deleted: its ``VACUUM END`` commit's count (vacuum logging on)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    rows = (DeltaTable.forPath(spark, path).history(8).where(
        (F.col("version") > before) & (F.col("operation") == "VACUUM END"))
        .select("operationMetrics").collect())
    return sum(int((r.operationMetrics or {}).get("numDeletedFiles") or 0) for r in rows)


def table_size_spark(spark, path: str) -> TableSize | None:
    """``core.maintenance.table_size`` through Spark; None: no table. The newest
    maintenance is read from the table's history, its last ``OPTIMIZE`` or ``VACUUM END``
    (this path writes no report file): ``{"at": seconds since the epoch}``."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not is_table(spark, path):
        return None
    table = DeltaTable.forPath(spark, path)
    detail = table.detail().first()
    log = spark.read.format("binaryFile").load(f"{path.rstrip('/')}/_delta_log") \
        .select("path").count()
    last = (table.history().where(F.col("operation").isin("OPTIMIZE", "VACUUM END"))
            .agg(F.max("timestamp").alias("at")).first()["at"])
    return TableSize(int(detail.numFiles or 0), int(detail.sizeInBytes or 0), int(log),
                     None if last is None else {"at": last.timestamp()})
