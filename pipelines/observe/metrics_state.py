"""The state half of lakecdc's metrics (``pipelines.observe.metrics``): where each layer is, read
from the source and the tables on scrape, exactly as ``lakecdc status`` reads them."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily

from core.config import Config
from core.engine.api import Engine
from core.engine.choose import engine_for
from core.errors import first_line
from gold.push import LAYERS

log = logging.getLogger("lakecdc.metrics")

STATE_PARTS = ("source", *LAYERS[:3], "quarantine", "dashboard", "tables")
# pg_replication_slots.wal_status values (PostgreSQL 13+); one series each, 1 for the current.
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


@dataclass
class StateSnapshot:
    """One read of every state part; ``up[part]`` is False when that part failed."""

    taken_at: float
    slot_name: str = ""
    slot: object | None = None                      # pipelines.observe.status.SlotStatus
    layers: dict = field(default_factory=dict)      # layer -> pipelines.observe.status.LayerStatus
    quarantine_rows: int | None = None
    tables: list = field(default_factory=list)      # pipelines.observe.status.table_sizes
    up: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)     # part -> why it failed
    seconds: float = 0.0


def read_state(config: Config, parts: tuple[str, ...] = STATE_PARTS,
               engine: Callable[[], Engine] | None = None) -> StateSnapshot:
    """Read ``parts`` (every part unless given) as ``lakecdc status`` does; a failing part
    is marked down with its error (redacted), not raised. ``engine``: gives the engine the
    lakehouse is read by (None: the configuration's, ``core.engine.choose.engine_for``),
    asked for by the parts that read it, so a source-only read starts none."""
    from pipelines.observe import status

    started = time.monotonic()
    snap = StateSnapshot(taken_at=time.time(), slot_name=config.slot)

    made: list[Engine] = []

    def session() -> Engine:
        if not made:
            made.append(engine() if engine is not None else engine_for(config))
        return made[0]

    reads: list[tuple[str, Callable[[], None]]] = [
        ("source", lambda: setattr(snap, "slot", status.slot_status(config))),
        *[(layer, lambda layer=layer: snap.layers.__setitem__(
            layer, status.layer_status(config, layer, session())))
          for layer in LAYERS],
        ("quarantine", lambda: setattr(snap, "quarantine_rows", status.quarantine_rows(
            status.quarantine_path(config), session()))),
        ("tables", lambda: setattr(snap, "tables", status.table_sizes(
            config, session()))),
    ]
    for part, read in reads:
        if part not in parts:
            continue
        try:
            read()
            snap.up[part] = True
        except Exception as exc:
            snap.up[part] = False
            snap.errors[part] = first_line(exc)
    snap.seconds = time.monotonic() - started
    return snap


class StateCollector:
    """A Prometheus collector serving ``read_state`` (see the module docstring).

    A scrape reads the state again when the last read is older than ``max_age_s`` (several
    scrapers or a fast scrape interval do not multiply the queries). It waits at most
    ``wait_s`` for the read: a source that does not answer makes the scrape serve the
    previous read (its time is ``lakecdc_state_timestamp_seconds``) instead of timing out.
    """

    def __init__(self, read: Callable[[], StateSnapshot], max_age_s: float = 5.0,
                 wait_s: float = 8.0) -> None:
        self._read = read
        self.max_age_s = max_age_s
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._snap: StateSnapshot | None = None
        self._read_at = float("-inf")
        self._worker: threading.Thread | None = None

    def snapshot(self) -> StateSnapshot | None:
        with self._lock:
            stale = time.monotonic() - self._read_at >= self.max_age_s
            if stale and (self._worker is None or not self._worker.is_alive()):
                self._worker = threading.Thread(target=self._refresh, daemon=True,
                                                name="lakecdc-metrics-state")
                self._worker.start()
            worker = self._worker
        if stale and worker is not None:
            worker.join(self.wait_s)
        return self._snap

    def _refresh(self) -> None:
        try:
            snap = self._read()
        except Exception as exc:
            log.warning("metrics: reading the pipeline state failed: %s",
                        first_line(exc))
            return
        with self._lock:
            previous, self._snap, self._read_at = self._snap, snap, time.monotonic()
        # A part going down is a warning once, not at every scrape.
        for part, error in snap.errors.items():
            was_up = previous is None or previous.up.get(part, True)
            log.log(logging.WARNING if was_up else logging.DEBUG,
                    "metrics: cannot read %s: %s", part, error)
        if previous is not None:
            for part in previous.errors.keys() - snap.errors.keys():
                log.info("metrics: %s can be read again", part)

    def describe(self):
        return []          # no up-front collect() at registration: it would query Postgres

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.snapshot()
        if snap is None:
            return
        yield from state_families(snap, dt.datetime.now(dt.timezone.utc))


def state_families(snap: StateSnapshot, now: dt.datetime) -> Iterator[GaugeMetricFamily]:
    """The metric families of ``snap``; freshness is measured at ``now``."""
    yield from _read_families(snap)
    if snap.up.get("source"):
        yield from _slot_families(snap)
    yield from _layer_families(snap, now)
    if snap.up.get("tables"):
        yield from _table_families(snap)
    if snap.up.get("quarantine") and snap.quarantine_rows is not None:
        yield GaugeMetricFamily("lakecdc_quarantine_rows",
                                "Rows in silver/quarantine (bronze rows silver could not "
                                "parse), from the Delta log's per-file row counts.",
                                value=float(snap.quarantine_rows))


def _family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _read_families(snap: StateSnapshot) -> Iterator[GaugeMetricFamily]:
    """The state read itself: which parts could be read, when, and how long it took."""
    up = _family("lakecdc_state_up", "1 when the part could be read at the last state read.",
                 ["part"])
    for part in STATE_PARTS:
        if part in snap.up:               # the parts this exporter reads
            up.add_metric([part], 1.0 if snap.up[part] else 0.0)
    yield up
    yield GaugeMetricFamily("lakecdc_state_timestamp_seconds",
                            "Unix time of the last state read.", value=snap.taken_at)
    yield GaugeMetricFamily("lakecdc_state_read_duration_seconds",
                            "How long the last state read took.", value=snap.seconds)


def _slot_families(snap: StateSnapshot) -> Iterator[GaugeMetricFamily]:
    """The replication slot: whether it exists, its wal_status, its lag and the WAL."""
    slot = snap.slot
    exists = _family("lakecdc_slot_exists", "1 if the replication slot exists.", ["slot"])
    if slot is None:
        exists.add_metric([snap.slot_name], 0.0)
        yield exists
        return
    exists.add_metric([slot.name], 1.0)
    yield exists
    status = _family("lakecdc_slot_wal_status",
                     "1 for the slot's current wal_status (reserved, extended, "
                     "unreserved, lost), 0 for the others.", ["slot", "wal_status"])
    for value in sorted({*WAL_STATUSES, slot.wal_status or "unknown"}):
        status.add_metric([slot.name, value], 1.0 if value == slot.wal_status else 0.0)
    yield status
    for name, doc, value in (
            ("lakecdc_slot_lag_bytes",
             "WAL bytes between the source's current position and the slot's "
             "confirmed_flush_lsn (what the shipper has not acknowledged).",
             slot.lag_bytes),
            ("lakecdc_slot_safe_wal_size_bytes",
             "WAL bytes that can still be written before the slot is invalidated "
             "(absent when max_slot_wal_keep_size is unlimited).", slot.safe_wal_size),
            ("lakecdc_source_max_slot_wal_keep_size_bytes",
             "The source's max_slot_wal_keep_size (absent when unlimited).",
             slot.max_slot_wal_keep_size),
            ("lakecdc_slot_confirmed_flush_lsn_bytes",
             "The slot's confirmed_flush_lsn as a byte position.",
             slot.confirmed_flush_lsn),
            ("lakecdc_source_wal_lsn_bytes",
             "The source's current WAL position (pg_current_wal_lsn) as a byte "
             "position; its rate is the WAL generation rate.", slot.current_wal_lsn)):
        if value is not None:
            g = _family(name, doc, ["slot"])
            g.add_metric([slot.name], float(value))
            yield g


def _layer_families(snap: StateSnapshot, now: dt.datetime) -> Iterator[GaugeMetricFamily]:
    """Each layer's version, newest source commit and freshness."""
    version = _family("lakecdc_layer_version",
                      "Delta table version of the layer (dashboard: the gold version pushed).",
                      ["layer"])
    lsn = _family("lakecdc_layer_commit_lsn_bytes",
                  "Newest source commit LSN the layer holds (gold, dashboard: exact up to it), "
                  "as a byte position.", ["layer"])
    ts = _family("lakecdc_layer_source_commit_timestamp_seconds",
                 "Source commit time (Unix) of the newest change the layer holds.", ["layer"])
    fresh = _family("lakecdc_layer_freshness_seconds",
                    "Now minus the source commit time of the newest change the layer holds "
                    "(as in lakecdc status; grows while the source is idle).", ["layer"])
    for layer in LAYERS:
        status = snap.layers.get(layer)
        if status is None:
            continue
        if status.version is not None:
            version.add_metric([layer], float(status.version))
        if status.commit_lsn is not None:
            lsn.add_metric([layer], float(status.commit_lsn))
        if status.commit_ts is not None:
            commit_ts = status.commit_ts
            if commit_ts.tzinfo is None:
                commit_ts = commit_ts.replace(tzinfo=dt.timezone.utc)
            ts.add_metric([layer], commit_ts.timestamp())
            fresh.add_metric([layer], max((now - commit_ts).total_seconds(), 0.0))
    yield from (version, lsn, ts, fresh)


def _table_families(snap: StateSnapshot) -> Iterator[GaugeMetricFamily]:
    """Each lakehouse table's size, log and last maintenance."""
    for key, name, doc in (
            ("live_files", "lakecdc_table_live_files",
             "Data files in the table's current version (compaction keeps it small)."),
            ("live_bytes", "lakecdc_table_live_bytes",
             "Bytes of the data files in the table's current version."),
            ("log_entries", "lakecdc_table_log_entries",
             "Files in the table's _delta_log (commits, checkpoints)."),
            ("last_maintained", "lakecdc_table_last_maintenance_timestamp_seconds",
             "Unix time of the table's newest maintenance (absent: never).")):
        g = _family(name, doc, ["table"])
        for row in snap.tables:
            if row.get(key) is not None:
                g.add_metric([row["table"]], float(row[key]))
        yield g
