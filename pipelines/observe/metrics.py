"""Prometheus metrics: what each layer did (events) and where each layer is (state).

Two sources, on one registry per process (docs/observability.md lists every metric):

- **Events** (``PipelineMetrics``), recorded where the work happens, so only in the process
  that runs the stage: the shipper's ``Downstream.shipped`` (bronze), Spark's streaming progress of
  the silver query (a ``StreamingQueryListener``), the gold writer's ``GoldBatch`` and the
  push's ``PushResult`` (dashboard). Counters and histograms by ``layer``; rows per second
  is ``rate(lakecdc_rows_total[5m])`` in PromQL, not a gauge computed here.
- **State** (``StateCollector``, ``pipelines.observe.metrics_state``), read from the source and the
  tables exactly as ``lakecdc status`` reads them (``pipelines.observe.status``): slot lag and
  ``wal_status``, each layer's version, newest source commit LSN and its age, the
  quarantine's row count. Read on scrape, so it is right wherever the stages run (the
  shipper beside the database, Spark on Databricks): ``lakecdc metrics`` serves only this
  part.

``lakecdc run --metrics-port`` serves the events of every stage and the whole state; a single
stage (``lakecdc ship|silver|gold|push --metrics-port``) serves its own layer's events and
the state of what it writes (``STAGES``), so stages run as separate processes never serve
the same state series twice.

Contracts: recording an event never raises into the stage (a metrics bug must not stop the
pipeline); a state part that cannot be read is reported as ``lakecdc_state_up{part} 0`` and
the other parts are still served; no metric carries a DSN or any other secret.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from bronze.session_loss import RECONNECT_REASONS
from core.config import Config
from core.engine.api import Engine
from core.engine.choose import engine_for
from core.errors import UserError
from core.layout import STREAM_QUERY
from gold.push import LAYERS
from pipelines.observe.metrics_state import STATE_PARTS, StateCollector, read_state

log = logging.getLogger("lakecdc.metrics")

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
DEFAULT_HOST = "127.0.0.1"      # local only; [HOST:]PORT opens it wider on purpose


@dataclass(frozen=True)
class Stage:
    """What one command's exporter serves: the event metrics of ``layers`` and the state
    ``parts`` (``read_state``)."""

    layers: tuple[str, ...]
    parts: tuple[str, ...]


# ``lakecdc run`` serves everything. A single stage serves its own layer's events and the
# state of what it writes, so when the stages run as separate processes every state series
# comes from exactly one of them (the slot's from the shipper, which keeps it moving).
STAGES = {
    "run": Stage(LAYERS, STATE_PARTS),
    "ship": Stage(("bronze",), ("source", "bronze")),
    "stream": Stage(("silver", "gold"), ("silver", "quarantine", "gold")),
    "push": Stage(("dashboard",), ("dashboard",)),
}


class PipelineMetrics:
    """The event metrics of one process, on their own registry (``self.registry``).

    Hook methods match the stages' results: ``on_ship_batch(result, progress)`` is the
    ``Shipper``'s downstream (its batches, and the heartbeats and reconnects before
    them); ``on_pass(PassResult)`` (a stream batch: silver and gold);
    ``on_push(PushResult)`` (the dashboard feeder's, ``gold.feeder``,
    ``on_result``); ``stream_listener()`` returns a Spark ``StreamingQueryListener`` feeding
    ``on_stream_progress``. None of them raises.

    ``layers``: the layers whose series exist from the start (at 0) - one stage's, or all;
    the shipper's heartbeat and reconnect counters exist with ``bronze``, the pushed
    version with ``dashboard``.
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 layers: tuple[str, ...] = LAYERS) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.port: int | None = None         # where it is served, once it is
        r = self.registry
        self.rows = Counter(
            "lakecdc_rows_total",
            "Rows processed by the layer: bronze = changes (and backfill rows) appended, "
            "silver = bronze rows parsed into silver/changes, gold = silver rows consumed, "
            "dashboard = service_stats rows upserted or deleted.", ["layer"], registry=r)
        self.transactions = Counter(
            "lakecdc_transactions_total",
            "Source transactions shipped (bronze) or applied to gold (gold).", ["layer"],
            registry=r)
        self.batch_seconds = Histogram(
            "lakecdc_batch_duration_seconds",
            "Duration of one batch: a peek and its bronze commit, the silver and the gold "
            "part of a stream micro-batch, a push (empty ones included).", ["layer"],
            buckets=DURATION_BUCKETS, registry=r)
        self.last_batch = Gauge(
            "lakecdc_last_batch_timestamp_seconds",
            "Unix time the layer's last batch finished in this process.", ["layer"],
            registry=r)
        self.stream_rows = Counter(
            "lakecdc_stream_input_rows_total",
            "Input rows of a Spark streaming query (numInputRows).", ["query"], registry=r)
        self.stream_seconds = Histogram(
            "lakecdc_stream_batch_duration_seconds",
            "Duration of a Spark streaming micro-batch (batchDuration).", ["query"],
            buckets=DURATION_BUCKETS, registry=r)
        self.stream_rate = Gauge(
            "lakecdc_stream_processed_rows_per_second",
            "Spark's processedRowsPerSecond of the query's last micro-batch.", ["query"],
            registry=r)
        self.heartbeats = self.reconnects = self.skipped_messages = self.pushed_version = None
        if "bronze" in layers:
            self.skipped_messages = Counter(
                "lakecdc_ship_skipped_messages_total",
                "Logical messages under lakecdc's prefixes the shipper skipped as not its "
                "own: malformed, or backfill marks of runs never staged. Any rise means "
                "someone else emits under those prefixes (docs/security.md).", registry=r)
            self.heartbeats = Counter(
                "lakecdc_ship_heartbeats_total",
                "Heartbeat transactions the shipper committed on the source so its slot can "
                "move past WAL written elsewhere (bronze/heartbeat.py).", registry=r)
            self.reconnects = Counter(
                "lakecdc_ship_reconnects_total",
                "Times the shipper lost its source session and reconnected, by why it was "
                "lost.", ["reason"], registry=r)
            for reason in RECONNECT_REASONS:
                self.reconnects.labels(reason)
        if "dashboard" in layers:
            self.pushed_version = Gauge(
                "lakecdc_push_gold_version",
                "Gold version the dashboard holds after this process's last push.",
                registry=r)
        for layer in layers:        # every series exists from the start: 0, not absent
            self.rows.labels(layer)
            self.batch_seconds.labels(layer)
            if layer in ("bronze", "gold"):
                self.transactions.labels(layer)

    def _batch(self, layer: str, rows: int, seconds: float, transactions: int | None = None):
        self.rows.labels(layer).inc(max(rows, 0))
        if transactions is not None:
            self.transactions.labels(layer).inc(max(transactions, 0))
        self.batch_seconds.labels(layer).observe(max(seconds, 0.0))
        self.last_batch.labels(layer).set(time.time())

    def on_ship_batch(self, result, progress=None) -> None:
        """``bronze.shipped.Downstream.shipped``: one peek and its commit, and the heartbeats
        sent and reconnects made since the previous batch."""
        def record():
            self._batch("bronze", result.changes + result.read_rows, result.seconds,
                        result.transactions)
            if self.heartbeats is not None and result.heartbeats:
                self.heartbeats.inc(result.heartbeats)
            if self.skipped_messages is not None and result.skipped_messages:
                self.skipped_messages.inc(result.skipped_messages)
            if self.reconnects is not None:
                for reason in result.reconnects:
                    self.reconnects.labels(reason).inc()
        _safely(record)

    def on_pass(self, result) -> None:
        """A ``pipelines.run.stream.PassResult``: one stream batch through silver and gold, and
        the stream query's input rows (lakecdc reads them, not Spark: ``on_stream_progress``)."""
        def record():
            self.stream_rows.labels(STREAM_QUERY).inc(result.input_rows)
            self.stream_rate.labels(STREAM_QUERY).set(
                result.input_rows / result.seconds if result.seconds > 0 else 0.0)
            self._batch("silver", result.silver.rows, result.silver_seconds)
            gold = result.gold
            self._batch("gold", gold.silver_rows, gold.seconds, gold.applied_transactions)
        _safely(record)

    def on_push(self, result) -> None:
        """A ``gold.push.PushResult`` (a push that found nothing new counts 0 rows)."""
        def record():
            self._batch("dashboard", result.upserted + result.deleted, result.seconds)
            if self.pushed_version is not None:
                # Not pushed: the dashboard already held this version or a newer one.
                held = result.gold_version if result.pushed else max(
                    result.gold_version, result.previous_version
                    if result.previous_version is not None else -1)
                self.pushed_version.set(held)
        _safely(record)

    def on_stream_progress(self, progress) -> None:
        """A ``StreamingQueryProgress``, per query."""
        def record():
            name = progress.name or str(progress.id)
            seconds = (progress.batchDuration or 0) / 1000.0
            self.stream_seconds.labels(name).observe(seconds)
            if name != STREAM_QUERY:        # its rows are counted by ``on_pass``
                self.stream_rows.labels(name).inc(int(progress.numInputRows or 0))
                self.stream_rate.labels(name).set(
                    float(progress.processedRowsPerSecond or 0.0))
        _safely(record)

    def stream_listener(self):
        """A ``StreamingQueryListener`` recording every query's progress (needs pyspark)."""
        from pyspark.sql.streaming import StreamingQueryListener

        metrics = self

        class _Progress(StreamingQueryListener):
            def onQueryStarted(self, event) -> None:
                return None

            def onQueryProgress(self, event) -> None:
                metrics.on_stream_progress(event.progress)

            def onQueryIdle(self, event) -> None:
                return None

            def onQueryTerminated(self, event) -> None:
                return None

        return _Progress()


