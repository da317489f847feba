"""``lakecdc run``: every stage, in one process.

- ``run_once``: ship until the slot is drained, then silver and gold with ``availableNow``,
  then one push. Everything committed on the source before it started reaches the
  dashboard, then it returns.
- ``run_continuous``: the shipper and the push in threads, silver and gold as streaming
  queries in one Spark session. Stops on the ``stop`` event (SIGTERM / Ctrl-C) or on the
  first failure of any stage, which is then raised. Each stage commits its progress with
  its data, so stopping anywhere - even mid-batch - only repeats work the next run skips.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from bronze.ship import Shipper
from gold.push import push_once, run_push
from gold.stream import QUERY_NAME as GOLD_QUERY, gold_writer, run_gold, start_gold
from pipelines.config import Config
from pipelines.faults import FaultPoints
from silver.stream import SilverLocations, run_silver, start_silver

if TYPE_CHECKING:
    from pipelines.metrics import PipelineMetrics

log = logging.getLogger("lakecdc.run")


@dataclass(frozen=True)
class Locations:
    silver: SilverLocations
    gold: str
    gold_pending: str
    gold_checkpoint: str

    @classmethod
    def from_config(cls, config: Config) -> "Locations":
        """The Spark paths of every table, and the lakehouse declared for the session this
        process will start (``s3://`` roots become ``s3a://`` outside Databricks; see
        ``pipelines.storage`` and ``pipelines.spark``)."""
        from pipelines.spark import use_lakehouse
        from pipelines.storage import Lakehouse, on_databricks, spark_path

        use_lakehouse(Lakehouse.from_config(config))

        def path(layer: str, name: str) -> str:
            return spark_path(config.table_path(layer, name), on_databricks())

        return cls(SilverLocations.from_config(config),
                   path("gold", "service_stats"),
                   path("gold", "_pending"),
                   path("_checkpoints", "gold"))


@dataclass
class OnceReport:
    shipped: int = 0
    silver_rows: int = 0
    quarantined: int = 0
    gold_transactions: int = 0
    pushed_version: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class Pipeline:
    def __init__(self, config: Config, spark_factory: Callable | None = None,
                 trigger_interval: str = "1 second", push_interval_s: float = 0.5,
                 metrics: "PipelineMetrics | None" = None) -> None:
        self.config = config
        # Event metrics (pipelines.metrics), recorded by every stage run through this object.
        self.metrics = metrics
        self._stream_listener = None
        self.where = Locations.from_config(config)
        self._spark_factory = spark_factory
        self._spark = None
        self.trigger_interval = trigger_interval
        self.push_interval_s = push_interval_s
        self.faults = FaultPoints(config.faults)
        self._gold_locked = False
        self.gold_options = {"guard": config.guard_on("gold_txn"), "faults": self.faults,
                             "pending_path": self.where.gold_pending,
                             "tables": config.counted}

    @property
    def spark(self):
        if self._spark is None:
            if self._spark_factory is None:
                from pipelines.spark import get_or_create
                self._spark_factory = get_or_create
            self._spark = self._spark_factory()
        return self._spark

    def seed_gold_from_baseline(self) -> bool:
        """Before gold's first batch: seed it with setup's baseline counts (exact as of the
        slot's consistent point). Decided by what gold records (``holds_counts``), never by
        whether its table exists; a retry after a kill anywhere in here seeds once."""
        from gold.apply import holds_counts, seed_gold
        from pipelines.baseline import read_baseline

        self.faults.hit("before_gold_seed")
        baseline = read_baseline(self.config.baseline_path)
        if baseline is None or holds_counts(self.spark, self.where.gold):
            return False
        commit_lsn, counts = baseline
        frame = self.spark.createDataFrame(counts.to_pylist(), schema=", ".join(
            [f"{c} string" for c in counts.column_names[:-1]] + ["count bigint"]))
        seeded = seed_gold(self.spark, self.where.gold, frame, commit_lsn,
                           faults=self.faults)
        self.faults.hit("after_gold_seed")
        return seeded

    def require_no_gap(self) -> None:
        """Refuse gold while bronze holds a re-baseline gap gold's counts do not cover.

        ``setup --rebaseline`` restarts the slot past changes that were never captured;
        counts carried on from before it would silently miss them."""
        from bronze.table import BronzeTable
        from gold.apply import seed_floor
        from gold.deltas import REBUILD, GoldStopped
        from pipelines.lsn import fmt

        bronze = BronzeTable(self.config.bronze_path)
        at = bronze.rebaselined_at(self.config.slot) if bronze.exists() else None
        if at is None:
            return
        floor = seed_floor(self.spark, self.where.gold)
        if floor < at:
            raise GoldStopped(f"bronze was re-baselined at {fmt(at)}, after gold's baseline "
                              f"({fmt(floor)}): the changes in between were never captured, "
                              f"so gold cannot be exact; {REBUILD}.")

    @contextmanager
    def gold_lock(self):
        """Held by every gold writer (``pipelines.locks``): one at a time. Re-entrant
        within this pipeline (a rebuild holds it and then runs the gold stage)."""
        from pipelines.locks import gold_writer_lock

        if self._gold_locked:
            yield
            return
        with gold_writer_lock(self.config.dashboard, self.where.gold):
            self._gold_locked = True
            try:
                yield
            finally:
                self._gold_locked = False

    # --- stages, one at a time -----------------------------------------------------------

    def silver(self, once: bool, stop: threading.Event | None = None):
        self._observe_streams()
        s = self.where.silver
        return run_silver(self.spark, s.bronze_path, s.silver_path, s.quarantine_path,
                          s.checkpoint_root, self.config.tables, once=once, stop=stop,
                          trigger_interval=self.trigger_interval)

    def gold(self, once: bool, stop: threading.Event | None = None,
             accept_errors_upto: int | None = None):
        w = self.where
        extra = {} if accept_errors_upto is None else {"accept_errors_upto": accept_errors_upto}
        if self.metrics is not None:            # every batch as it ends, also when continuous
            extra["on_result"] = self.metrics.on_gold_batch
        self._observe_streams()
        with self.gold_lock():
            self.seed_gold_from_baseline()
            self.require_no_gap()
            return run_gold(self.spark, w.silver.silver_path, w.gold, w.gold_checkpoint,
                            once=once, stop=stop, trigger_interval=self.trigger_interval,
                            **self.gold_options, **extra)

    def push(self, once: bool, stop: threading.Event | None = None):
        if once:
            result = push_once(self.where.gold, self.config.dashboard, faults=self.faults)
            if self.metrics is not None:
                self.metrics.on_push(result)
            return result
        return run_push(self.where.gold, self.config.dashboard, stop or threading.Event(),
                        interval_s=self.push_interval_s,
                        on_result=self.metrics.on_push if self.metrics is not None else None)

    # --- all stages -----------------------------------------------------------------------

    def run_once(self) -> OnceReport:
        report = OnceReport()
        started = time.monotonic()
        report.shipped = self._shipper().run(once=True).changes
        report.seconds["ship"] = time.monotonic() - started
        t = time.monotonic()
        silver = self.silver(once=True)
        report.silver_rows, report.quarantined = silver.changes_rows, silver.quarantined_rows
        report.seconds["silver"] = time.monotonic() - t
        t = time.monotonic()
        report.gold_transactions = self.gold(once=True).applied_transactions
        report.seconds["gold"] = time.monotonic() - t
        t = time.monotonic()
        report.pushed_version = self.push(once=True).gold_version
        report.seconds["push"] = time.monotonic() - t
        return report

    def run_continuous(self, stop: threading.Event) -> None:
        with self.gold_lock():
            self._run_continuous(stop)

    def _run_continuous(self, stop: threading.Event) -> None:
        errors: list[BaseException] = []

        def guarded(name: str, target: Callable[[], object]) -> threading.Thread:
            def body():
                try:
                    target()
                except BaseException as exc:   # any stage failing stops all of them
                    log.error("%s stopped: %s", name, exc)
                    errors.append(exc)
                    stop.set()
            thread = threading.Thread(target=body, name=f"lakecdc-{name}", daemon=True)
            thread.start()
            return thread

        writer = None
        threads = [guarded("ship", lambda: self._shipper().run(once=False, stop=stop))]
        queries = []
        try:
            s, w = self.where.silver, self.where
            self._observe_streams()
            queries += start_silver(self.spark, s.bronze_path, s.silver_path, s.quarantine_path,
                                    s.checkpoint_root, self.config.tables, once=False,
                                    trigger_interval=self.trigger_interval)
            self.seed_gold_from_baseline()
            self.require_no_gap()
            options = dict(self.gold_options)
            if self.metrics is not None:
                options["on_result"] = self.metrics.on_gold_batch
            writer = gold_writer(self.spark, w.gold, options.pop("pending_path"), **options)
            queries.append(start_gold(self.spark, s.silver_path, w.gold, w.gold_checkpoint,
                                      once=False, writer=writer,
                                      trigger_interval=self.trigger_interval))
            threads.append(guarded("push", lambda: self.push(once=False, stop=stop)))
            while not stop.is_set():
                for query in queries:
                    if not query.isActive:
                        # A gold batch's own error (e.g. a TRUNCATE: exit 2 with its
                        # sentence) rather than Spark's wrapper around it.
                        errors.append(writer.failure if query.name == GOLD_QUERY and
                                      writer.failure is not None else
                                      query.exception() or RuntimeError(
                                          f"query {query.name} stopped"))
                        stop.set()
                stop.wait(0.5)
        finally:
            stop.set()
            for query in queries:
                _stop_between_batches(query)
            for thread in threads:
                thread.join(timeout=120)
        if errors:
            raise errors[0]

    # --- metrics hooks (no-ops without self.metrics) ---------------------------------------

    def _shipper(self) -> Shipper:
        return Shipper(self.config, on_batch=self.metrics.on_ship_batch
                       if self.metrics is not None else None)

    def _observe_streams(self) -> None:
        """Record Spark streaming progress (silver's rows and batch durations) into
        ``self.metrics``: one listener per pipeline, kept on the session (removing it after
        a run could drop progress events still queued on Spark's listener bus)."""
        if self.metrics is None or self._stream_listener is not None:
            return
        self._stream_listener = False         # tried: do not try again
        try:
            self._stream_listener = self.metrics.stream_listener()
            self.spark.streams.addListener(self._stream_listener)
        except Exception as exc:       # e.g. a Spark Connect session: state metrics remain
            log.info("streaming progress metrics unavailable: %s", exc)


def _stop_between_batches(query, timeout_s: float = 120.0) -> None:
    """Stop a streaming query, letting a running micro-batch finish first.

    Stopping mid-batch is safe (the batch re-runs next time: every sink is idempotent) but
    kills tasks noisily and wastes the work; waiting a little is kinder to the operator.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while query.isActive and query.status.get("isTriggerActive") and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
    except Exception as exc:       # best effort: progress is already safe
        log.warning("stopping %s: %s", query.name, exc)
