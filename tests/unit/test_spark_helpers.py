"""``core.spark``'s helpers for what the stream does every batch: columns built once
(``built_once``) and small driver-side rows as a local relation (``local_frame``)."""

from datetime import datetime, timezone

from core.spark import built_once, local_frame
from gold.apply import MERGE_SOURCE
from gold.deltas import CONTRIBUTIONS


def test_built_once_per_key_and_again_when_the_key_changes():
    builds = []

    def build(n):
        return lambda: builds.append(n) or f"columns {n}"

    assert built_once(("test-transform", 1), build(1)) == "columns 1"
    assert built_once(("test-transform", 1), build(1)) == "columns 1"
    assert builds == [1]
    assert built_once(("test-transform", 2), build(2)) == "columns 2"
    assert built_once(("test-transform", 2), build(2)) == "columns 2"
    assert built_once(("test-transform", 1), build(1)) == "columns 1"
    assert builds == [1, 2, 1]


def test_local_frame_is_a_local_relation_with_the_rows_and_schema_given(spark):
    """The gold MERGE's source: no Python RDD (a Python worker per scan), the same rows and
    types ``createDataFrame`` of the list would give, NULLs and timestamps included."""
    now = datetime(2026, 11, 26, 20, 5, 34, 43861, tzinfo=timezone.utc)
    rows = [("s1", "t", "email", "created", -3, 100, now),
            ("s2", "t", "sms", "delivered", 7, 2**62, None)]
    frame = local_frame(spark, rows, MERGE_SOURCE)
    assert frame._jdf.queryExecution().analyzed().toString().startswith("LocalRelation")
    assert frame.schema == MERGE_SOURCE
    assert frame.collect() == spark.createDataFrame(rows, MERGE_SOURCE).collect()
    carried = [(5, 3, None, None, None, None, now, 0, 1)]
    assert local_frame(spark, carried, CONTRIBUTIONS).collect() == \
        spark.createDataFrame(carried, CONTRIBUTIONS).collect()
    empty = local_frame(spark, [], CONTRIBUTIONS)
    assert empty.schema == CONTRIBUTIONS and empty.count() == 0
