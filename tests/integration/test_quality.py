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


def test_a_second_run_checks_what_is_new_and_a_failure_records_nothing(source_db, config,
                                                                      spark, tmp_path):
    """The gate records each pass (``gold/_quality``) and the next run checks only the silver
    rows after it, and gold against the counts it passed plus the changes since. A count
    broken after a pass is still found; a failing run records nothing, so the next run
    finds it again."""
    from gold.asof import gold_state
    from pipelines.verify.quality import read_checked

    state = str(tmp_path / "quality")
    setup(config)
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    where = pipeline.where
    purged = mixed(source_db.dsn, seed=72)
    pipeline.run_once()

    def gates(**kw):
        return run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                         baseline_path=config.baseline_path, state_path=state, **kw)

    silver, gold = gates()
    assert silver.success and gold.success, (silver.failures, gold.failures)
    first = read_checked(spark, state)
    watermark = gold_state(spark, where.gold).watermark
    assert first.watermark == first.silver_upto == watermark
    assert "baseline at" in gold.scope

    purged.update(mixed(source_db.dsn, seed=73))
    pipeline.run_once()
    silver2, gold2 = gates()
    assert silver2.success and gold2.success, (silver2.failures, gold2.failures)
    new_rows = spark.read.format("delta").load(where.silver.silver_path) \
        .where(F.col("commit_lsn") > watermark).count()
    assert silver2.rows == new_rows and 0 < new_rows < silver.rows + new_rows
    assert "the counts passed at" in gold2.scope
    second = read_checked(spark, state)
    assert second.watermark == gold_state(spark, where.gold).watermark > watermark
    # The counts it carries forward are the source's, not only what gold said.
    carried = {tuple(r[:4]): r[4] for r in spark.read.format("delta").load(state).collect()
               if r[4]}
    assert carried == +source_truth(source_db.dsn, purged)

    row = DeltaTable.forPath(spark, where.gold).toDF().first()
    DeltaTable.forPath(spark, where.gold).update(
        " AND ".join(f"{c} = '{row[c]}'" for c in ("service_id", "template_id",
                                                  "notification_type", "notification_status")),
        {"count": F.col("count") + 1})
    for _ in range(2):
        [gold3] = run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                            ("gold",), baseline_path=config.baseline_path, state_path=state)
        assert _failed(gold3) == {"expect_column_pair_values_to_be_equal": 1}
        assert read_checked(spark, state) == second
