"""The one Spark session factory, for jobs, notebooks and tests.

Delta is configured here (extensions, catalog, the delta-spark jars resolved from Maven
Central through Ivy on the first start, cached under ~/.ivy2.5.2 and, from then on, taken
from there without resolving them again: ``core.spark_jars``). Outside
Databricks the session is ``local[2]``, tuned as a small single-machine session: few
shuffle partitions, no UI, modest memory.
On Databricks the runtime's session already exists; ``get_or_create`` returns it unchanged.

An S3 or GCS lakehouse also needs a Hadoop connector in the session (s3a; Google's GCS
connector, its classified jar resolved once by ``core.spark_jars.classified_jar``), with the
settings ``core.storage`` derives, and jars can only be added when the JVM starts. So the
lakehouse a process works on is passed as ``lakehouse=`` to the call that starts its session
(the CLI's ``Pipeline`` factory and the notebooks do). A session that is already running
without the connector is refused with one sentence rather than failing later inside a stream.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from core import spark_jars
from core.errors import UserError
from core.handle import CHECKPOINT_INTERVAL
from core.storage import (
    GCS_CONNECTOR,
    GCS_CONNECTOR_SHA256,
    SPARK_PACKAGES,
    Lakehouse,
    on_databricks,
)
from core.store_checks import require_spark_reach

log = logging.getLogger("lakecdc.spark")

_LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.enabled": "true",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.properties.defaults.checkpointInterval": str(CHECKPOINT_INTERVAL),
    "spark.sql.streaming.minBatchesToRetain": "20",
    # Hadoop sets the mode of each file it creates from this, not from the process's umask:
    # lakehouse files (bronze holds personal data) are their owner's alone, like the CLI's.
    "spark.hadoop.fs.permissions.umask-mode": "077",
    # Stream threads run Java regexes over long error messages when a query stops: the
    # default thread stack overflows on them.
    # The parallel collector: a continuous stream's small batches make short-lived garbage
    # at a high rate, and G1 (the default on 2+ cores) spends CPU on concurrent work for it
    # that the stream then lacks. Measured on 2 cores, with Postgres and traffic beside it,
    # two 60 s runs each: at 200 changes/s a batch took 2.23 -> 1.86-2.01 s and freshness
    # p95 4.3-4.4 -> 3.5-4.0 s; at 2,000 changes/s no change (p95 4.0-4.2 s both).
    "spark.driver.extraJavaOptions": "-Dio.netty.tryReflectionSetAccessible=true -Xss16m "
                                     "-XX:+UseParallelGC",
}

def arrow_rows(rows: list[tuple], schema: StructType) -> pa.Table:
    """``rows`` (tuples in ``schema``'s column order) as an Arrow table of ``schema``'s
    Arrow types (timestamps in UTC microseconds, as Spark and Delta keep them)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return pa.Table.from_pydict(
        {name: [row[i] for row in rows] for i, name in enumerate(schema.names)},
        schema=to_arrow_schema(schema))


def local_frame(spark: SparkSession, rows: list[tuple], schema: StructType) -> DataFrame:
    """``rows`` (tuples in ``schema``'s column order) as a DataFrame over a local relation.

    Through Arrow: ``createDataFrame`` of a Python list makes an RDD that Python workers
    unpickle at every scan, about ten times slower than the same rows as an Arrow table,
    which Spark holds as a ``LocalRelation``."""
    return spark.createDataFrame(arrow_rows(rows, schema), schema)


# A continuous stream's micro-batches are small and each one plans its queries afresh, so
# Spark's code generation compiles new classes for them every batch: about a fifth of the
# JVM's CPU at 200 changes/s. Interpreted expressions skip that; measured on 2 cores, a
# batch took 3.05 -> 2.34 s and freshness p95 6.2 -> 4.8 s, while a 300k-change catch-up
# (big batches, where generated code pays) went 15.4k -> 14.1k changes/s - so only the
# continuous stream runs this way (``low_latency``), and only in local mode. Set on the
# session the process started with, for as long as the stream runs: Delta's own jobs (state
# reconstruction, statistics) run on it, not on the stream's copy.
# Adaptive execution is off there too: it runs each exchange of a query as a Spark job of
# its own, and a continuous batch's queries are small (a Spark MERGE of a few hundred keys
# into gold was 11 jobs with it, 5 without); figures in docs/gold.md. A catch-up, where adaptive
# plans pay, keeps it.
LOW_LATENCY_CONF = {"spark.sql.codegen.wholeStage": "false",
                    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                    "spark.sql.adaptive.enabled": "false"}


def low_latency(spark: SparkSession, continuous: bool):
    """The context a stream runs in: ``LOW_LATENCY_CONF`` for a continuous one on a local
    session, nothing otherwise."""
    return session_conf(spark, LOW_LATENCY_CONF if continuous and not _on_databricks()
                        else {})


@contextmanager
def session_conf(spark: SparkSession, conf: dict[str, str]):
    """Set ``conf`` on ``spark`` for the block, then put back what was there. A streaming
    query started inside keeps them: it runs on a copy of the session taken at its start."""
    before = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session: what ``SparkSession.builder.getOrCreate()``
    returns on Databricks' standard (shared) access mode and on serverless, and wherever
    ``SPARK_REMOTE`` is set. Told from its class (or a class it derives from, as a vendor's
    session may), so no call reaches the server and nothing that needs the ``connect``
    extra (grpcio) is imported."""
    return any(cls.__module__.startswith("pyspark.sql.connect.")
               for cls in type(spark).__mro__)


def require_classic(spark, command: str) -> None:
    """Refuse a Spark Connect session, with one sentence, before ``command`` does anything.

    ``stream`` and ``mirrors`` (and ``run``, which holds both) need a classic session: their
    ``foreachBatch`` writers (``pipelines.run.stream.SilverGoldWriter``,
    ``silver.mirrors.mirror_writer.MirrorWriter``) keep locks, threads, delta-rs handles and the
    Spark session across batches, and the driver reads what they did (the batch's own error, gold's
    steps folded between batches, the dashboard's feeder asked to catch up after each). Spark
    Connect runs that function in a Python process of the server's, pickled: it refuses to
    pickle them, and that process's state would never reach the driver (docs/databricks.md,
    "Which workspace you have")."""
    if is_connect(spark):
        raise UserError(
            f"`lakecdc {command}` needs a classic Spark session and this one is Spark Connect "
            "(standard access mode or serverless): run it on a cluster in dedicated (single "
            "user) access mode, as the bundle's jobs do.")


def _on_databricks() -> bool:
    return on_databricks()


def get_or_create(app_name: str = "lakecdc", extra_conf: dict[str, str] | None = None,
                  log_level: str = "WARN", lakehouse: Lakehouse | None = None,
                  output: str | Path | None = None, master: str = "local[2]",
                  metastore: bool = False) -> SparkSession:
    """A Spark session with Delta. Outside Databricks, starts one on ``master``
    (``Config.spark_master``: ``local[2]``, or a standalone cluster's ``spark://host:port``,
    checked reachable first) with Delta jars, plus hadoop-aws and its s3a settings when
    ``lakehouse`` is on S3, or the GCS connector and its settings when it is on GCS. A
    cluster's executors fetch the jars from this driver; they run Python functions
    (``mapInArrow``) with this process's interpreter path, so lakecdc must be installed there
    as here.

    ``log_level`` is Spark's own (log4j) level. The CLI uses FATAL unless ``-v``: errors
    that matter reach lakecdc as exceptions and are reported once, by lakecdc.

    ``output``: a file the JVM's own stdout and stderr are appended to when this call starts
    it: Ivy's resolution report on a first start, log4j's banner and lines, the Python
    workers' output. The CLI passes one, so a terminal shows only lakecdc's own lines (and
    one naming the file); ``None`` leaves them on this process's stdout and stderr.

    ``metastore``: the session keeps table names in Spark's Hive metastore, beyond the
    process (``core.catalog_names``: the commands that register or read tables by name). Spark
    configures it as it always does: ``hive-site.xml`` in ``SPARK_CONF_DIR``, or else an
    embedded Derby database ``metastore_db`` in the working directory, which one process at
    a time can open. Only when this call starts the JVM; on Databricks the runtime's
    catalog (Unity Catalog) is there anyway.
    """
    if _on_databricks():
        return SparkSession.builder.getOrCreate()
    require_spark_reach(lakehouse, databricks=False)
    from delta import configure_spark_with_delta_pip

    s3 = lakehouse is not None and lakehouse.is_s3
    gcs = lakehouse is not None and lakehouse.cloud == "gcs"
    running = SparkContext._active_spark_context
    # Python workers (``silver.parse.parse_changes``) run this process's interpreter, which
    # has lakecdc's dependencies, not whatever ``python3`` is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if running is None:
        _require_master(master)
    builder = (SparkSession.builder.appName(app_name)
               .master(master)
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog",
                       "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
    conf = {**_LOCAL_CONF, **(lakehouse.spark_conf() if lakehouse else {}),
            **({"spark.sql.catalogImplementation": "hive"} if metastore else {}),
            **(extra_conf or {})}
    if gcs:
        connector = spark_jars.classified_jar(GCS_CONNECTOR, GCS_CONNECTOR_SHA256, conf)
        conf["spark.jars"] = ",".join(jar for jar in (conf.get("spark.jars"), connector) if jar)
    conf[spark_jars.PACKAGES] = configure_spark_with_delta_pip(
        SparkSession.Builder(), extra_packages=list(SPARK_PACKAGES) if s3 else None
    )._options[spark_jars.PACKAGES]
    starts_jvm = SparkContext._gateway is None
    start = spark_jars.start_conf(conf)      # the jars a start before resolved, if any
    for key, value in start.items():
        builder = builder.config(key, value)
    if output is not None and starts_jvm:
        _launch_jvm(builder, Path(output))
    spark = builder.getOrCreate()
    if starts_jvm and spark_jars.PACKAGES in start:
        spark_jars.remember(start, spark.sparkContext.getConf().get(spark_jars.LOCAL_JARS, ""))
    spark.sparkContext.setLogLevel(log_level)
    if lakehouse is not None and lakehouse.spark_filesystem:
        _require_connector(spark, lakehouse, started_here=running is None)
    return spark


def _require_master(master: str, timeout_s: float = 5.0) -> None:
    """A standalone master that does not answer is one sentence, before a JVM starts
    (Spark itself would retry for a minute, then leave a session without executors)."""
    if not master.startswith("spark://"):
        return
    for address in master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout_s).close()
            return
        except OSError:
            continue
    raise UserError(f"the Spark master {master} (LAKECDC_SPARK_MASTER) does not answer: start "
                    "it, or set local[2] to run Spark in this process.")


def _launch_jvm(builder: SparkSession.Builder, output: Path) -> None:
    """Start the JVM that ``builder.getOrCreate()`` then uses, with its stdout and stderr
    appended to ``output``. pyspark starts it through ``spark-submit`` with the builder's
    settings as ``--conf`` (``spark.jars.packages`` among them when ``core.spark_jars`` has
    no record of its jars yet: the Ivy resolution runs in that JVM); only the stream it
    inherits differs. pyspark's ``launch_gateway`` takes the
    ``Popen`` arguments for exactly this; the builder's settings are its ``_options``."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf()
    for key, value in builder._options.items():
        conf.set(key, str(value))
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "ab") as sink:
        sink.write(f"--- {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC: Spark started "
                   f"by process {os.getpid()} ---\n".encode())
        sink.flush()
        gateway = launch_gateway(conf, popen_kwargs={"stdout": sink, "stderr": sink})
    SparkContext._ensure_initialized(gateway=gateway)
    log.info("Spark's own output (Ivy, log4j) goes to %s", output)


def _require_connector(spark: SparkSession, lakehouse: Lakehouse, started_here: bool) -> None:
    """A session started before the lakehouse was known lacks the connector's jars: refuse
    it. Its Hadoop settings are (re)applied, since an existing context ignores builder
    settings."""
    if not spark.sparkContext._jvm.org.apache.spark.util.Utils.classIsLoadable(
            lakehouse.spark_filesystem):
        scheme = lakehouse.root.split("://", 1)[0]
        raise UserError(f"this Spark session was started without the {scheme}:// connector, "
                        f"so it cannot reach the lakehouse {lakehouse.root}: start a new "
                        "process (or call core.spark.get_or_create(lakehouse=...) before any "
                        "other Spark use).") from None
    if not started_here:
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in lakehouse.spark_conf().items():
            if key.startswith("spark.hadoop."):
                hadoop.set(key[len("spark.hadoop."):], value)
