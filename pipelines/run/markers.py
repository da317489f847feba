"""Which of verify's markers the mirrors' query has passed.

Verify commits a count-neutral marker transaction after its consistent point
(``pipelines.source.consistent.emit_marker``). When a mirrors' batch carries one, every
mirror holds every change before it, so ``MirrorWriter`` records it here, in
``<lakehouse>/silver/_mirror_markers`` (a small append, only in the batches that carry a marker);
verify reads the newest one before it reads a mirror (``pipelines.verify.mirrors``).
Written by the running pipeline, read by verify: it lives with the writer, so verify
depends on the run room and never the other way round. Where only Spark reaches storage
(``LAKECDC_WRITER=spark``) both go through Spark (``writes``, ``spark``).
"""

from __future__ import annotations

import time
from typing import Callable

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from core.features import open_table
from core.layout import MIRROR_MARKERS, path

_MARKERS = pa.schema([("marker_lsn", pa.int64()), ("batch_id", pa.int64()),
                      ("recorded_at", pa.timestamp("us", tz="UTC"))])


def record_marker(lakehouse: str, storage_options: dict | None = None, writes=None
                  ) -> Callable[[int, int], None]:
    """For ``MirrorWriter``: note a verify marker every mirror holds (a small append, only
    in the batches that carry a marker); ``writes``: the mirrors' ``SparkWrites``, or None
    (delta-rs)."""
    uri = path(lakehouse, MIRROR_MARKERS)

    def record(marker: int, batch_id: int) -> None:
        rows = pa.table({"marker_lsn": [marker], "batch_id": [batch_id],
                         "recorded_at": [int(time.time() * 1e6)]}, schema=_MARKERS)
        if writes is not None:      # the first append creates the table
            writes.frame(rows).write.format("delta").mode("append").save(_spark(uri))
        else:
            write_deltalake(uri, rows, mode="append", storage_options=storage_options)
    return record


def mirrors_position(lakehouse: str, storage_options: dict | None = None, spark=None
                     ) -> int | None:
    """The newest verify marker the mirrors' query has passed (None: none yet); read by
    ``spark`` if given, else delta-rs."""
    uri = path(lakehouse, MIRROR_MARKERS)
    if spark is not None:
        from delta.tables import DeltaTable as SparkTable
        from pyspark.sql import functions as F

        if not SparkTable.isDeltaTable(spark, _spark(uri)):
            return None
        return spark.read.format("delta").load(_spark(uri)).agg(F.max("marker_lsn")).first()[0]
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        return None
    values = open_table(uri, storage_options).to_pyarrow_table(
        columns=["marker_lsn"]).column("marker_lsn").to_pylist()
    return max(values, default=None)


def _spark(uri: str) -> str:
    from core.storage import on_databricks, spark_path

    return spark_path(uri, on_databricks())
