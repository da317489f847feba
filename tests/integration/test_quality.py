"""Great Expectations gates on a real pipeline run: they pass on what the pipeline wrote and
fail on planted bad rows (a doubled count, a negative count, an unknown op, a change after
its commit), in-process and through ``lakecdc quality`` (exit 1, the stop policy)."""

from __future__ import annotations

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipelines.verify.quality import render, run_gates
from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from silver.schema import SILVER_CHANGES
from tests.tests_support import cli_env
from tests.truth import source_truth
from tests.integration.workload import mixed

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _failed(result) -> dict[str, int]:
    return {f.expectation: f.unexpected for f in result.failures}


@pytest.mark.long
def test_gates_pass_on_pipeline_output_and_fail_on_planted_rows(source_db, config, spark,
                                                                 cli_here):
    with source_db.connect() as conn:      # rows before the slot: gold starts from a seed
        conn.execute("INSERT INTO notifications (id, service_id, template_id, "
                     "notification_type, notification_status, key_type, created_at) "
                     "SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), "
                     "'sms', 'created', 'normal', now() FROM generate_series(1, 3)")
    setup(config)
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    purged = mixed(source_db.dsn, seed=71)
    pipeline.run_once()
    where = pipeline.where

    silver, gold = run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                             baseline_path=config.baseline_path)
    assert silver.success and gold.success, (silver.failures, gold.failures)
    assert silver.rows > 0
    gold_rows = DeltaTable.forPath(spark, where.gold).toDF()
    assert gold.rows == gold_rows.count()    # every gold key (zero counts too), none extra
    assert sum(source_truth(source_db.dsn, purged).values()) == \
        gold_rows.agg(F.sum("count")).first()[0]

    # Gold: one key counted once too often, another driven negative.
    keys = DeltaTable.forPath(spark, where.gold).toDF().orderBy("service_id", "template_id",
                                                                "notification_type",
                                                                "notification_status")
    first, second = keys.limit(2).collect()

    def key_is(row):
        return " AND ".join(f"{c} = '{row[c]}'" for c in ("service_id", "template_id",
                                                          "notification_type",
                                                          "notification_status"))

    table = DeltaTable.forPath(spark, where.gold)
    table.update(key_is(first), {"count": F.col("count") + 1})
    table.update(key_is(second), {"count": F.lit(-5).cast("long")})
    [gold] = run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                       ("gold",),
                       baseline_path=config.baseline_path)
    assert not gold.success
    assert _failed(gold) == {"expect_column_pair_values_to_be_equal": 2,
                             "expect_column_values_to_be_between": 1}

    # Silver: a row with an unknown op whose own LSN is after its transaction's commit, and
    # a delete without the old dims (a row condition: only deletes must carry them).
    top = spark.read.format("delta").load(where.silver.silver_path).agg(
        F.max("commit_lsn")).first()[0]
    bad = {f.name: None for f in SILVER_CHANGES.fields}
    bad.update(commit_lsn=top + 100, seq=0, tx_changes=1, lsn=top + 200, op="X")
    blind = {f.name: None for f in SILVER_CHANGES.fields}
    blind.update(commit_lsn=top + 300, seq=0, tx_changes=1, lsn=top + 300, op="D")
    spark.createDataFrame([bad, blind], SILVER_CHANGES).write.format("delta") \
        .mode("append").save(where.silver.silver_path)
    [silver] = run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                         ("silver",))
    assert _failed(silver) == {"expect_column_values_to_be_in_set": 1,
                               "expect_column_pair_values_a_to_be_greater_than_b": 1,
                               "expect_column_values_to_not_be_null": 1}
    assert len(silver.failures) == 2 + 4                    # the four old dims of the delete
    assert "[old_service_id where op == 'D']: 1 unexpected" in render([silver])

    # The command: the report, then exit 1 with one sentence naming both suites.
    result = cli_here(["quality"], cli_env(config))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "silver  FAIL" in result.stdout and "gold    FAIL" in result.stdout
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("lakecdc: drift:")]
    assert "quality gate failed" in line and "silver" in line and "gold" in line
