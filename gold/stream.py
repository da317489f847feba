"""``lakecdc gold [--once]``: the silver → gold stream (Structured Streaming + foreachBatch).

``start_gold`` checks, creates what is missing, and starts the query; ``run_gold`` runs it
to the end (``once``: everything silver holds now, ``Trigger.AvailableNow``) or until a stop
event is set. Exactly-once comes from ``gold.apply`` (txnAppId/txnVersion on every write,
MERGE before ``_pending``); this module adds the start-up refusals that keep it true:

- silver missing: nothing to read (run ``lakecdc setup`` / ``lakecdc silver`` first);
- gold has applied batches but the checkpoint is missing or older than them (F18): a fresh
  checkpoint would re-read silver from its start and count it again, an older one would
  re-plan batches under ids Delta already recorded and skip new data. Refused, with the
  way out (restore the checkpoint, or rebuild gold);
- gold seeded at a source LSN (``seed_gold``) or rebuilt at one (``gold.rebuild``):
  silver rows below it are already counted, so they are skipped (``floor_lsn``) - what
  lets a rebuilt gold start from a fresh checkpoint (``drop_checkpoint``; its batch ids
  restart at 0 under the rebuild's own txn app id, ``gold.apply.txn_app_id``) over a
  silver that holds older changes, truncates included.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from gold.apply import (BatchResult, Faults, GoldBatchWriter, GoldPaths, ensure_gold_tables,
                        last_metadata)
from gold.asof import gold_state
from gold.deltas import COUNTED, REBUILD, CountedTables
from pipelines.captured import DIMS
from pipelines.checkpoints import remove_incomplete_writes
from pipelines.errors import UserError

log = logging.getLogger("lakecdc.gold")

QUERY_NAME = "lakecdc_gold"
# The silver columns gold reads; the rest (column maps, messages) is left unread.
SILVER_COLUMNS = ("commit_lsn", "seq", "tx_changes", "commit_ts", "op", "schema_name",
                  "table_name", *DIMS, "old_id", *[f"old_{c}" for c in DIMS], "error")


@dataclass
class GoldRun:
    """What one ``run_gold`` did, batch by batch."""

    batches: list[BatchResult] = field(default_factory=list)

    @property
    def silver_rows(self) -> int:
        return sum(b.silver_rows for b in self.batches)

    @property
    def applied_transactions(self) -> int:
        return sum(b.applied_transactions for b in self.batches)

    @property
    def commit_lsn(self) -> int | None:
        lsns = [b.commit_lsn for b in self.batches if b.commit_lsn is not None]
        return max(lsns) if lsns else None


def gold_writer(spark: SparkSession, gold_path: str, pending_path: str | None = None, *,
                tables: CountedTables = COUNTED, accept_errors_upto: int = 0,
                guard: bool = True, faults: Faults | None = None,
                on_result=None) -> GoldBatchWriter:
    """The foreachBatch function for ``gold_path``, floored at gold's seed LSN."""
    paths = GoldPaths(gold_path, pending_path) if pending_path else GoldPaths.beside(gold_path)
    state = gold_state(spark, paths.gold)
    return GoldBatchWriter(paths, tables, floor_lsn=state.floor if state else 0,
                           epoch=state.epoch if state else None,
                           accept_errors_upto=accept_errors_upto, guard=guard, faults=faults,
                           on_result=on_result)


def start_gold(spark: SparkSession, silver_path: str, gold_path: str, checkpoint_dir: str,
               once: bool = False, *, writer: GoldBatchWriter | None = None,
               pending_path: str | None = None, trigger_interval: str = "5 seconds",
               max_files_per_trigger: int | None = None, **writer_options) -> StreamingQuery:
    """Start the gold stream after the start-up checks; returns the running query.

    Pass ``writer`` (``gold_writer(...)``) to keep a handle on it: ``writer.failure`` holds
    the original error when the query fails, ``writer.results`` the batches. Otherwise one
    is built from ``writer_options`` (``tables``, ``accept_errors_upto``, ``guard``,
    ``faults``). ``max_files_per_trigger`` bounds a micro-batch; it may then split a silver
    commit, which ``gold.apply`` handles.
    """
    if writer is None:
        writer = gold_writer(spark, gold_path, pending_path, **writer_options)
    paths = writer.paths
    if not DeltaTable.isDeltaTable(spark, silver_path):
        raise UserError(f"there is no silver table at {silver_path}: run `lakecdc setup` and "
                        "`lakecdc silver` first.")
    for created in ensure_gold_tables(spark, paths):
        log.info("created %s", created)
    check_checkpoint(spark, paths, checkpoint_dir)
    remove_incomplete_writes(spark, checkpoint_dir)  # a kill mid-write must not wedge it
    # A reprocess-silver commit replaces rows already streamed: not new changes (gold is
    # rebuilt after it), so the stream passes over such commits instead of failing on them.
    reader = spark.readStream.format("delta").option("skipChangeCommits", "true")
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    stream = (reader.load(silver_path).select(*SILVER_COLUMNS).writeStream
              .queryName(QUERY_NAME)
              .option("checkpointLocation", checkpoint_dir)
              .foreachBatch(writer))
    stream = stream.trigger(availableNow=True) if once \
        else stream.trigger(processingTime=trigger_interval)
    return stream.start()


