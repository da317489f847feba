# Databricks notebook source
# MAGIC %md
# MAGIC # Backfill walkthrough: snapshot backfill, quality gates, gold rebuild
# MAGIC
# MAGIC Which backfill, by situation (the command, and the bundle job that runs it):
# MAGIC
# MAGIC - silver needs the rows that existed before the slot (a full copy, not just counts):
# MAGIC   `lakecdc backfill snapshot` (bundle job `lakecdc_backfill`);
# MAGIC - gold stopped on a TRUNCATE, `verify` found drift, the source was restored or failed
# MAGIC   over: `lakecdc backfill rebuild-gold` (bundle job `lakecdc_rebuild`);
# MAGIC - a parser fix must be applied to rows already in silver:
# MAGIC   `lakecdc backfill reprocess-silver --from-lsn …` (no bundle job).
# MAGIC
# MAGIC Gold's counts never need the snapshot backfill: `setup` counted the existing rows as
# MAGIC gold's baseline. A rebuild takes a *new* baseline (a `GROUP BY` inside a consistent
# MAGIC snapshot of the source) and applies the silver changes after it, under the gold
# MAGIC writer lock, then replaces the dashboard in one transaction.
# MAGIC
# MAGIC This notebook shows where things stand, runs the silver gate, and - only when the
# MAGIC `rebuild` parameter is `yes` - rebuilds gold and runs the gold gate, as the
# MAGIC `lakecdc_rebuild` job does. Parameters: `lakehouse`; on Databricks also `secret_scope`
# MAGIC and `source_dsn_key` (the source DSN is read from the secret scope, never typed in).

# COMMAND ----------

import os
import sys

try:
    import pipelines  # noqa: F401 - the installed wheel, or the repository on sys.path
except ImportError:                     # a notebook synced with the bundle: repo root is ..
    sys.path.insert(0, os.path.abspath(".."))
    import pipelines  # noqa: F401


def param(name: str, default: str = "") -> str:
    """A notebook parameter: a widget on Databricks, LAKECDC_NB_<NAME> elsewhere."""
    try:
        dbutils.widgets.text(name, default)  # noqa: F821 - defined on Databricks
        return dbutils.widgets.get(name)  # noqa: F821
    except NameError:
        return os.environ.get(f"LAKECDC_NB_{name.upper()}", default)


def secret_dsn() -> str | None:
    """The source DSN from the Databricks secret scope; None elsewhere (LAKECDC_SOURCE_DSN)."""
    try:
        scope, key = param("secret_scope", "lakecdc"), param("source_dsn_key", "source-dsn")
        return dbutils.secrets.get(scope, key)  # noqa: F821
    except NameError:
        return None


try:
    display  # noqa: B018 - Databricks' rich table
except NameError:
    def display(frame, rows: int = 20):
        frame.show(rows, truncate=False)

# COMMAND ----------

from delta.tables import DeltaTable
from pyspark.sql import functions as F

from gold.asof import gold_state
from core.config import Config
from core.lsn import fmt
from pipelines.run.pipeline import Pipeline
from core.spark import get_or_create
from core.storage import Lakehouse

config = Config.load(lakehouse=param("lakehouse") or None, source_dsn=secret_dsn())
pipeline = Pipeline(config, spark_factory=lambda: get_or_create(
    lakehouse=Lakehouse.from_config(config), master=config.spark_master))
spark, where = pipeline.spark, pipeline.where

# COMMAND ----------

# MAGIC %md
# MAGIC ## 1. Where things stand
# MAGIC Gold's *floor* is the source LSN of the baseline its counts start from (setup's seed,
# MAGIC or the last rebuild); its *watermark* the newest source commit it includes. Snapshot
# MAGIC reads are silver rows with `op = 'R'`; the backfill's chunks are staged in
# MAGIC `bronze/_backfill_chunks` until the shipper places them in bronze.

# COMMAND ----------

def describe_gold(label: str):
    state = gold_state(spark, where.gold)
    print(f"{label}: gold version {state.version}, floor {fmt(state.floor)}, watermark "
          f"{fmt(state.watermark or state.floor)}")
    return state


before = describe_gold("before")
silver = spark.read.format("delta").load(where.silver.silver_path)
display(silver.groupBy("op").count().orderBy("op"))
staging = where.silver.bronze_path.rstrip("/").rsplit("/", 1)[0] + "/_backfill_chunks"
if DeltaTable.isDeltaTable(spark, staging):
    display(spark.read.format("delta").load(staging).groupBy("run", "table")
            .agg(F.count(F.lit(1)).alias("staged_rows")))
else:
    print("no snapshot backfill has run (nothing staged)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## 2. The silver gate
# MAGIC A rebuild applies the silver changes after its new baseline, so silver must hold its
# MAGIC contract first. A failing gate stops here (the job's rebuild task depends on it).

# COMMAND ----------

from pipelines.verify.quality import render, run_gates

silver_gate = run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                        ("silver",))
print(render(silver_gate))
assert all(r.success for r in silver_gate), "the silver gate failed: do not rebuild from it"

# COMMAND ----------

# MAGIC %md
# MAGIC ## 3. Rebuild gold, then the gold gate
# MAGIC Set the `rebuild` parameter to `yes` to run it (the job runs `lakecdc backfill
# MAGIC rebuild-gold`). Stop a running stream first: only one process may write gold,
# MAGIC and the rebuild says so if another holds the lock.

# COMMAND ----------

rebuilt = None
gold_gate = []
if param("rebuild", "no") == "yes":
    from pipelines.backfill.rebuild import rebuild_and_push

    rebuilt = rebuild_and_push(pipeline.spark, pipeline.config, pipeline.where, pipeline.gold_lock)
    print(rebuilt.summary())
    after = describe_gold("after")
    assert after.floor > before.floor, "the rebuild did not move gold's baseline"
    gold_gate = run_gates(spark, where.silver.silver_path, where.gold, config.counted,
                          ("gold",),
                          baseline_path=config.baseline_path,
                          storage_options=Lakehouse.from_config(config).delta_rs_options())
    print(render(gold_gate))
    assert all(r.success for r in gold_gate), "the gold gate failed after the rebuild"
else:
    print("rebuild skipped: set the `rebuild` parameter to `yes` to run it")

walkthrough = {"floor_before": before.floor, "rebuilt": rebuilt,
               "gates": [r.success for r in silver_gate + gold_gate]}
