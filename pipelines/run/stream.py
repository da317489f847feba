"""``lakecdc stream [--once]``: bronze → silver → gold in one Structured Streaming query.

One query reads bronze; its ``foreachBatch`` (``SilverGoldWriter``) does, per micro-batch ``b``:

1. bring the batch's bronze rows to the driver and parse them once, in Arrow
   (``silver.writer``, ``silver.parse``), for both halves;
2. at the same time, in two threads (gold's reading what ``_pending`` holds already while
   the batch is parsed):
   - silver: append ``silver/changes`` and the batch's failed rows to ``silver/quarantine``
     (Delta app transactions ``lakecdc-silver`` / ``lakecdc-quarantine``, version ``b``);
   - gold (``gold.apply``): the parsed rows' signed deltas of whole source transactions
     past gold's watermark, a step appended to ``gold/_deltas`` and folded into
     ``gold/service_stats`` (app transactions versioned by the step's watermark), partial
     transactions carried in ``gold/_pending`` (app transaction ``lakecdc-gold[@epoch]``,
     version ``b``);
3. ``feeder`` (``lakecdc run``): as soon as gold has planned its step, the step is handed
   to the dashboard's feeder (``gold.feeder``), which adds it in its own thread while silver
   appends and gold writes its step: the dashboard's upsert, which grows with the
   dashboard, is on neither half's path, and the batch ends when the feeder has answered;
   then the feeder is asked to catch the dashboard up from gold;
4. ``on_pass`` callbacks: the layers' marks, metrics, maintenance.

Why one query (docs/benchmarks.md): a change used to wait for a silver micro-batch, then a
gold one, then the push loop, paying Spark's per-batch cost at each hop, and three queries
competed for the cores. Now it waits for one batch, and the bronze rows are parsed once.

Exactly once: every write is idempotent on its own, so a replay of batch ``b`` after a kill
anywhere (between the two silver appends, between silver and gold, between the MERGE and
``_pending``, before Spark's commit file) skips what is written and completes the rest.
The stream's checkpoint is what maps batch ids to bronze rows, so starting is refused when
silver or gold record a batch the checkpoint has not planned (it was lost, or restored from
an older copy; F18): replaying under reused ids would skip or double data.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from pyspark import InheritableThread
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from core.checkpoints import has_metadata, latest_planned_batch, remove_incomplete_writes
from core.config import STREAM_TRIGGER_S
from core.errors import UserError
from core.layout import STREAM_QUERY
from core.switches import NONE, Switches
from gold.apply import GoldBatch, GoldBatchWriter, Planned
from gold.deltas import REBUILD
from gold.feeder import DashboardFeeder
from gold.gold_tables import GoldPaths
from gold.start import applied_batch, prepare_gold
from silver.writer import SilverBatch, SilverWriter, last_batch

log = logging.getLogger("lakecdc.stream")

# The most compressed bronze bytes one micro-batch reads (Delta's ``maxBytesPerTrigger``; a
# bigger file is read alone). A batch is parsed on the driver (``silver.writer``), so this
# bounds the driver's memory: 16 MB of the benchmark's bronze is about 380,000 changes and
# 450 MB of JSON, and a 308,289-row batch peaked at 1.7 GB of Python memory.
BATCH_BYTES = "16m"

# How often the continuous stream starts a batch. The dashboard does not wait for it: each
# shipper batch's step goes ahead of the stream (``gold.ahead``), and silver and gold trail
# the dashboard by about this much more. Every batch costs the JVM about the same whatever
# it holds (reading bronze's log, committing offsets, the batch's Spark jobs), on the cores
# the shipper's path needs: at 250 ms the batches ran back to back under traffic. Against
# 250 ms, 2 s ran about a third of the batches for about half the JVM's CPU, and the
# dashboard's p95 fell at both of the benchmark's rates (docs/gold.md, "The stream's
# trigger").
TRIGGER_INTERVAL = f"{STREAM_TRIGGER_S:g} seconds"     # LAKECDC_TRIGGER_INTERVAL


@dataclass(frozen=True)
class PassResult:
    """One micro-batch through silver and gold."""

    batch_id: int
    silver: SilverBatch
    gold: GoldBatch
    seconds: float
    silver_seconds: float           # parse and the silver appends
    parse_seconds: float = 0.0      # of which the parse (and reading the batch)
    # The batch's bronze rows. Spark's progress does not count them (its ``numInputRows``
    # is 0 when the batch's files are read by pyarrow: ``silver.writer.batch_rows``).
    input_rows: int = 0
    ahead_seconds: float = 0.0      # the push of gold's step ahead of gold, beside both halves
    # From the batch's start to the end of its last push ahead (its rows on the dashboard);
    # 0.0 when none was pushed ahead (the feeder's catch-up brings them, after gold's MERGE).
    ahead_done_seconds: float = 0.0
    started_at: float = 0.0         # the batch's start, wall clock (time.time())


@dataclass
class StreamRun:
    """What one ``run_stream`` did, summed over its batches."""

    batches: int = 0
    silver_rows: int = 0
    quarantined: int = 0
    applied_transactions: int = 0
    commit_lsn: int | None = None           # gold's watermark after the last batch

    def add(self, result: PassResult) -> None:
        self.batches += 1
        self.silver_rows += result.silver.rows
        self.quarantined += result.silver.quarantined
        self.applied_transactions += result.gold.applied_transactions
        if result.gold.commit_lsn is not None:
            self.commit_lsn = result.gold.commit_lsn


class SilverGoldWriter:
    """The ``foreachBatch`` function of the stream (see the module docstring).

    ``failure`` keeps a batch's own exception (Spark wraps it), so a ``GoldStopped`` reaches
    the CLI as its one sentence. ``on_pass`` callbacks never fail a batch, nor does the
    ``feeder`` (a step it cannot add is answered not taken)."""

    def __init__(self, silver: SilverWriter, gold: GoldBatchWriter, switches: Switches = NONE,
                 on_pass: list[Callable[[PassResult], None]] | None = None,
                 feeder: DashboardFeeder | None = None) -> None:
        self.silver = silver
        self.gold = gold
        self.feeder = feeder
        self.switches = switches
        self.on_pass = list(on_pass or [])
        self.run = StreamRun()
        self.failure: BaseException | None = None
        # Held through each batch, so that the last fold (``finish``) never runs beside one.
        self._batch = threading.Lock()

    def __call__(self, bronze: DataFrame, batch_id: int) -> None:
        with self._batch:
            self._pass(bronze, batch_id)

    def idle(self) -> None:
        """Between batches: start a fold of gold's steps waiting in ``_deltas`` when one is
        due, so ``service_stats`` catches up with a stream that went quiet (the fold runs in
        the background, beside the next batch: ``GoldBatchWriter.fold_if_due``)."""
        self.gold.fold_if_due()

    def finish(self) -> None:
        """After the last batch: fold every step still waiting, so the stream leaves
        ``service_stats`` holding all it applied."""
        with self._batch:
            self.gold.fold()

    def _pass(self, bronze: DataFrame, batch_id: int) -> None:
        started, started_at = time.monotonic(), time.time()
        try:
            written, applied, parse_seconds, silver_seconds, rows, ahead_seconds, ahead_done = \
                self._both(bronze, batch_id, started)
        except BaseException as exc:
            self.failure = exc
            raise
        result = PassResult(batch_id, written, applied, time.monotonic() - started,
                            silver_seconds, parse_seconds, rows, ahead_seconds,
                            max(0.0, ahead_done - started) if ahead_done else 0.0,
                            started_at)
        self.run.add(result)
        log.info("batch %d: %d rows to silver (%d quarantined), %d transactions applied to "
                 "gold (%d keys), %d carried, %.2fs%s", batch_id, written.rows,
                 written.quarantined, applied.applied_transactions, applied.step_keys,
                 applied.pending_transactions, result.seconds,
                 " (gold: replay, already applied)" if applied.replayed else "")
        for callback in self.on_pass:
            try:
                callback(result)
            except Exception:                # an observer never fails the batch
                log.warning("batch %d: a pass callback failed", batch_id, exc_info=True)
        if self.feeder is not None:
            self.feeder.catch_up()          # the batch is in gold, its marks recorded

    def _both(self, bronze: DataFrame, batch_id: int, started: float):
        """The parse, then silver's appends and gold's MERGE of the parsed batch at the same
        time: they are independent writes, each idempotent on its own, and most of their time
        is spent on the driver (Delta log work), so two threads keep both cores busy. The
        gold thread starts with the batch: it reads what ``_pending`` holds
        (``GoldBatchWriter.read_pending``) while the batch is parsed. Both always run to the end;
        the first error (the parse's or silver's, else gold's) is raised after. The gold
        thread inherits the batch's Spark job properties (its query's job group: stopping
        the query cancels its jobs too).

        With a ``feeder``, the gold thread hands it its step as soon as the step is planned;
        the feeder adds it to the dashboard beside gold's write of the step and whether or
        not silver's appends are done (``verify`` waits for silver to hold what the dashboard
        holds before reading it). Neither half waits for that: an upsert into the dashboard
        grows with the dashboard's rows, gold's step does not. The batch waits for the
        feeder's answer, so a batch's steps reach the dashboard before its catch-up is asked
        for."""
        gold: dict = {}
        parsed_batch: Future = Future()
        offered: list[Future] = []
        spark = bronze.sparkSession

        def plan(step: Planned) -> None:
            offered.append(self.feeder.offer(step, by="stream"))

        def apply() -> None:
            try:
                pending = self.gold.read_pending(spark, batch_id)
                gold["result"] = self.gold.apply(
                    spark, parsed_batch.result().rows, batch_id,
                    plan if self.feeder is not None else None, pending)
            except BaseException as exc:
                gold["error"] = exc

        thread = InheritableThread(target=apply, name=f"lakecdc-gold-{batch_id}", daemon=True)
        thread.start()
        try:
            try:
                parsed = self.silver.parse(bronze)
            except BaseException as exc:
                parsed_batch.set_exception(exc)
                raise
            parsed_batch.set_result(parsed)
            parse_seconds = time.monotonic() - started
            written = self.silver.append(spark, parsed, batch_id)
            silver_seconds = time.monotonic() - started
            self.switches.hit("after_silver_append")
        finally:
            thread.join()
            answers = [answer.result() for answer in offered]
        if "error" in gold:
            raise gold["error"]
        return (written, gold["result"], parse_seconds, silver_seconds, parsed.rows.num_rows,
                sum(a.seconds for a in answers),
                max((a.done_at for a in answers if a.taken), default=0.0))


@dataclass(frozen=True)
class StreamPaths:
    bronze: str
    silver: str
    quarantine: str
    gold: GoldPaths
    checkpoint: str


def prepare(spark: SparkSession, paths: StreamPaths, silver: SilverWriter,
            switches: Switches = NONE) -> None:
    """Everything the stream needs before it starts, and the refusals that keep it exact."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, paths.bronze):
        raise UserError(f"no bronze table at {paths.bronze}: run `lakecdc setup` first.")
    silver.prepare(spark)
    prepare_gold(spark, paths.gold, switches)
    check_checkpoint(spark, paths)
    remove_incomplete_writes(spark, paths.checkpoint)    # a kill mid-write must not wedge it