def _safely(record: Callable[[], None]) -> None:
    try:
        record()
    except Exception as exc:       # metrics must never stop a stage
        log.debug("recording a metric failed: %s", exc)


# --- registries and the HTTP exporter --------------------------------------------------------


def add_state(registry: CollectorRegistry, config: Config, max_age_s: float = 5.0,
              parts: tuple[str, ...] = STATE_PARTS,
              engine: Callable[[], Engine] | None = None) -> StateCollector:
    """``engine``: makes the engine the state is read by, at the first read and once
    (``read_state``; None: the configuration's, ``core.engine.choose.engine_for``)."""
    made: list[Engine] = []
    lock = threading.Lock()

    def once() -> Engine:
        with lock:
            if not made:
                made.append(engine() if engine is not None else engine_for(config))
            return made[0]
    collector = StateCollector(lambda: read_state(config, parts, once), max_age_s)
    registry.register(collector)
    return collector


def add_process(registry: CollectorRegistry) -> None:
    """``process_*`` (memory, CPU, open files), ``python_info`` and ``python_gc_*``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


def parse_listen(value: str | int) -> tuple[str, int]:
    """``"9187"`` or ``"127.0.0.1:9187"`` (``"[::1]:9187"``) → (host, port)."""
    text = str(value).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = DEFAULT_HOST, text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise UserError(f"metrics port {text!r} is not a port number; use e.g. 9187 or "
                        "127.0.0.1:9187.")
    return host, number


@contextmanager
def serve(registry: CollectorRegistry, listen: str | int) -> Iterator[int]:
    """Serve ``registry`` on ``http://HOST:PORT/metrics`` while the block runs; yields the
    bound port (port 0 picks a free one)."""
    host, port = parse_listen(listen)
    try:
        server, thread = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise UserError(f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); "
                        "choose another port (--metrics-port, LAKECDC_METRICS_PORT).") from None
    bound = server.server_port
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, bound)
    try:
        yield bound
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _info(registry: CollectorRegistry, config: Config) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("lakecdc")
    except PackageNotFoundError:
        release = "unknown"
    Gauge("lakecdc_info", "lakecdc release and the slot it serves.", ["version", "slot"],
          registry=registry).labels(release, config.slot).set(1)


@contextmanager
def pipeline_exporter(config: Config, listen: str | int | None, max_age_s: float = 5.0,
                      stage: str = "run", engine: Callable[[], Engine] | None = None
                      ) -> Iterator[PipelineMetrics | None]:
    """For ``lakecdc run|ship|silver|gold|push --metrics-port``: the stage's event metrics,
    its state parts (``STAGES``) and the process metrics, served while the block runs
    (``metrics.port``: the bound port). Yields None (nothing served) when ``listen`` is
    None. ``engine``: makes the stage's engine, which the state is read by (``add_state``)."""
    if listen is None:
        yield None
        return
    serves = STAGES[stage]
    metrics = PipelineMetrics(layers=serves.layers)
    add_state(metrics.registry, config, max_age_s, serves.parts, engine)
    add_process(metrics.registry)
    _info(metrics.registry, config)
    with serve(metrics.registry, listen) as metrics.port:
        yield metrics


def serve_state(config: Config, listen: str | int, stop: threading.Event,
                engine: Callable[[], Engine] | None = None) -> None:
    """``lakecdc metrics``: state + process metrics of a pipeline running anywhere, until
    ``stop`` is set (``engine``: as for ``pipeline_exporter``)."""
    registry = CollectorRegistry()
    add_state(registry, config, engine=engine)
    add_process(registry)
    _info(registry, config)
    with serve(registry, listen):
        stop.wait()
