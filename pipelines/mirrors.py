"""The mirrors' query: ``silver/changes`` → one typed mirror per captured table
(``silver.mirror``), a Structured Streaming query of its own beside the one pass.

Its own query, not a step of the one pass: a MERGE per changed table per batch would lengthen
every batch the dashboard waits for (docs/benchmarks.md), while a mirror may trail by its
own trigger interval. Silver is read as an append-only stream; commits that rewrite silver
(``backfill reprocess-silver``) are skipped (docs/silver.md, "Mirrors").
"""

from __future__ import annotations

import logging

import psycopg
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from bronze.source import mirror_key
from core.errors import UserError
from core.layout import MIRROR_CHECKPOINT, mirror_path
from core.postgres import connect
from core.storage import on_databricks, spark_path
from silver.mirror import MirrorWriter, TableSpec, create_mirror
from silver.writer import ADDED_AT_PROPERTY

log = logging.getLogger("lakecdc.mirrors")

QUERY_NAME = "lakecdc_mirrors"
# A mirror trails the source by up to this (plus its batch); each batch costs one MERGE
# per changed table.
TRIGGER_INTERVAL = "5 seconds"


def table_specs(conn: psycopg.Connection, tables: tuple[str, ...]) -> list[TableSpec]:
    """What each captured table's mirror is created with, read from the source's catalog."""
    specs = []
    for table in tables:
        columns, key = mirror_key(conn, table)
        schema, name = table.split(".", 1)
        specs.append(TableSpec(schema, name, tuple(columns), tuple(key)))
    return specs


def prepare_mirrors(spark: SparkSession, config) -> dict[str, str]:
    """Create the mirror of every captured table that has none (its columns and key from
    the source's catalog); returns schema.table → Spark path of every mirror kept. A table
    without a key (``REPLICA IDENTITY FULL`` and no primary key) gets no mirror."""
    from delta.tables import DeltaTable

    paths = {t: spark_path(mirror_path(config.lakehouse, t), on_databricks())
             for t in config.tables}
    missing = [t for t, p in paths.items() if not DeltaTable.isDeltaTable(spark, p)]
    if missing:
        with connect(config.require_source(), what="source") as conn:
            for spec in table_specs(conn, tuple(missing)):
                if not spec.key:
                    log.warning("%s has no primary key (REPLICA IDENTITY FULL): rows may "
                                "repeat, so it is captured but not mirrored", spec.name)
                    del paths[spec.name]
                    continue
                create_mirror(spark, paths[spec.name], spec)
    return paths


def start_mirrors(spark: SparkSession, silver_path: str, checkpoint: str,
                  writer: MirrorWriter, once: bool,
                  trigger_interval: str = TRIGGER_INTERVAL) -> StreamingQuery:
    """Start the query. A silver table that gained the mirrors' columns after holding rows
    (an upgraded lakehouse) is read from that point on: earlier rows lack the old keys."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, silver_path):
        raise UserError(f"no silver table at {silver_path}: run `lakecdc stream` (or `run`) "
                        "first.")
    reader = spark.readStream.format("delta").option("skipChangeCommits", "true")
    added = DeltaTable.forPath(spark, silver_path).detail().first().properties \
        .get(ADDED_AT_PROPERTY)
    if added is not None:
        reader = reader.option("startingVersion", str(int(added) + 1))
    stream = (reader.load(silver_path).writeStream.queryName(QUERY_NAME)
              .option("checkpointLocation", checkpoint).foreachBatch(writer))
    stream = stream.trigger(availableNow=True) if once \
        else stream.trigger(processingTime=trigger_interval)
    return stream.start()


def checkpoint_path(config) -> str:
    return spark_path(config.table_path(MIRROR_CHECKPOINT), on_databricks())
