"""``core.spark``'s helpers for what the stream does every batch: small driver-side rows
as a local relation (``local_frame``), the continuous stream's session (``low_latency``),
and silver's file statistics."""

from datetime import datetime, timezone

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from core.spark import local_frame, low_latency
from gold.deltas import CONTRIBUTIONS
from silver.parse import CHANGES_ARROW
from silver.schema import SILVER_CHANGES
from silver.writer import STATS_COLUMNS, ensure_table


KEYED = StructType([*[StructField(c, StringType(), False) for c in ("a", "b", "c", "d")],
                    StructField("delta", LongType(), False),
                    StructField("lsn", LongType(), False),
                    StructField("at", TimestampType())])


def test_local_frame_is_a_local_relation_with_the_rows_and_schema_given(spark):
    """``_pending``'s rows: no Python RDD (a Python worker per scan), the same rows and
    types ``createDataFrame`` of the list would give, NULLs and timestamps included."""
    now = datetime(2026, 11, 26, 20, 5, 34, 43861, tzinfo=timezone.utc)
    rows = [("s1", "t", "email", "created", -3, 100, now),
            ("s2", "t", "sms", "delivered", 7, 2**62, None)]
    frame = local_frame(spark, rows, KEYED)
    assert frame._jdf.queryExecution().analyzed().toString().startswith("LocalRelation")
    assert frame.schema == KEYED
    assert frame.collect() == spark.createDataFrame(rows, KEYED).collect()
    carried = [(5, 3, None, None, None, None, now, 0, 1)]
    assert local_frame(spark, carried, CONTRIBUTIONS).collect() == \
        spark.createDataFrame(carried, CONTRIBUTIONS).collect()
    empty = local_frame(spark, [], CONTRIBUTIONS)
    assert empty.schema == CONTRIBUTIONS and empty.count() == 0


def _jobs_of(spark, frame, group: str) -> int:
    """How many Spark jobs collecting ``frame`` runs."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        frame.collect()
    finally:
        context.setJobGroup("", "")
    return len(context.statusTracker().getJobIdsForGroup(group))


def test_a_continuous_stream_runs_a_small_query_with_a_shuffle_as_one_spark_job(spark):
    """Adaptive execution runs each exchange as a job of its own, every batch; the continuous
    stream's session plans without it, and a catch-up (``continuous=False``) keeps it."""
    def counts(session):        # a new query each time (a plan is kept once executed)
        return session.range(200).groupBy((F.col("id") % 7).alias("k")).count()

    with low_latency(spark, continuous=False):
        assert _jobs_of(spark, counts(spark), "catch-up") >= 2
    with low_latency(spark, continuous=True):
        assert _jobs_of(spark, counts(spark), "continuous") == 1
    assert _jobs_of(spark, counts(spark), "after") >= 2     # the session's own setting is back


def test_silver_files_carry_statistics_only_on_the_columns_rows_are_selected_by(spark,
                                                                                tmp_path):
    path = str(tmp_path / "changes")
    ensure_table(spark, path, SILVER_CHANGES, "silver changes")
    row = {name: None for name in SILVER_CHANGES.names}
    row.update(commit_lsn=7, seq=1, tx_changes=1, lsn=6, op="I", schema_name="public",
               table_name="notifications", id="n1", service_id="s1")
    write_deltalake(path, pa.Table.from_pylist([row], schema=CHANGES_ARROW), mode="append")
    [added] = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    with_min = {key.removeprefix("min.") for key in added if key.startswith("min.")}
    assert STATS_COLUMNS[:3] == ["commit_lsn", "seq", "tx_changes"]
    assert {"commit_lsn", "schema_name", "table_name"} <= with_min <= set(STATS_COLUMNS)
    assert added["min.commit_lsn"] == 7
    assert not any(key.endswith(".service_id") for key in added)
