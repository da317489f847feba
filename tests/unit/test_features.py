"""``core.features``: a table lakecdc creates with Spark stays plain under a workspace's
defaults, and delta-rs's handle on a table with a feature it handles wrongly is refused
with one sentence instead of reading NULLs."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType

from core.errors import UserError
from core.features import open_table, unreadable
from core.spark import session_conf
from core.spark_tables import create_table
from tests.tests_support import WORKSPACE_DEFAULTS

SCHEMA = StructType([StructField("service_id", StringType()), StructField("n", LongType())])


def fill(spark, path: str) -> None:
    table = "delta.`{}`".format(path)
    spark.sql(f"INSERT INTO {table} VALUES ('a', 1), ('b', 2), ('c', 3)")
    spark.sql(f"DELETE FROM {table} WHERE service_id = 'b'")      # a deletion vector, if on


def test_a_table_lakecdc_creates_stays_plain_whatever_the_workspace_defaults(spark, tmp_path):
    path = str(tmp_path / "t")
    with session_conf(spark, WORKSPACE_DEFAULTS):
        create_table(spark, path, SCHEMA, {"delta.appendOnly": "false"})
        fill(spark, path)
    table = open_table(path)
    assert unreadable(table) == []
    assert table.metadata().configuration["delta.columnMapping.mode"] == "none"
    assert sorted(map(tuple, (r.values() for r in table.to_pyarrow_table().to_pylist()))) \
        == [("a", 1), ("c", 3)]


@pytest.mark.parametrize("defaults", [
    {"columnMapping.mode": "name"},
    {"enableDeletionVectors": "true"},
    {"enableRowTracking": "true"}], ids=["column_mapping", "deletion_vectors", "row_tracking"])
def test_a_table_with_a_feature_delta_rs_handles_wrongly_is_refused_in_one_sentence(
        spark, tmp_path, defaults):
    """Made by Spark under the defaults without lakecdc's properties: ``open_table`` names
    the feature. Without that check, the column-mapped table reads as NULLs."""
    path = str(tmp_path / "t")
    with session_conf(spark, {f"spark.databricks.delta.properties.defaults.{k}": v
                              for k, v in defaults.items()}):
        spark.sql(f"CREATE TABLE delta.`{path}` (service_id STRING, n BIGINT) USING delta")
        fill(spark, path)
    with pytest.raises(UserError) as refused:
        open_table(path)
    sentence = str(refused.value)
    feature = {"columnMapping.mode": "columnMapping",
               "enableDeletionVectors": "deletionVectors",
               "enableRowTracking": "rowTracking"}[next(iter(defaults))]
    assert feature in sentence and path in sentence and "\n" not in sentence
    if "columnMapping.mode" in defaults:   # the reason for the check: NULLs, no error
        assert DeltaTable(path).to_pyarrow_table().to_pylist() == \
            [{"service_id": None, "n": None}] * 2


def test_a_table_whose_creation_was_killed_is_created_at_the_next_start(spark, tmp_path):
    """A kill while Spark created a table leaves ``_delta_log`` without a commit (an empty
    ``_staged_commits`` folder, as CI's maintenance soak found; an uncommitted temporary
    file; nothing). Delta refuses to create a table there (``DELTA_TABLE_NOT_FOUND``);
    ``create_table`` removes such a log first. A log with a commit is never touched."""
    from core.spark_tables import remove_uncommitted_log

    schema = StructType([StructField("a", StringType())])
    for name, leftover in (("staged", "_staged_commits/"), ("empty", None),
                           ("tmp_file", ".00000000000000000000.json.1f2e.tmp")):
        log = tmp_path / name / "_delta_log"
        log.mkdir(parents=True)
        if leftover and leftover.endswith("/"):
            (log / leftover).mkdir()
        elif leftover:
            (log / leftover).write_text("{")
        create_table(spark, str(tmp_path / name), schema, {})
        assert DeltaTable(str(tmp_path / name)).version() == 0
        assert not remove_uncommitted_log(spark, str(tmp_path / name))   # committed: kept
        assert DeltaTable(str(tmp_path / name)).version() == 0