def check_checkpoint(spark: SparkSession, paths: StreamPaths) -> None:
    """Refuse to start when silver or gold are ahead of the checkpoint (F18): when they
    record a batch (their app transactions: ``last_batch``, ``applied_batch``; never the
    commits' metadata, which log cleanup deletes, F30) that the checkpoint has not
    planned."""
    recorded = {name: batch for name, batch in (
        ("silver", last_batch(spark, paths.silver)),
        ("gold", applied_batch(spark, paths.gold))) if batch is not None}
    planned = latest_planned_batch(spark, paths.checkpoint)
    if not has_metadata(spark, paths.checkpoint) and _streamed(spark, paths.silver):
        recorded.setdefault("silver", 0)
    ahead = {name: batch for name, batch in recorded.items()
             if planned is None or planned < batch}
    if not ahead:
        return
    state = "missing" if planned is None else f"at batch {planned}"
    which = " and ".join(f"{name} (batch {batch})" for name, batch in ahead.items())
    raise UserError(
        f"the stream checkpoint {paths.checkpoint} is {state} but {which} already hold later "
        "batches; starting would append or count bronze again. Restore that checkpoint, or "
        "move away silver/changes, silver/quarantine and the checkpoint together and "
        f"{REBUILD}.")


def _streamed(spark: SparkSession, path: str) -> bool:
    """Whether the silver table holds anything written after its creation (version 0)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return False
    return DeltaTable.forPath(spark, path).history(1).collect()[0]["version"] > 0


def start_stream(spark: SparkSession, paths: StreamPaths, writer: SilverGoldWriter, once: bool, *,
                 trigger_interval: str = TRIGGER_INTERVAL,
                 max_files_per_trigger: int | None = None) -> StreamingQuery:
    """Start the query (after ``prepare``). ``once``: everything bronze holds now
    (``availableNow``), then it ends. A micro-batch reads at most ``BATCH_BYTES`` of bronze,
    and with ``max_files_per_trigger`` at most that many files; either may split a bronze
    commit, which gold handles (``_pending``)."""
    reader = spark.readStream.format("delta").option("maxBytesPerTrigger", BATCH_BYTES)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    stream = (reader.load(paths.bronze).writeStream.queryName(STREAM_QUERY)
              .option("checkpointLocation", paths.checkpoint).foreachBatch(writer))
    stream = stream.trigger(availableNow=True) if once \
        else stream.trigger(processingTime=trigger_interval)
    return stream.start()


def await_stream(query: StreamingQuery, writer, stop: threading.Event | None = None,
                 poll_s: float = 0.5) -> StreamRun:
    """Until the query ends (``once``) or ``stop`` is set; raises a batch's own error.
    ``writer``: the query's ``SilverGoldWriter`` or ``MirrorWriter``, whose ``idle`` runs between
    batches and ``finish`` after the last (gold's waiting steps folded when due, and all of
    them at the end)."""
    try:
        while not (stop is not None and stop.is_set()):
            if query.awaitTermination(poll_s):
                break
            writer.idle()
    except StreamingQueryException:
        if writer.failure is not None:     # the batch's own exception, not Spark's wrapper
            raise writer.failure from None
        raise
    finally:
        stop_between_batches(query)
    writer.finish()
    return writer.run


def stop_between_batches(query: StreamingQuery, timeout_s: float = 120.0) -> None:
    """Stop the query, letting a running micro-batch finish first.

    Stopping mid-batch is safe (the batch re-runs next time: every write is idempotent) but
    kills tasks noisily and wastes the work; waiting a little is kinder to the operator.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while query.isActive and query.status.get("isTriggerActive") and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()
    except Exception as exc:       # best effort: progress is already safe
        log.warning("stopping %s: %s", query.name, exc)


@dataclass
class LayerProgress:
    """The newest source commit each layer holds everything up to, as the stream and the
    shipper of this process last saw it; read by the push (the dashboard's progress)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    layers: dict = field(default_factory=dict)     # layer -> (commit_lsn, commit_ts)

    def set(self, layer: str, commit_lsn: int | None, commit_ts) -> None:
        if commit_lsn is None:
            return
        with self.lock:
            old = self.layers.get(layer)
            if old is None or old[0] < commit_lsn:
                self.layers[layer] = (commit_lsn, commit_ts)

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.layers)

    def on_pass(self, result: PassResult) -> None:
        """Silver holds every transaction below gold's cutoff whole; with nothing carried,
        every transaction of the batch too."""
        silver, gold = result.silver, result.gold
        if not gold.pending_transactions:
            self.set("bronze", silver.commit_lsn, silver.commit_ts)
            self.set("silver", silver.commit_lsn, silver.commit_ts)
