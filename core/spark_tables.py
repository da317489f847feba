"""Creating lakecdc's Delta tables with Spark: the one way each gets its schema and
properties."""

from __future__ import annotations

import re

from core.features import PLAIN

# A file Spark writes first and renames into place once complete (``.00…0.json.<uuid>.tmp``).
_TEMPORARY = re.compile(r"\..*\.tmp")


def create_table(spark, path: str, schema, properties: dict[str, str],
                 comment: str | None = None, partitioned_by: tuple[str, ...] = ()) -> None:
    """Create the Delta table at ``path`` with ``schema``, ``properties``, ``comment`` and
    partition columns ``partitioned_by`` unless a table is there already (then nothing
    changes: idempotent). The table states
    the features delta-rs cannot handle off (``core.features.PLAIN``), whatever the
    session's defaults say."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        remove_uncommitted_log(spark, path)
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if comment:
        builder = builder.comment(comment)
    if partitioned_by:
        builder = builder.partitionedBy(*partitioned_by)
    for key, value in {**PLAIN, **properties}.items():
        builder = builder.property(key, value)
    builder.execute()


def is_table(spark, path: str) -> bool:
    """(Spark) Whether ``path`` is a Delta table's own folder. Delta's ``isDeltaTable`` also
    says yes for a folder inside a table (it finds the table above it: a mirror's tail's
    folder before the tail exists, ``silver.mirrors.tail``), and reading such a path
    then fails (``DELTA_INVALID_PARTITION_PATH``)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return False
    try:
        DeltaTable.forPath(spark, path)
    except Exception as exc:
        if "DELTA_INVALID_PARTITION_PATH" in str(exc):
            return False            # the table found is the one above the path
        raise
    return True


def remove_uncommitted_log(spark, path: str) -> bool:
    """Remove the ``_delta_log`` folder at ``path`` if it holds no file but Spark's
    temporary ones: what a process killed while creating the table leaves (the folder, an
    empty ``_staged_commits`` in it, an uncommitted temporary file). Delta takes such a
    folder for a table that is not there and refuses to create one (``DELTA_TABLE_NOT_FOUND``),
    so every later start would fail the same way. With no commit there is no table, and
    nothing to lose; any other file keeps the folder as it is. Returns whether it removed one
    (never on Spark Connect, which has no file system handle to do it with)."""
    from core.spark import is_connect

    if is_connect(spark):
        return False
    jvm = spark.sparkContext._jvm
    log = jvm.org.apache.hadoop.fs.Path(f"{path.rstrip('/')}/_delta_log")
    fs = log.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(log):
        return False
    files = fs.listFiles(log, True)
    while files.hasNext():
        if not _TEMPORARY.fullmatch(files.next().getPath().getName()):
            return False
    return bool(fs.delete(log, True))
