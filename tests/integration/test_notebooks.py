"""Each Databricks source notebook under ``notebooks/`` runs locally with delta-spark against
a small pipeline run (two rounds, so there is history to travel in), and what it computes
agrees with the source."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipelines.run.pipeline import Pipeline
from pipelines.setup.prepare import setup
from tests.tests_support import ROOT
from tests.truth import source_truth
from tests.integration.workload import insert, mixed, transition

pytestmark = [pytest.mark.integration, pytest.mark.spark]

NOTEBOOKS = Path(ROOT) / "notebooks"


def _nonzero(counts) -> dict:
    return {k: v for k, v in counts.items() if v}


def run_notebook(name: str) -> dict:
    """Execute a notebook as Python (``# MAGIC`` lines are comments); its globals."""
    path = NOTEBOOKS / name
    text = path.read_text()
    assert text.startswith("# Databricks notebook source\n"), f"{name} is not a source notebook"
    assert "\n# COMMAND ----------\n" in text
    return runpy.run_path(str(path), run_name="__main__")


@pytest.mark.long
def test_the_notebooks_run_locally_against_a_pipeline_run(source_db, config, spark,
                                                          monkeypatch):
    import random

    setup(config)
    pipeline = Pipeline(config, spark_factory=lambda: spark)
    purged = mixed(source_db.dsn, seed=91)
    pipeline.run_once()
    first = _nonzero(source_truth(source_db.dsn, purged))
    history = DeltaTable.forPath(spark, pipeline.where.gold).history()
    first_version, first_at = history.orderBy(F.desc("version")).select(
        "version", F.date_format("timestamp", "yyyy-MM-dd HH:mm:ss.SSS")).first()
    with source_db.connect() as conn:
        insert(conn, random.Random(92), 40)
        transition(conn, 0.5, "delivered")
    pipeline.run_once()
    now = _nonzero(source_truth(source_db.dsn, purged))
    assert now != first

    for key in [k for k in os.environ if k.startswith("LAKECDC_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("LAKECDC_LAKEHOUSE", config.lakehouse)
    monkeypatch.setenv("LAKECDC_SOURCE_DSN", source_db.dsn)
    monkeypatch.setenv("LAKECDC_SLOT", config.slot)

    explored = run_notebook("explore_lakehouse.py")["exploration"]
    assert explored["gold_total"] == sum(now.values())
    assert explored["silver_rows"] == explored["bronze_rows"] > 0
    assert explored["quarantined"] == 0

    monkeypatch.setenv("LAKECDC_NB_AS_OF", first_at)
    travelled = run_notebook("time_travel.py")["time_travel"]
    assert travelled["version"] == first_version
    assert travelled["then_counts"] == first

    monkeypatch.setenv("LAKECDC_NB_REBUILD", "yes")
    walked = run_notebook("backfill_walkthrough.py")["walkthrough"]
    assert walked["rebuilt"] is not None and walked["gates"] == [True, True]
    # A rebuild re-baselines on the rows the source still has (purged history is gone).
    rebuilt = {(r["service_id"], r["template_id"], r["notification_type"],
                r["notification_status"]): r["count"]
               for r in spark.read.format("delta").load(pipeline.where.gold).collect()}
    assert _nonzero(rebuilt) == _nonzero(source_truth(source_db.dsn))
