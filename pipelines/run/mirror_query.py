"""The mirrors' query: ``silver/changes`` → one typed mirror per captured table
(``silver.mirrors.mirror_writer``), a Structured Streaming query of its own beside the one pass.

Its own query, not a step of the one pass: a MERGE per changed table per batch would lengthen
every batch the dashboard waits for (docs/benchmarks.md), while a mirror may trail by its
own trigger interval. Silver is read as an append-only stream; commits that rewrite silver
(``backfill reprocess-silver``) are skipped (docs/silver.md, "Mirrors").
"""

from __future__ import annotations

import logging
from typing import Callable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from core.checkpoints import remove_checkpoint, source_table_ids
from core.commits import commit_metadata
from core.errors import UserError
from core.layout import MIRROR_CHECKPOINT, mirror_baseline_path, mirror_path
from core.lsn import fmt
from core.postgres import connect
from core.storage import on_databricks, spark_path
from core.switches import NONE, Switches
from pipelines.source.mirror_baseline import baseline_point
from pipelines.source.mirror_specs import table_specs
from silver.mirrors.merge import q
from silver.mirrors.mirror_table import COMMIT_LSN, COMMIT_TS, SEED_APP_ID
from silver.mirrors.mirror_types import typed
from silver.mirrors.mirror_writer import MirrorWriter, bad_values_stop
from silver.mirrors.typed_rows import create_mirror
from silver.writer import ADDED_AT_PROPERTY

log = logging.getLogger("lakecdc.mirrors")

QUERY_NAME = "lakecdc_mirrors"
# The most compressed silver bytes one batch reads (Delta's ``maxBytesPerTrigger``): a batch
# is netted on the driver (``silver.mirrors.net_changes``), beside the stream's own batch in
# ``run``.
BATCH_BYTES = "8m"


def prepare_mirrors(spark: SparkSession, config, storage_options: dict | None = None,
                    store=None, switches: Switches | None = None
                    ) -> tuple[dict[str, str], dict[str, int]]:
    """Create the mirror of every captured table that has none (its columns and key from
    the source's catalog) and start each from its initial rows (``seed_mirror``). Returns
    schema.table → Spark path of every mirror kept, and → its floor: the LSN of the rows it
    started from (its changes below it are in them). A table without a key
    (``REPLICA IDENTITY FULL`` and no primary key) gets no mirror. ``store``: how the
    mirrors are read (``silver.mirrors.store``; None: the configuration's engine's);
    ``switches``: the fault points (None: the configuration's)."""
    from delta.tables import DeltaTable

    paths = {t: spark_path(mirror_path(config.lakehouse, t), on_databricks())
             for t in config.mirrored}
    missing = [t for t, p in paths.items() if not DeltaTable.isDeltaTable(spark, p)]
    if missing:
        with connect(config.require_source(), what="source") as conn:
            for spec in table_specs(conn, tuple(missing)):
                if not spec.key:
                    log.warning("%s has no primary key (REPLICA IDENTITY FULL): rows may "
                                "repeat, so it is captured but not mirrored", spec.name)
                    del paths[spec.name]
                    continue
                create_mirror(spark, paths[spec.name], spec, config.kept_minutes("mirrors"))
    store = store or _store(config, spark, storage_options)
    switches = switches or Switches.from_config(config)
    floors = {t: seed_mirror(spark, config.lakehouse, t, p, storage_options, store, switches)
              for t, p in paths.items()}
    return paths, floors


def mirror_discovery(spark: SparkSession, config, storage_options: dict | None = None,
                     store=None, switches: Switches | None = None
                     ) -> Callable[[str], str | None]:
    """For ``MirrorWriter``: the mirror of a table first seen in a batch - captured by
    ``lakecdc tables add`` while the query runs - created then (no initial rows: its rows
    arrive as the backfill's reads). None for a table that is not to be mirrored."""
    from pipelines.setup.capture import captured_tables

    def discover(table: str) -> str | None:
        nonlocal store
        if config.mirrors is not None and table not in config.mirrors:
            return None
        store = store or _store(config, spark, storage_options)
        if table not in captured_tables(config, storage_options, engine=store.engine):
            return None
        paths, _ = prepare_mirrors(spark, config.with_(tables=(table,)), storage_options,
                                   store, switches)
        return paths.get(table)
    return discover


def _store(config, spark: SparkSession, storage_options: dict | None):
    """The mirrors' store on the configuration's engine (``core.engine.choose``), for a
    caller that gave none."""
    from core.engine.choose import engine_for
    from silver.mirrors.store import mirror_store

    return mirror_store(engine=engine_for(config, spark), storage_options=storage_options)


