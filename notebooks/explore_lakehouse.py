# Databricks notebook source
# MAGIC %md
# MAGIC # Explore the lakehouse: bronze, silver, gold
# MAGIC
# MAGIC Walks one source change from the WAL to the dashboard's numbers:
# MAGIC
# MAGIC 1. **bronze** `bronze/wal2json_changes` - the raw wal2json JSON, one row per change,
# MAGIC    keyed `(commit_lsn, seq)`, written by the shipper;
# MAGIC 2. **silver** `silver/changes` - typed change rows (`op`, new dims, `old_` dims), and
# MAGIC    `silver/quarantine` for rows that could not be parsed;
# MAGIC 3. **gold** `gold/service_stats` - counts per (service, template, type, status).
# MAGIC
# MAGIC Runs on Databricks (set the `lakehouse` widget, e.g. `s3://bucket/lakecdc/prod`) and
# MAGIC locally with delta-spark (`LAKECDC_LAKEHOUSE`, as for the `lakecdc` command). It only
# MAGIC reads. With `LAKECDC_CATALOG` and `LAKECDC_SCHEMA` set (Unity Catalog), it reads the
# MAGIC tables by the names `setup` registered there; otherwise by path.

# COMMAND ----------

import os
import sys

try:
    import pipelines  # the installed wheel, or the repository on sys.path
except ImportError:                     # a notebook synced with the bundle: repo root is ..
    sys.path.insert(0, os.path.abspath(".."))
    import pipelines


def param(name: str, default: str = "") -> str:
    """A notebook parameter: a widget on Databricks, LAKECDC_NB_<NAME> elsewhere."""
    try:
        dbutils.widgets.text(name, default)  # noqa: F821 - defined on Databricks
        return dbutils.widgets.get(name)  # noqa: F821
    except NameError:
        return os.environ.get(f"LAKECDC_NB_{name.upper()}", default)


try:
    display  # noqa: B018 - Databricks' rich table
except NameError:
    def display(frame, rows: int = 20):
        frame.show(rows, truncate=False)

# COMMAND ----------

from pyspark.sql import functions as F

from core.config import Config
from core.lsn import fmt
from pipelines.observe.query import table_paths, use_tables
from core.spark import get_or_create
from core.storage import Lakehouse

config = Config.load(lakehouse=param("lakehouse") or None)
spark = get_or_create(lakehouse=Lakehouse.from_config(config), master=config.spark_master,
                      metastore=config.registers)
# With LAKECDC_CATALOG and LAKECDC_SCHEMA set, the tables are read by their registered names
# in that schema (it becomes the current one); otherwise as temporary views over the paths.
registered = use_tables(spark, config)
paths = table_paths(config)
where = (f"{config.catalog}.{config.catalog_schema}" if config.registers
         else f"lakehouse {config.lakehouse}")
print(f"{where}: tables {', '.join(registered)}")
assert "gold_service_stats" in registered, "no gold table yet: run the pipeline first"

# COMMAND ----------

# MAGIC %md
# MAGIC ## Bronze: what the shipper stored
# MAGIC Every row is one change of a committed source transaction; `tx_changes` says how many
# MAGIC rows the transaction has, so a reader knows when it holds all of it.

# COMMAND ----------

bronze = spark.table("bronze_wal2json_changes")
bronze_summary = bronze.agg(F.count(F.lit(1)).alias("rows"),
                            F.countDistinct("commit_lsn").alias("transactions"),
                            F.max("commit_lsn").alias("newest_commit_lsn")).first()
print(f"bronze: {bronze_summary.rows:,} changes in {bronze_summary.transactions:,} "
      f"transactions, newest commit {fmt(bronze_summary.newest_commit_lsn or 0)}")
display(bronze.groupBy("action").count().orderBy("action"))
display(bronze.orderBy(F.desc("commit_lsn"), "seq")
        .select("commit_lsn", "seq", "tx_changes", "action", "commit_ts", "data").limit(5))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Silver: typed changes
# MAGIC One silver row per bronze row. An UPDATE that changed a counted column carries the
# MAGIC old values (`old_*`, from the replica identity); that is what lets gold subtract.

# COMMAND ----------

silver = spark.table("silver_changes")
silver_ops = silver.groupBy("table_name", "op").count().orderBy("table_name", "op")
display(silver_ops)
moves = (silver.where((F.col("op") == "U") & F.col("old_notification_status").isNotNull())
         .groupBy("old_notification_status", "notification_status").count()
         .orderBy(F.desc("count")))
display(moves)
quarantined = spark.table("silver_quarantine").count() if "silver_quarantine" in registered else 0
print(f"silver: {silver.count():,} rows, {quarantined:,} quarantined")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Gold: the counts the dashboard shows
# MAGIC The dashboard queries live in `sql/`; here is the first of them, on the same views.

# COMMAND ----------

from pipelines.observe.query import read_query

# sql/ sits beside notebooks/ in the repository and in the bundle's synced files.
sql_dir = next(d for d in (os.path.abspath(os.path.join("..", "sql")),
                           os.path.join(os.path.dirname(os.path.dirname(
                               os.path.abspath(pipelines.__file__))), "sql"))
               if os.path.isdir(d))
top_services = spark.sql(read_query(os.path.join(sql_dir, "top_services.sql")))
display(top_services)

gold = spark.table("gold_service_stats")
gold_total = gold.agg(F.sum("count")).first()[0] or 0
by_status = gold.groupBy("notification_status").agg(F.sum("count").alias("notifications"))
display(by_status.orderBy(F.desc("notifications")))
print(f"gold: {gold_total:,} notifications in {gold.count():,} keys")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Where each layer has got to
# MAGIC The same numbers as `lakecdc status`, from the tables themselves.

# COMMAND ----------

from gold.asof import gold_state

state = gold_state(spark, paths["gold_service_stats"])
print(f"gold version {state.version}: exact as of source commit "
      f"{fmt(state.watermark or state.floor)} (baseline at {fmt(state.floor)})")
exploration = {"bronze_rows": bronze_summary.rows, "silver_rows": silver.count(),
               "quarantined": quarantined, "gold_total": gold_total,
               "gold_version": state.version}
