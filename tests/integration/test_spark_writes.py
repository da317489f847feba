"""``core.engine.spark_delta.SparkDelta``: the commits every writer makes through Spark when
only Spark can reach storage (``LAKECDC_WRITER=spark``), on a real Spark with Delta.

- An append's rows land in the table's column order and types, with the metadata; a
  replay of its app transaction's version is skipped; with the transaction left off it is
  not (the guard's negative control).
- A commit without rows is still made: it carries progress.
- A MERGE updates, inserts and deletes, carries its metadata and transaction, and a replay
  changes nothing; the settings it used are gone from its session afterwards.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from delta.tables import DeltaTable

from core.commits import commit_metadata
from core.engine.spark_delta import SparkDelta, read_commits

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.fixture
def table(spark, tmp_path):
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (k STRING NOT NULL, n BIGINT) USING delta")
    return path


def _rows(spark, path) -> dict:
    return {r.k: r.n for r in spark.read.format("delta").load(path).collect()}


def _history(spark, path) -> list[dict]:
    return [json.loads(c.userMetadata) if c.userMetadata else None for c in
            DeltaTable.forPath(spark, path).history().orderBy("version")
            .select("userMetadata").collect()]


def test_an_append_carries_its_metadata_and_a_replay_is_skipped(spark, table):
    writes = SparkDelta(spark)
    rows = pa.table({"n": pa.array([1, 2], pa.int64()), "k": ["a", "b"]})
    assert writes.append(table, rows, meta=commit_metadata("silver", batch_id=4),
                         app=("app", 4))
    assert not writes.append(table, rows, meta=commit_metadata("silver", batch_id=4),
                             app=("app", 4))
    assert _rows(spark, table) == {"a": 1, "b": 2}
    assert [c.meta for c in read_commits(spark, table, "silver")] == [
        {"lakecdc": "silver", "batch_id": 4}, None]
    # Without the transaction nothing tells the replay apart: it counts twice.
    writes.append(table, rows)
    assert spark.read.format("delta").load(table).count() == 4


def test_a_commit_without_rows_is_made_and_carries_progress(spark, table):
    writes = SparkDelta(spark)
    empty = pa.table({"k": pa.array([], pa.string()), "n": pa.array([], pa.int64())})
    before = writes.version(table)
    assert writes.append(table, empty, meta=commit_metadata("bronze", end_lsn=7),
                         app=("slot", 7))
    assert writes.version(table) == before + 1
    assert _history(spark, table)[-1] == {"lakecdc": "bronze", "end_lsn": 7}


def test_a_merge_updates_inserts_deletes_once_and_leaves_its_session_clean(spark, table):
    writes = SparkDelta(spark)
    writes.append(table, pa.table({"k": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.int64())}))
    source = pa.table({"k": ["a", "b", "d"], "d": pa.array([10, 0, 4], pa.int64())})

    def merge():
        return writes.merge(table, source, "t.k = s.k", delete="s.d = 0",
                            update={"n": "t.n + s.d"}, insert={"k": "s.k", "n": "s.d"},
                            meta=commit_metadata(batch_id=9), app=("gold", 9))

    assert merge() == {"num_target_rows_updated": 1, "num_target_rows_inserted": 1,
                       "num_target_rows_deleted": 1}
    assert merge() == {"num_target_rows_updated": 0, "num_target_rows_inserted": 0,
                       "num_target_rows_deleted": 0}
    assert _rows(spark, table) == {"a": 11, "c": 3, "d": 4}
    assert _history(spark, table)[-1] == {"lakecdc": "gold", "batch_id": 9}
    for key in ("spark.databricks.delta.write.txnAppId",
                "spark.databricks.delta.commitInfo.userMetadata"):
        assert writes.spark.conf.get(key, None) is None
        assert spark.conf.get(key, None) is None