def seed_mirror(spark: SparkSession, lakehouse: str, table: str, path: str,
                storage_options: dict | None, store, switches: Switches = NONE) -> int:
    """Replace the mirror's rows with ``table``'s initial rows
    (``pipelines.source.mirror_baseline``) unless it already holds them; returns its floor
    (0: no initial rows).

    Decided by the mirror's own record (app transaction ``lakecdc-mirror-seed``, version =
    the rows' consistent point, or a load's, ``silver.mirrors.merge.start_point``), so a kill
    anywhere here seeds once on the next start, and a newer baseline (``setup
    --rebaseline``) replaces what an older one started. The mirror's tail (changes of the
    rows replaced, ``silver.mirrors.tail``) is emptied first, as the load does
    (``pipelines.setup.mirror_loader.MirrorTarget.write``): the other way round, a kill
    between the two would leave it to be laid over the new rows and drained into them
    (fault point ``after_mirror_seed``: right after the new rows' commit)."""
    point = baseline_point(lakehouse, table, storage_options, engine=store.engine)
    seeded, types = store.seed_state(path)
    if point is None or (seeded is not None and seeded >= point):
        return seeded or 0             # as seeded, or as loaded (``pipelines.setup.mirror_loader``)
    store.drop_tail(path)              # changes of the rows replaced (``silver.mirrors.tail``)
    rows = spark.read.format("delta").load(spark_path(mirror_baseline_path(lakehouse, table),
                                                      on_databricks()))
    typed_rows = rows.select(*[typed(F.col(q(n)), t, n).alias(n) for n, t in types.items()
                               if n in rows.columns],
                             F.lit(None).cast("long").alias(COMMIT_LSN),
                             F.lit(None).cast("timestamp").alias(COMMIT_TS))
    with bad_values_stop(table):
        (typed_rows.write.format("delta").mode("overwrite")
         .option("txnAppId", SEED_APP_ID).option("txnVersion", point)
         .option("userMetadata", commit_metadata("mirror", seed=point)).save(path))
    switches.hit("after_mirror_seed")
    log.info("mirror of %s: started from its initial rows at %s", table, fmt(point))
    return point


def loading_tables(config, storage_options: dict | None = None, engine=None
                   ) -> Callable[[], frozenset[str]]:
    """For ``MirrorWriter``: the tables ``lakecdc tables add`` is loading now (the stored
    set's ``snapshotting``), read anew at each call (a look at the set's newest version)."""
    from bronze.capture_list import SNAPSHOTTING, CaptureList

    store = CaptureList(config.lakehouse, storage_options, engine=engine)

    def loading() -> frozenset[str]:
        stored = store.read()
        return frozenset() if stored is None else frozenset(
            t for t, (s, _) in stored.states.items() if s == SNAPSHOTTING)
    return loading


def held_changes(spark: SparkSession, silver_path: str):
    """For ``MirrorWriter``: a table's silver rows (the mirrors' columns) from commit LSN
    ``floor`` up to, not including, ``before`` = (commit LSN, seq): its changes held back
    while it was loaded. Read by Spark, which skips silver's files by their statistics."""
    from silver.mirrors.net_changes import MIRROR_COLUMNS

    def held(table: str, floor: int, before: tuple[int, int]):
        schema, name = table.split(".", 1)
        lsn, seq = F.col("commit_lsn"), F.col("seq")
        return (spark.read.format("delta").load(silver_path)
                .where((F.col("schema_name") == schema) & (F.col("table_name") == name)
                       & (lsn >= F.lit(floor))
                       & ((lsn < F.lit(before[0]))
                          | ((lsn == F.lit(before[0])) & (seq < F.lit(before[1])))))
                .orderBy("commit_lsn", "seq").select(*MIRROR_COLUMNS).toArrow())
    return held


def start_mirrors(spark: SparkSession, silver_path: str, checkpoint: str,
                  writer: MirrorWriter, once: bool, interval_s: float) -> StreamingQuery:
    """Start the query. A silver table that gained the mirrors' columns after holding rows
    (an upgraded lakehouse) is read from that point on: earlier rows lack the old keys."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, silver_path):
        raise UserError(f"no silver table at {silver_path}: run `lakecdc stream` (or `run`) "
                        "first.")
    detail = DeltaTable.forPath(spark, silver_path).detail().first()
    if source_table_ids(spark, checkpoint) - {detail.id}:
        # silver/changes was made anew (a rebuild from bronze): the query reads it from its
        # start. Its changes, applied in order onto the mirrors, end where the source is.
        # Its batch ids start at 0 again, in a checkpoint of a new query id: the mirrors'
        # app id carries that id (``silver.mirrors.mirror_writer.batch_app_id``), so no
        # batch is taken for one the mirrors recorded under the old checkpoint and skipped.
        log.warning("silver/changes at %s is a new table; the mirrors' query starts over "
                    "on it", silver_path)
        remove_checkpoint(spark, checkpoint)
    reader = (spark.readStream.format("delta").option("skipChangeCommits", "true")
              .option("maxBytesPerTrigger", BATCH_BYTES))
    added = detail.properties.get(ADDED_AT_PROPERTY)
    if added is not None:
        reader = reader.option("startingVersion", str(int(added) + 1))
    stream = (reader.load(silver_path).writeStream.queryName(QUERY_NAME)
              .option("checkpointLocation", checkpoint).foreachBatch(writer))
    stream = stream.trigger(availableNow=True) if once \
        else stream.trigger(processingTime=f"{interval_s:g} seconds")
    return stream.start()


def checkpoint_path(config) -> str:
    return spark_path(config.table_path(MIRROR_CHECKPOINT), on_databricks())
