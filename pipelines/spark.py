"""The one Spark session factory, for jobs, notebooks and tests.

Delta is configured here (extensions, catalog, the delta-spark jars resolved from Maven
Central through Ivy on the first start and cached under ~/.ivy2 afterwards). ``local=True``
tunes a small single-machine session: few shuffle partitions, no UI, modest memory.
On Databricks the runtime's session already exists; ``get_or_create`` returns it unchanged.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

_LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.enabled": "true",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.properties.defaults.checkpointInterval": "20",
    "spark.sql.streaming.minBatchesToRetain": "20",
    # Stream threads run Java regexes over long error messages when a query stops: the
    # default thread stack overflows on them.
    "spark.driver.extraJavaOptions": "-Dio.netty.tryReflectionSetAccessible=true -Xss16m",
}


def _on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def get_or_create(app_name: str = "lakecdc", local: bool = True,
                  extra_conf: dict[str, str] | None = None,
                  log_level: str = "WARN") -> SparkSession:
    """A Spark session with Delta. Outside Databricks, starts ``local[2]`` with Delta jars.

    ``log_level`` is Spark's own (log4j) level. The CLI uses FATAL unless ``-v``: errors
    that matter reach lakecdc as exceptions and are reported once, by lakecdc.
    """
    if _on_databricks():
        return SparkSession.builder.getOrCreate()
    from delta import configure_spark_with_delta_pip

    builder = (SparkSession.builder.appName(app_name)
               .master("local[2]")
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog",
                       "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    for key, value in {**(_LOCAL_CONF if local else {}), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    spark = configure_spark_with_delta_pip(builder).getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
