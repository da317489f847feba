"""``lakecdc run``: every stage, in one process.

- ``run_once``: ship until the slot is drained, then the stream (bronze → silver → gold, one
  query, ``availableNow``), then one push. Everything committed on the source before it
  started reaches the dashboard, then it returns.
- ``run_continuous``: four stages, each handing on to the next. The shipper (a thread)
  commits each batch to bronze and hands its step to the dashboard's feeder
  (``pipelines.run.shipping``) and to gold's ``_deltas`` (``gold.ahead``); the stream (one
  streaming query in this process's Spark session) writes silver and gold and hands the
  feeder gold's step of each batch, then asks it to catch up from gold; the mirrors' query
  follows silver; the feeder (a thread, ``gold.feeder``) is the dashboard's one writer.
  Stops on the ``stop`` event (SIGTERM / Ctrl-C) or on the first failure of any stage,
  which is then raised. Each stage commits its progress with its data, so stopping
  anywhere - even mid-batch - only repeats work the next run skips.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from bronze.ship import Shipper
from core.config import Config
from core.engine.api import Engine
from core.engine.choose import start_engine
from core.layout import GOLD, GOLD_DELTAS, GOLD_PENDING, STREAM_CHECKPOINT, Table
from core.spark import low_latency, require_classic
from core.switches import Switches
from gold.ahead import ShipAhead
from gold.feeder import DashboardFeeder
from gold.gold_tables import GoldPaths
from gold.push import push_once
from pipelines.maintain.schedule import Maintainer
from pipelines.run.behind import ShipperBehind
from pipelines.run.stream import (
    LayerProgress,
    SilverGoldWriter,
    StreamPaths,
    StreamRun,
    await_stream,
    prepare,
    start_stream,
    stop_between_batches,
)
from silver.writer import SilverLocations, SilverWriter

if TYPE_CHECKING:
    from pipelines.observe.metrics import PipelineMetrics

log = logging.getLogger("lakecdc.run")

@dataclass(frozen=True)
class Locations:
    silver: SilverLocations
    gold: str
    gold_pending: str
    gold_deltas: str
    checkpoint: str             # the stream's (bronze → silver → gold)

    @classmethod
    def from_config(cls, config: Config) -> "Locations":
        """The Spark paths of every table (``s3://`` roots become ``s3a://`` outside
        Databricks; see ``core.storage``)."""
        from core.storage import on_databricks, spark_path

        def path(table: Table) -> str:
            return spark_path(config.table_path(table), on_databricks())

        return cls(SilverLocations.from_config(config),
                   path(GOLD),
                   path(GOLD_PENDING),
                   path(GOLD_DELTAS),
                   path(STREAM_CHECKPOINT))

    @property
    def stream(self) -> StreamPaths:
        s = self.silver
        return StreamPaths(s.bronze_path, s.silver_path, s.quarantine_path,
                           self.gold_paths, self.checkpoint)

    @property
    def gold_paths(self) -> GoldPaths:
        return GoldPaths(self.gold, self.gold_pending, self.gold_deltas)


@dataclass
class OnceReport:
    shipped: int = 0
    silver_rows: int = 0
    quarantined: int = 0
    gold_transactions: int = 0
    pushed_version: int | None = None
    mirrored: int = 0                   # mirror MERGEs (tables x batches)
    seconds: dict[str, float] = field(default_factory=dict)


class Pipeline:
    def __init__(self, config: Config, spark_factory: Callable | None = None,
                 trigger_interval: str | None = None, push_interval_s: float = 5.0,
                 metrics: "PipelineMetrics | None" = None) -> None:
        self.config = config
        # Event metrics (pipelines.observe.metrics), recorded by every stage run through
        # this object.
        self.metrics = metrics
        self._stream_listener = None
        self.where = Locations.from_config(config)
        self._spark_factory = spark_factory
        self._spark = None
        self.trigger_interval = trigger_interval or f"{config.stream_trigger_s:g} seconds"
        # The dashboard's feeder catches up from gold after every stream batch; this is only
        # how often it also looks by itself (a gold written by another process, a dashboard
        # back after an outage).
        self.push_interval_s = push_interval_s
        # Fault points and guards switched off (test hooks), handed to every stage.
        self.switches = Switches.from_config(config)
        self._gold_locked = False
        self._mirrors_locked = False
        self.marks = LayerProgress()
        self.started = threading.Event()    # set once run_continuous's stream is up
        # Called with every stream batch's ``PassResult`` (benchmarks, tests); never fail it.
        self.on_pass: list[Callable] = []
        # Called with every shipper batch's ``(ShipBatch, Progress)`` (benchmarks); never
        # fail it.
        self.on_ship: list[Callable] = []

    @property
    def spark(self):
        if self._spark is None:
            if self._spark_factory is None:      # a session that can reach the lakehouse
                from core.spark import get_or_create
                from core.storage import Lakehouse

                lakehouse = Lakehouse.from_config(self.config)
                self._spark_factory = lambda: get_or_create(
                    lakehouse=lakehouse, master=self.config.spark_master)
            self._spark = self._spark_factory()
        return self._spark

    def engine(self) -> Engine:
        """A new storage engine for one writer or reader (``core.engine.choose``): Spark's
        Delta on a session of its own from this pipeline's (its SQL settings reach no other
        writer's commits) where only Spark reaches storage, else delta-rs (no JVM started)."""
        return start_engine(self.config, lambda: self.spark)

    def classic_spark(self, command: str):
        """The session, refused with one sentence when it is Spark Connect
        (``core.spark.require_classic``): ``command``'s queries need a classic one. Checked
        first, before any lock, connection or table is touched."""
        require_classic(self.spark, command)
        return self.spark

    @property
    def _delta_rs_options(self) -> dict | None:
        from core.storage import Lakehouse

        return Lakehouse.from_config(self.config).delta_rs_options()

    def seed_gold_from_baseline(self) -> bool:
        """Before gold's first batch: seed it with setup's baseline counts (exact as of the
        slot's consistent point). Decided by what gold records (``holds_counts``), never by
        whether its table exists; a retry after a kill anywhere in here seeds once."""
        from gold.gold_tables import holds_counts, seed_gold
        from pipelines.source.baseline import read_baseline

        self.switches.hit("before_gold_seed")
        baseline = read_baseline(self.config.baseline_path, engine=self.engine())
        if baseline is None or holds_counts(self.spark, self.where.gold):
            return False
        commit_lsn, counts = baseline
        frame = self.spark.createDataFrame(counts.to_pylist(), schema=", ".join(
            [f"{c} string" for c in counts.column_names[:-1]] + ["count bigint"]))
        seeded = seed_gold(self.spark, self.where.gold, frame, commit_lsn,
                           switches=self.switches)
        self.switches.hit("after_gold_seed")
        return seeded

    def require_no_gap(self) -> None:
        """Refuse gold while bronze holds a re-baseline gap gold's counts do not cover.

        ``setup --rebaseline`` restarts the slot past changes that were never captured;
        counts carried on from before it would silently miss them."""
        from bronze.spark_table import bronze_table
        from core.lsn import fmt
        from gold.deltas import REBUILD, GoldStopped
        from gold.gold_tables import seed_floor

        bronze = bronze_table(self.config, engine=self.engine())
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
        """Held by every gold writer (``core.locks``): one at a time. Re-entrant
        within this pipeline (verify's repair holds it around a rebuild)."""
        from core.locks import gold_writer_lock

        if self._gold_locked:
            yield
            return
        with gold_writer_lock(self.config.dashboard, self.where.gold):
            self._gold_locked = True
            try:
                yield
            finally:
                self._gold_locked = False

    @contextmanager
    def mirrors_lock(self):
        """Held by the mirrors' writer (``core.locks``): one at a time. Re-entrant within
        this pipeline (``run`` holds it around its mirrors' query)."""
        from core.locks import mirrors_writer_lock

        if self._mirrors_locked or not self.config.mirrored:
            yield
            return
        with mirrors_writer_lock(self.config.dashboard, self.config.lakehouse):
            self._mirrors_locked = True
            try:
                yield
            finally:
                self._mirrors_locked = False

    # --- stages, one at a time -----------------------------------------------------------

    def start_stream(self, once: bool, accept_errors_upto: int | None = None,
                     max_files_per_trigger: int | None = None,
                     feeder: DashboardFeeder | None = None, behind: ShipperBehind | None = None):
        """Prepare, seed gold if it has no counts yet, and start the one-pass stream
        (``pipelines.run.stream``); returns (query, writer). Call under ``gold_lock``.
        ``feeder``: the dashboard's, handed each batch's step; ``behind``: each batch held
        while the shipper catches up with the dashboard following it
        (``pipelines.run.behind``)."""
        from gold.start import gold_writer
        from pipelines.setup.capture import known_tables

        paths = self.where.stream
        silver = SilverWriter(paths.silver, paths.quarantine, self.config.tables,
                              refresh_known=known_tables(self.config, self._delta_rs_options,
                                                         engine=self.engine()),
                              switches=self.switches,
                              counted_tables=self.config.counted.names,
                              storage_options=self._delta_rs_options,
                              engine=self.engine())
        self._observe_streams()
        prepare(self.spark, paths, silver, self.switches)
        self.seed_gold_from_baseline()
        self.require_no_gap()
        gold = gold_writer(self.spark, paths.gold, tables=self.config.counted,
                           accept_errors_upto=accept_errors_upto or 0,
                           switches=self.switches,
                           storage_options=self._delta_rs_options,
                           fold_share=self.config.gold_fold_share, engine=self.engine())
        callbacks = [self.marks.on_pass, *self.on_pass,
                     Maintainer(self.config, "stream", exclusive=gold.paused,
                                engine=self.engine(), switches=self.switches).after_batch]
        if self.metrics is not None:
            callbacks.append(self.metrics.on_pass)
        writer = SilverGoldWriter(silver, gold, self.switches, callbacks, feeder)
        query = start_stream(self.spark, paths,
                             writer if behind is None else behind.holding("stream", writer), once,
                             trigger_interval=self.trigger_interval,
                             max_files_per_trigger=max_files_per_trigger)
        return query, writer

    def stream(self, once: bool, stop: threading.Event | None = None,
               accept_errors_upto: int | None = None,
               max_files_per_trigger: int | None = None) -> StreamRun:
        """bronze → silver → gold: with ``once`` until bronze is drained, else until ``stop``
        is set or a batch fails (raised as its own error)."""
        spark = self.classic_spark("stream")
        with self.gold_lock(), low_latency(spark, not once):
            query, writer = self.start_stream(once, accept_errors_upto,
                                              max_files_per_trigger=max_files_per_trigger)
            return await_stream(query, writer, stop)

    def push(self, once: bool, stop: threading.Event | None = None):
        """gold → the dashboard: one push, or pushes until ``stop`` (``gold.feeder``)."""
        if once:
            result = push_once(self.where.gold, self.config.dashboard, switches=self.switches,
                               marks=self.marks.snapshot(), engine=self.engine())
            if self.metrics is not None:
                self.metrics.on_push(result)
            return result
        feeder = self.dashboard_feeder()
        feeder.catch_up()
        return feeder.run(stop)

    def start_mirrors(self, once: bool, accept_errors_upto: int | None = None,
                      behind: ShipperBehind | None = None):
        """Create missing mirrors and start their query (``pipelines.run.mirror_query``); returns
        (query, writer). Silver must exist (the stream creates it). ``behind``: as for
        ``start_stream``."""
        from core.storage import gold_key
        from pipelines.run.markers import record_marker
        from pipelines.run.mirror_progress import MirrorProgress
        from pipelines.run.mirror_query import (
            checkpoint_path,
            held_changes,
            loading_tables,
            mirror_discovery,
            prepare_mirrors,
            start_mirrors,
        )
        from pipelines.setup.capture import captured_tables
        from silver.mirrors.mirror_writer import MirrorWriter
        from silver.mirrors.store import mirror_store

        options = self._delta_rs_options
        engine = self.engine()          # the mirrors' writer's, its markers' and its reads'
        store = mirror_store(engine=engine, storage_options=options,
                             switches=self.switches,
                             merge_s=self.config.mirror_merge_s,
                             log_retention_minutes=self.config.log_retention_minutes)
        config = self.config.with_(tables=captured_tables(self.config, options, engine=engine))
        paths, floors = prepare_mirrors(self.spark, config, options, store, self.switches)
        progress = MirrorProgress(self.config.dashboard, gold_key(self.where.gold))
        writer = MirrorWriter(paths, accept_errors_upto or 0, floors,
                              discover=mirror_discovery(self.spark, self.config, options, store,
                                                        self.switches),
                              on_marker=record_marker(self.config.lakehouse, engine=engine),
                              switches=self.switches, storage_options=options,
                              on_complete=progress.record, on_finish=progress.close,
                              store=store, **(dict(
                                  loading=loading_tables(self.config, options, engine),
                                  held=held_changes(self.spark, self.where.silver.silver_path))
                                  if self.switches.on("mirror_replay") else {}))
        writer.after_batch = Maintainer(self.config, "mirrors",
                                        mirrored=lambda: tuple(
                                            t for t in writer.paths
                                            if t not in writer.now_loading),
                                        exclusive=store.paused, engine=self.engine(),
                                        switches=self.switches).after_batch
        query = start_mirrors(self.spark, self.where.silver.silver_path,
                              checkpoint_path(self.config),
                              writer if behind is None else behind.holding("mirrors", writer),
                              once, self.config.mirror_interval_s)
        return query, writer

    def mirrors(self, once: bool, stop: threading.Event | None = None,
                accept_errors_upto: int | None = None) -> dict:
        """silver → the mirrors: with ``once`` until silver is drained, else until ``stop``
        is set or a batch fails. Returns table → batches merged."""
        self.classic_spark("mirrors")
        with self.mirrors_lock():
            query, writer = self.start_mirrors(once, accept_errors_upto)
            return await_stream(query, writer, stop)

    # --- all stages -----------------------------------------------------------------------

    def run_once(self) -> OnceReport:
        self.classic_spark("run --once")        # before the shipper moves the slot
        report = OnceReport()
        started = time.monotonic()
        report.shipped = self.shipper().run(once=True).changes
        report.seconds["ship"] = time.monotonic() - started
        t = time.monotonic()
        run = self.stream(once=True)
        report.silver_rows, report.quarantined = run.silver_rows, run.quarantined
        report.gold_transactions = run.applied_transactions
        report.seconds["stream"] = time.monotonic() - t
        t = time.monotonic()
        report.pushed_version = self.push(once=True).gold_version
        report.seconds["push"] = time.monotonic() - t
        if self.config.mirrored:
            t = time.monotonic()
            report.mirrored = sum(self.mirrors(once=True).values())
            report.seconds["mirrors"] = time.monotonic() - t
        return report

    def run_continuous(self, stop: threading.Event) -> None:
        self.classic_spark("run")
        with self.gold_lock(), self.mirrors_lock():
            self._run_continuous(stop)

    def _run_continuous(self, stop: threading.Event) -> None:
        self.started.clear()
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

        # The dashboard's one writer, from the shipper's first batch on: each stage hands it
        # its steps (gold.feeder). In a catch-up the dashboard follows the shipper, and the
        # stream and the mirrors wait for it (pipelines.run.behind).
        feeder = self.dashboard_feeder()
        feeding = guarded("dashboard", feeder.run)
        steps = ShipAhead(feeder, self.config.counted)
        behind = ShipperBehind(stop)
        shipped = threading.Event()         # the shipper's first batch is done

        def first_batch(result, progress) -> None:
            shipped.set()
        self.on_ship.append(first_batch)
        shipping = guarded("ship", lambda: self.shipper(steps, behind).run(once=False,
                                                                           stop=stop))
        query = writer = mirrors = None
        with ExitStack() as latency:
            try:
                # Started on a backlog, the dashboard follows the shipper from its first
                # batch, and the stream's start waits for that catch-up as the stream's
                # batches do (at most HOLD_S): the JVM's work of starting the queries
                # would take a core from it.
                behind.hold("stream", before=shipped)
                latency.enter_context(low_latency(self.spark, True))
                query, writer = self.start_stream(False, feeder=feeder, behind=behind)
                if not self.config.spark_writes:    # an append of milliseconds, not Spark's
                    steps.to_gold(writer.gold)      # gold follows the shipper too
                if self.config.mirrored:
                    mirrors = self.start_mirrors(False, behind=behind)
                self.started.set()
                feeder.catch_up()               # and from now on every push_interval_s
                while not stop.is_set():
                    for q, w in ((query, writer), *([mirrors] if mirrors else [])):
                        if not q.isActive and not stop.is_set():
                            # A batch's own error (e.g. a TRUNCATE: exit 2 with its
                            # sentence) rather than Spark's wrapper around it.
                            errors.append(w.failure or q.exception()
                                          or RuntimeError(f"query {q.name} stopped"))
                            stop.set()
                    writer.idle()
                    if mirrors:
                        mirrors[1].idle()       # a big mirror's tail folded when due
                    stop.wait(0.5)
            finally:
                stop.set()
                for running in (query, mirrors[0] if mirrors else None):
                    if running is not None:
                        stop_between_batches(running)
                if mirrors:
                    mirrors[1].finish()
                steps.to_gold(None)
                if writer is not None:
                    try:
                        writer.finish()     # service_stats holds every step applied
                    except Exception as exc:
                        errors.append(exc)
                shipping.join(timeout=120)
                steps.close()
                feeder.close()              # after the steps still handed on
                feeding.join(timeout=120)
                self.on_ship.remove(first_batch)
        if errors:
            raise errors[0]

    def dashboard_feeder(self) -> DashboardFeeder:
        """The dashboard's one writer (``gold.feeder``), recording this pipeline's marks."""
        return DashboardFeeder(self.where.gold, self.config.dashboard,
                               interval_s=self.push_interval_s, marks=self.marks.snapshot,
                               switches=self.switches, engine=self.engine(),
                               on_result=self.metrics.on_push if self.metrics else None)

    def shipper(self, steps: ShipAhead | None = None,
                behind: ShipperBehind | None = None) -> Shipper:
        """The shipper, handing each batch on (``pipelines.run.shipping``): with ``steps``
        each batch's step goes to the dashboard as soon as bronze holds it, and ``behind``
        holds the stream's and the mirrors' batches in a catch-up the dashboard follows."""
        from pipelines.run.shipping import run_shipper

        return run_shipper(self, steps, behind)

    def _observe_streams(self) -> None:
        """Record Spark streaming progress (rows and batch durations per query) into
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

