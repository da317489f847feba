"""The freshness runs' client side, in a process of its own: the traffic, the neighbours'
traffic, the probes and their watchers (the dashboard's; the ``services`` mirror's).

Why a process: in the pipeline's own process these four threads share one interpreter lock
with the shipper, the push and the stream's ``foreachBatch`` (the driver's part of every
batch), so the benchmark slowed down what it measured, and the probe's clocks (its commit
returning, a poll seeing the row) waited on that lock too. A user's traffic comes from other
processes; so does the benchmark's.

``drive(...)`` runs them for ``seconds`` and returns what they did (``Drive``);
``DriveProcess`` does it in a spawned child (no fork of a process holding a JVM).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from bench import workload
from pipelines.demo.traffic import FreshnessProbe, Probe


@dataclass(frozen=True)
class Drive:
    """What one client run did (plain values: it crosses a process boundary)."""

    written: dict                       # ``workload.Written.as_dict()``
    traffic_elapsed_s: float
    probes_committed: int
    latencies: list                     # (commit time, seconds until seen) per probe seen
    started_at: float                   # time.time() when the writers started
    neighbour_changes: int
    neighbour_elapsed_s: float
    errors: list                        # repr of what failed in a thread, if anything
    # (commit time, seconds until seen) per ``services`` row the mirror probe saw, if probed
    mirror_latencies: list = field(default_factory=list)
    mirror_probes_committed: int = 0
    # (commit time, seconds until seen) per dashboard probe seen in gold read by path, if
    # watched there too
    gold_latencies: list = field(default_factory=list)


@dataclass(kw_only=True)
class MirrorProbe(Probe):
    """The mirrors' probe: a new ``services`` row (ids ``first_id``, ``first_id - 1``, ...:
    negative, which the neighbours' traffic never updates or deletes), looked for in the
    ``services`` mirror with delta-rs."""

    mirror_uri: str
    first_id: int

    def commit(self, conn, n: int) -> int:
        row_id = self.first_id - n
        conn.execute("INSERT INTO services (id, name, active) VALUES (%s, %s, true)",
                     [row_id, f"probe {row_id}"])
        return row_id

    @contextmanager
    def looking(self):
        mirror = CurrentMirror(self.mirror_uri)

        def look(pending: list) -> list:
            return mirror.rows(["id"], pc.field("id").isin(pending)).column("id").to_pylist()
        yield look


@dataclass(kw_only=True)
class GoldWatch(FreshnessProbe):
    """The dashboard's probes (``committed``: that probe's own, which commits them) looked
    for in ``service_stats`` itself, read by path with delta-rs as a SQL reader of gold
    would, every ``poll_s``: what a reader of gold sees, folds included."""

    gold_uri: str

    @contextmanager
    def looking(self):
        from deltalake import DeltaTable

        handle: list = []

        def look(pending: list) -> list:
            if not handle:
                handle.append(DeltaTable(self.gold_uri))
            else:
                handle[0].update_incremental()
            # Its one column read whole: only a small gold is watched (``Bench.continuous``).
            services = handle[0].to_pyarrow_dataset().to_table(columns=["service_id"])
            held = set(services.column("service_id").cast(pa.string()).to_pylist())
            return [service for service in pending if service in held]
        yield look


class CurrentMirror:
    """A mirror's current rows, its tail laid over its table
    (``silver.mirrors.tail.mirror_of``), through handles brought up to date by the
    commits since (a reader's cheapest look: a probe must not take the cores it measures),
    opened once a table exists and again if its log was cleaned past the handle."""

    def __init__(self, uri: str) -> None:
        from silver.mirrors.tail import tail_path

        self.uri, self.tail_uri = uri, tail_path(uri)
        self._handles: dict = {}

    def rows(self, columns: list[str], where, table: bool = True):
        """The current rows of the keys ``where`` (an expression over the key) selects;
        not ``table``: only those the tail holds (its rows netted, each column as the tail
        last carried it), a look that costs what the tail does: a filtered read of a
        10M-row table took 0.08-0.17 s a look on an idle machine."""
        from silver.mirrors.tail import mirror_of

        tail = self._kept(self.tail_uri)           # first: a drain empties it after the table
        tail_rows = None if tail is None else tail.to_pyarrow_dataset().to_table(filter=where)
        return mirror_of(self._kept(self.uri), tail_rows, columns, where if table else False)

    def _kept(self, uri: str, tries: int = 3):
        from deltalake import DeltaTable

        for attempt in range(tries):
            try:
                if uri in self._handles:
                    self._handles[uri].update_incremental()
                elif not DeltaTable.is_deltatable(uri):
                    return None
                else:
                    self._handles[uri] = DeltaTable(uri)
                return self._handles[uri]
            except Exception:
                # A log listed while its writer commits may miss a commit file being
                # renamed into place ("expected contiguous commit files"): look again.
                self._handles.pop(uri, None)
                if attempt == tries - 1:
                    raise
                time.sleep(0.05)


def drive(source_dsn: str, dashboard_dsn: str, rate: float, neighbour_rate: float,
          neighbour_first_id: int, seconds: float, tag: str, services: int = 8,
          mirror_uri: str | None = None, gold_uri: str | None = None) -> Drive:
    """Traffic at ``rate`` changes/s (inserts over ``services`` services), the neighbour
    tables at ``neighbour_rate`` rows/s each (none at 0) and a probe every 0.5 s for
    ``seconds``; then waits for the watcher (every probe seen, or 120 s). ``mirror_uri``:
    the ``services`` mirror, probed too (``MirrorProbe``); ``gold_uri``: gold, where the
    dashboard's probes are looked for too (``GoldWatch``)."""
    stop = threading.Event()
    traffic = workload.SteadyTraffic(source_dsn, rate, tag=f"{tag}-", services=services)
    neighbours = workload.NeighbourTraffic(source_dsn, neighbour_rate,
                                           first_id=neighbour_first_id)
    probe = FreshnessProbe(dsn=source_dsn, dashboard_dsn=dashboard_dsn, tag=tag)
    mirror_probe = MirrorProbe(dsn=source_dsn, mirror_uri=mirror_uri,
                               first_id=-neighbour_first_id, poll_s=0.1) \
        if mirror_uri else None
    gold_watch = GoldWatch(dsn=source_dsn, dashboard_dsn=dashboard_dsn, tag=tag,
                           gold_uri=gold_uri, committed=probe.committed, poll_s=0.2) \
        if gold_uri else None
    errors: list[str] = []

    def guarded(name: str, target) -> threading.Thread:
        def body():
            try:
                target()
            except BaseException as exc:         # reported with the measurement
                errors.append(f"{name}: {exc!r}")
                stop.set()
        return threading.Thread(target=body, name=f"drive-{name}", daemon=True)

    writers = [guarded("traffic", lambda: traffic.run(stop)),
               *([guarded("neighbours", lambda: neighbours.run(stop))] if neighbour_rate else []),
               guarded("probe", lambda: probe.run(stop))]
    watchers = [guarded("watch", lambda: probe.watch(stop))]
    if mirror_probe is not None:
        writers.append(guarded("mirror-probe", lambda: mirror_probe.run(stop)))
        watchers.append(guarded("mirror-watch", lambda: mirror_probe.watch(stop)))
    if gold_watch is not None:
        watchers.append(guarded("gold-watch", lambda: gold_watch.watch(stop)))
    started_at = time.time()
    for thread in (*writers, *watchers):
        thread.start()
    stop.wait(seconds)
    stop.set()
    for thread in (*writers, *watchers):
        thread.join()
    return Drive(traffic.written.as_dict(), traffic.elapsed_s, len(probe.committed),
                 probe.latencies(), started_at, neighbours.changes, neighbours.elapsed_s,
                 errors, mirror_probe.latencies() if mirror_probe else [],
                 len(mirror_probe.committed) if mirror_probe else 0,
                 gold_watch.latencies() if gold_watch else [])


def _child(conn, kwargs: dict) -> None:
    try:
        conn.send(drive(**kwargs))
    except BaseException as exc:
        conn.send(RuntimeError(f"the benchmark's client process failed: {exc!r}"))
    finally:
        conn.close()


class DriveProcess:
    """``drive(**kwargs)`` in a spawned child; ``result()`` waits for it."""

    def __init__(self, **kwargs) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._recv, send = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_child, args=(send, kwargs), name="bench-drive",
                                    daemon=True)
        self._process.start()
        send.close()

    def result(self, timeout: float) -> Drive:
        if not self._recv.poll(timeout):
            self._process.kill()
            raise RuntimeError(f"the benchmark's client process gave no result in {timeout} s")
        out = self._recv.recv()
        self._process.join(30)
        if isinstance(out, BaseException):
            raise out
        return out