def run_gold(spark: SparkSession, silver_path: str, gold_path: str, checkpoint_dir: str,
             once: bool = True, stop: threading.Event | None = None, *,
             pending_path: str | None = None, trigger_interval: str = "5 seconds",
             max_files_per_trigger: int | None = None, poll_s: float = 1.0,
             **writer_options) -> GoldRun:
    """Run the gold stream: with ``once`` until silver is drained, else until ``stop`` is set.

    Raises the batch's own error when it is one a person must act on (``GoldStopped`` and
    other ``UserError``: the CLI prints one sentence, exit 2) or a contract breach
    (``GoldInputError``), instead of Spark's wrapped ``StreamingQueryException``.
    """
    writer = gold_writer(spark, gold_path, pending_path, **writer_options)
    query = start_gold(spark, silver_path, gold_path, checkpoint_dir, once, writer=writer,
                       trigger_interval=trigger_interval,
                       max_files_per_trigger=max_files_per_trigger)
    try:
        if once:
            query.awaitTermination()
        else:
            while not (stop is not None and stop.is_set()):
                if query.awaitTermination(poll_s):
                    break
    except StreamingQueryException:
        if writer.failure is not None:     # the batch's own exception, not Spark's wrapper
            raise writer.failure from None
        raise
    finally:
        if query.isActive:
            query.stop()
    return GoldRun(list(writer.results))


def check_checkpoint(spark: SparkSession, paths: GoldPaths, checkpoint_dir: str) -> None:
    """Refuse to start when gold is ahead of the checkpoint (F18): see the module docstring."""
    recorded = [m.get("batch_id") for m in (last_metadata(spark, paths.gold),
                                            last_metadata(spark, paths.pending)) if m]
    recorded = [b for b in recorded if b is not None]
    if not recorded:
        return
    planned = latest_planned_batch(spark, checkpoint_dir)
    if planned is None or planned < max(recorded):
        state = "missing" if planned is None else f"at batch {planned}"
        raise UserError(
            f"the gold checkpoint {checkpoint_dir} is {state} but gold has applied batch "
            f"{max(recorded)}; starting would count silver again. Restore that checkpoint, "
            f"or {REBUILD}.")


def latest_planned_batch(spark: SparkSession, checkpoint_dir: str) -> int | None:
    """Highest batch id in the checkpoint's offset log (planned batches), or None."""
    names = _list_dir(spark, checkpoint_dir.rstrip("/") + "/offsets")
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None


def drop_checkpoint(spark: SparkSession, checkpoint_dir: str) -> bool:
    """Delete the gold checkpoint (a rebuild starts the stream afresh); True if it existed."""
    jvm = getattr(spark, "_jvm", None) or getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:
        local = checkpoint_dir.removeprefix("file:")
        existed = os.path.isdir(local)
        shutil.rmtree(local, ignore_errors=True)
        return existed
    hpath = jvm.org.apache.hadoop.fs.Path(checkpoint_dir)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hpath) and fs.delete(hpath, True))


def _list_dir(spark: SparkSession, path: str) -> list[str]:
    jvm = getattr(spark, "_jvm", None) or getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:      # no JVM handle (Spark Connect): only local paths can be checked
        local = path.removeprefix("file:")
        return os.listdir(local) if os.path.isdir(local) else []
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hpath):
        return []
    return [status.getPath().getName() for status in fs.listStatus(hpath)]
