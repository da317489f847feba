# Databricks notebook source
# MAGIC %md
# MAGIC # Time travel: what did the dashboard show at 09:00?
# MAGIC
# MAGIC The dashboard's Postgres `service_stats` is pushed from `gold/service_stats`, one gold
# MAGIC version at a time, seconds after gold commits it. So *what the dashboard showed at T*
# MAGIC is gold as of the newest version committed at or before T (give or take one push
# MAGIC interval). Gold keeps every version, and the files they read, for a day by default
# MAGIC (`delta.logRetentionDuration` and `delta.deletedFileRetentionDuration`; longer with
# MAGIC `LAKECDC_READER_RETENTION`, e.g. `gold=7d`: docs/operations.md, "What each table keeps").
# MAGIC
# MAGIC Parameters: `lakehouse`; `as_of`, a UTC time such as `2026-11-21 09:00:00` (empty: the
# MAGIC middle of gold's history), or `version`, a gold version (wins over `as_of`).

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
from pipelines.observe.query import table_paths
from core.spark import get_or_create
from core.storage import Lakehouse

config = Config.load(lakehouse=param("lakehouse") or None)
spark = get_or_create(lakehouse=Lakehouse.from_config(config), master=config.spark_master)
gold_path = table_paths(config)["gold_service_stats"]

# COMMAND ----------

# MAGIC %md
# MAGIC ## Gold's versions
# MAGIC Each MERGE of the stream is one version; `userMetadata` records the newest source
# MAGIC commit it includes (`commit_lsn`) - gold is exact as of that commit.

# COMMAND ----------

history = (DeltaTable.forPath(spark, gold_path).history()
           .select("version", "timestamp", "operation", "userMetadata").orderBy("version"))
display(history)
# Times are compared by Spark, in the session's time zone (UTC): not in Python's local one.
versions = history.select("version", F.date_format("timestamp", "yyyy-MM-dd HH:mm:ss.SSS")
                          .alias("at")).collect()
if param("version"):
    version = int(param("version"))
else:
    as_of = param("as_of") or versions[len(versions) // 2].at
    version = (history.where(F.col("timestamp") <= F.to_timestamp(F.lit(as_of)))
               .agg(F.max("version")).first()[0])
    assert version is not None, f"gold has no version at or before {as_of}"
print(f"gold version {version} is what the dashboard showed then")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The counts then, and the source commit they were exact for
# MAGIC In SQL, time travel is `VERSION AS OF` (or `TIMESTAMP AS OF '2026-11-21 09:00:00'`)
# MAGIC on the table's path.

# COMMAND ----------

then = spark.sql(f"SELECT * FROM delta.`{gold_path}` VERSION AS OF {version}")
then_state = gold_state(spark, gold_path, version)
print(f"then: exact as of source commit {fmt(then_state.watermark or then_state.floor)} "
      f"({then_state.watermark_ts or 'baseline'})")
then_by_service = (then.groupBy("service_id").agg(F.sum("count").alias("then")))
now_by_service = (spark.read.format("delta").load(gold_path)
                  .groupBy("service_id").agg(F.sum("count").alias("now")))
display(then_by_service.join(now_by_service, "service_id", "full_outer")
        .select("service_id", F.coalesce("then", F.lit(0)).alias("then"),
                F.coalesce("now", F.lit(0)).alias("now"))
        .withColumn("created_since", F.col("now") - F.col("then")).orderBy("service_id"))

# COMMAND ----------

# MAGIC %md
# MAGIC ## What changed since
# MAGIC Gold's change data feed lists every key whose count moved after that version (the push
# MAGIC reads the same feed to update only changed rows).

# COMMAND ----------

latest = versions[-1].version
if latest > version:
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", version + 1).load(gold_path)
               .where(F.col("_change_type").isin("insert", "update_postimage", "delete")))
    display(changes.groupBy("_change_type").count())
else:
    print("nothing changed since: that version is the latest")

time_travel = {"version": version,
               "then_counts": {tuple(r[c] for c in ("service_id", "template_id",
                                                    "notification_type", "notification_status")):
                               r["count"] for r in then.collect() if r["count"]},
               "watermark": then_state.watermark}
