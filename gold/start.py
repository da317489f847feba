"""Gold's part of the stream's start (``pipelines.run.stream``): its tables, what it has applied,
and its ``foreachBatch`` writer, floored at gold's baseline.

- gold seeded at a source LSN (``seed_gold``) or rebuilt at one (``pipelines.backfill.rebuild``):
  silver rows below it are already counted, so the writer skips them (``floor_lsn``). This is
  what lets a rebuilt gold go on from the stream's checkpoint: the rows of every batch the stream
  replays or plays next that are older than the rebuild's baseline are inside it.
- each rebuild is an *epoch* with a Delta app id of its own (``gold.asof.txn_app_id``), so
  the batch ids the stream goes on with never collide with what Delta recorded before it.

The floor and the epoch are read from the seed's and the newest rebuild's app transactions
(``gold.asof.baseline_of``), and what gold has applied from the stream's (``applied_batch``):
table state that checkpoints carry, so a pipeline stopped longer than the log retention and
maintained meanwhile starts from the same floor, epoch and batches (F30).
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from core.captured import COUNTED, CountedTables
from core.config import GOLD_FOLD_SHARE
from core.engine.api import Engine
from core.engine.spark_delta import recorded
from core.switches import NONE, Switches
from gold.apply import GoldBatchWriter
from gold.asof import baseline_of, gold_state, step_app_id, txn_app_id
from gold.gold_tables import GoldPaths, ensure_gold_tables

log = logging.getLogger("lakecdc.gold")


def prepare_gold(spark: SparkSession, paths: GoldPaths, switches: Switches = NONE) -> None:
    """Create gold, ``_pending`` and ``_deltas`` if absent (``ensure_gold_tables``: its
    refusals). Fault point ``after_gold_create``: created, not seeded yet
    (``pipelines.run.pipeline`` seeds next)."""
    created = ensure_gold_tables(spark, paths)
    for path in created:
        log.info("created %s", path)
    if paths.gold in created:
        switches.hit("after_gold_create")


def applied_batch(spark: SparkSession, paths: GoldPaths) -> int | None:
    """The newest stream batch id gold, ``_pending`` or ``_deltas`` records for the stream
    of gold's epoch (None: none since the last seed or rebuild): the version gold's and
    ``_pending``'s app transaction records, and the newest batch among ``_deltas``' rows
    while it holds steps of that epoch (its own app transaction). Never the commits'
    metadata, which log cleanup deletes (F30)."""
    gold = recorded(spark, paths.gold)
    if gold is None:
        return None
    _, epoch = baseline_of(gold)
    batches = [gold.version_of(txn_app_id(epoch))]
    pending = recorded(spark, paths.pending)
    if pending is not None:
        batches.append(pending.version_of(txn_app_id(epoch)))
    deltas = recorded(spark, paths.deltas)
    if deltas is not None and deltas.version_of(step_app_id(epoch)) is not None:
        batches.append(spark.read.format("delta").load(paths.deltas)
                       .where(F.col("batch_id") >= 0)          # not a shipper batch's step
                       .agg(F.max("batch_id")).first()[0])
    return max((b for b in batches if b is not None), default=None)


def gold_writer(spark: SparkSession, paths: GoldPaths, *, tables: CountedTables = COUNTED,
                accept_errors_upto: int = 0, switches: Switches = NONE,
                storage_options: dict | None = None,
                fold_share: float = GOLD_FOLD_SHARE, engine: Engine | None = None,
                step_engine: Engine | None = None) -> GoldBatchWriter:
    """The gold half of a stream batch, floored at gold's baseline (its seed or rebuild),
    with what an earlier process left in ``_deltas`` folded into gold. ``engine``,
    ``step_engine``: the engines of its commits (``GoldBatchWriter``)."""
    state = gold_state(spark, paths.gold)
    writer = GoldBatchWriter(paths, tables, floor_lsn=state.floor if state else 0,
                             epoch=state.epoch if state else None,
                             accept_errors_upto=accept_errors_upto, switches=switches,
                             storage_options=storage_options,
                             fold_share=fold_share, engine=engine,
                             step_engine=step_engine)
    writer.recover(spark)
    return writer
