"""A big table captured and kept: ``lakecdc tables add public.big`` on a
table of ``rows`` rows while ``lakecdc run`` (the real CLI, ``bench.catch_up.RunProcess``)
runs under traffic on it and on the counted tables.

``public.big`` has Notify-like columns; one row in ``TOAST_EVERY`` has a body stored out of
line (``STORAGE EXTERNAL``: TOASTed, not compressed). Its traffic only updates rows, so the
table keeps ``rows`` rows throughout. Measured in one run:

- Postgres's own ``COPY (SELECT * FROM big) TO STDOUT`` of the table (psycopg reads it and
  drops the bytes), under the same traffic, just before the add;
- from ``tables add`` to the mirror holding every row (its row count equals the table's),
  and ``tables add``'s own share (its process, to its exit);
- that process's peak resident memory (``bench.decode.PeakRss``);
- the oldest transaction and the oldest snapshot on the source while it runs
  (``pg_stat_activity``: ``now() - xact_start`` and ``age(backend_xmin)``), polled, without
  the sampler's own;

then, the traffic going on, the mirror as it is kept (``kept``, ``KEPT_S`` seconds):

- its freshness: a probe (``BigProbe``) sets one row's ``reference`` every 0.5 s and looks
  for it in the mirror's current rows (its tail laid over its table, ``bench.drive.
  CurrentMirror``) every 0.1 s: in the tail at every look, in the table at every tenth
  (a filtered read of the 10M-row table took 0.08-0.17 s of CPU: every look would take
  a core from what it measures);
- what its batches cost: the mirrors' query's batches in that time and their mean duration
  (``lakecdc_stream_batch_duration_seconds``, scraped from ``run``'s metrics), which
  include the tail's drains; and each drain ``run`` logged;

then the traffic stops, ``run`` catches up, and the mirror is compared with the table: its
row count, and every column of ``SAMPLE_RANGES`` key ranges.
"""

from __future__ import annotations

import multiprocessing
import random
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow.compute as pc
from deltalake import DeltaTable

from bench import numbers, workload
from bench.catch_up import ROOT, RunProcess, lakecdc_env
from bench.decode import PeakRss
from bench.drive import CurrentMirror
from core.config import Config
from core.layout import STREAM_CHECKPOINT, mirror_path
from pipelines.demo.traffic import Probe

TABLE = "public.big"
TOAST_EVERY = 100
SAMPLE_RANGES = 20
SAMPLE_ROWS = 500
POLL_S = 0.2
KEPT_S = 300.0              # the mirror kept under traffic: its freshness and batches' cost
TABLE_EVERY = 10            # the probe reads the big mirror's table at one look in this many
MIRRORS_QUERY = "lakecdc_mirrors"

BIG_SQL = """
CREATE TABLE big (
    id bigint PRIMARY KEY,
    service_id uuid NOT NULL,
    template_id uuid NOT NULL,
    notification_type text NOT NULL,
    status text NOT NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz,
    reference text,
    billable_units integer,
    body text
);
ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL;
"""

FILL_SQL = """
INSERT INTO big
SELECT g, md5(mod(g, 8)::text)::uuid, md5(mod(g, 40)::text)::uuid,
       (ARRAY['email', 'sms', 'letter'])[1 + mod(g, 3)],
       (ARRAY['created', 'sending', 'delivered', 'failed'])[1 + mod(g, 4)],
       timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', NULL, 'ref-' || g,
       1 + mod(g, 5)::integer,
       CASE WHEN mod(g, %(toast)s) = 0 THEN repeat(md5(g::text), 80) ELSE 'body ' || g END
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""

UPDATE_SQL = ("UPDATE big SET status = %(status)s, updated_at = now(), billable_units = "
              "billable_units + 1 WHERE id = ANY(%(ids)s)")


def create_big(dsn: str, rows: int, chunk: int = 1_000_000) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BIG_SQL)
        for first in range(1, rows + 1, chunk):
            conn.execute(FILL_SQL, {"toast": TOAST_EVERY, "first": first,
                                    "last": min(rows, first + chunk - 1)})
        conn.execute("VACUUM ANALYZE big")


@dataclass
class BigTraffic:
    """``rate`` updated rows of ``big`` per second, in ticks of ``tick_s`` (one transaction
    a tick), paced like ``workload.SteadyTraffic``."""

    dsn: str
    rows: int
    rate: float
    tick_s: float = 0.1
    changes: int = 0

    def run(self, stop: threading.Event) -> None:
        rng = random.Random(38)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            started, n = time.monotonic(), 0
            while not stop.is_set():
                budget = int((time.monotonic() - started + self.tick_s) * self.rate
                             - self.changes)
                if budget > 0:
                    ids = [rng.randint(1, self.rows) for _ in range(budget)]
                    self.changes += conn.execute(UPDATE_SQL, {
                        "status": rng.choice(["sending", "delivered", "failed"]),
                        "ids": ids}).rowcount
                n += 1
                stop.wait(max(0.0, started + n * self.tick_s - time.monotonic()))


class BigProbe(Probe):
    """The big mirror's probe: one row of ``big`` (a random key, never the same twice) gets
    ``reference = 'probe <n>'``, looked for in the mirror's current rows."""

    def __init__(self, dsn: str, mirror_uri: str, rows: int) -> None:
        super().__init__(dsn=dsn, poll_s=0.1)
        self.mirror_uri = mirror_uri
        self.ids = random.Random(3939).sample(range(1, rows + 1), min(rows, 100_000))

    def commit(self, conn, n: int) -> tuple[int, str]:
        key = (self.ids[n], f"probe {n}")
        conn.execute("UPDATE big SET reference = %s WHERE id = %s", [key[1], key[0]])
        return key

    @contextmanager
    def looking(self):
        mirror = CurrentMirror(self.mirror_uri)

        looks = [0]

        def look(pending: list) -> list:
            # The tail at every look; the table too at every ``TABLE_EVERY``-th (a probe
            # there only after a batch MERGEd into it, not the tail; ``CurrentMirror``).
            looks[0] += 1
            got = mirror.rows(["reference"], pc.field("id").isin([k for k, _ in pending]),
                              table=looks[0] % TABLE_EVERY == 0)
            return [k for k in pending if k in set(zip(got["id"].to_pylist(),
                                                       got["reference"].to_pylist()))]
        yield look


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mirrors_batches(port: int) -> tuple[int, float]:
    """(batches, seconds in all) of the mirrors' query so far, from ``run``'s metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    found = dict(re.findall(rb'lakecdc_stream_batch_duration_seconds_(count|sum)\{query="'
                            + MIRRORS_QUERY.encode() + rb'"\} (\S+)', text))
    return int(float(found.get(b"count", 0))), float(found.get(b"sum", 0.0))


def folds(log: Path) -> list[tuple[int, float]]:
    """(rows, seconds) of each drain of the big mirror's tail ``run`` logged."""
    return [(int(rows), float(s)) for rows, s in re.findall(
        r"public/big: (\d+) rows of its tail merged in ([\d.]+) s",
        log.read_text(errors="replace"))]


def kept(config: Config, run: RunProcess, port: int, seconds: float, rows: int) -> dict:
    """The big mirror kept under the traffic for ``seconds``: its freshness by ``BigProbe``
    and its mirrors' batches (see the module's text)."""

    before, folded = mirrors_batches(port), len(folds(run.log))
    probe = BigProbe(config.source_dsn, mirror_path(config.lakehouse, TABLE), rows)
    stop = threading.Event()
    threads = [threading.Thread(target=probe.run, args=(stop,), daemon=True),
               threading.Thread(target=probe.watch, args=(stop,), daemon=True)]
    for thread in threads:
        thread.start()
    stop.wait(seconds)
    after = mirrors_batches(port)
    stop.set()
    for thread in threads:
        thread.join()
    run.check()
    batches, spent = after[0] - before[0], after[1] - before[1]
    latencies = [s for _, s in probe.latencies()]
    return {"seconds": seconds, "probes": len(probe.committed), "seen": len(latencies),
            "mirror_latency_s": numbers.percentiles(latencies),
            "mirrors_batches": batches,
            "mirrors_batch_mean_s": round(spent / batches, 3) if batches else None,
            "mirrors_busy_share": round(spent / seconds, 3),
            "folds": [{"rows": r, "seconds": s} for r, s in folds(run.log)[folded:]]}


def _traffic(dsn: str, rows: int, counted_rate: float, big_rate: float,
             stop: multiprocessing.synchronize.Event, out) -> None:
    """The traffic, in a process of its own (as ``bench.drive``): until ``stop``."""
    done = threading.Event()
    counted = workload.SteadyTraffic(dsn, counted_rate, tag="big-")
    big = BigTraffic(dsn, rows, big_rate)
    threads = [threading.Thread(target=t.run, args=(done,), daemon=True) for t in (counted, big)]
    for thread in threads:
        thread.start()
    stop.wait()
    done.set()
    for thread in threads:
        thread.join()
    out.put({"counted_changes": counted.written.changes, "big_changes": big.changes})


class OldestTransaction:
    """Polls the source for its oldest open transaction and snapshot (not its own)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.xact_s = 0.0
        self.xmin_age = 0
        self.who = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                row = conn.execute(
                    "SELECT extract(epoch FROM now() - xact_start), age(backend_xmin), "
                    "application_name || ' ' || left(query, 60) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                    "AND xact_start IS NOT NULL ORDER BY xact_start LIMIT 1").fetchone()
                if row is None:
                    continue
                if row[0] is not None and float(row[0]) > self.xact_s:
                    self.xact_s, self.who = float(row[0]), row[2]
                self.xmin_age = max(self.xmin_age, int(row[1] or 0))

    def __enter__(self) -> "OldestTransaction":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def copy_seconds(dsn: str) -> tuple[float, int]:
    """Postgres's own COPY of the table to this client: (seconds, bytes)."""
    started = time.perf_counter()
    size = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy("COPY (SELECT * FROM big) TO STDOUT") as copy:
            for block in copy:
                size += len(block)
    return time.perf_counter() - started, size


def tables_add(config: Config, log: Path) -> tuple[float, float, int]:
    """``lakecdc tables add public.big`` as its own process: (seconds, peak RSS in MB, exit
    code)."""
    started = time.perf_counter()
    with open(log, "ab") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "pipelines", "tables", "add", TABLE],
                                env=lakecdc_env(config), cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT)
        peak = PeakRss(proc.pid)
        proc.wait()
    return time.perf_counter() - started, peak.mb(), proc.returncode


def lakecdc_verify(config: Config, log: Path, *args: str) -> tuple[float, int]:
    """``lakecdc verify ARGS`` as its own process: (seconds, exit code: 0 = exact)."""
    started = time.perf_counter()
    with open(log, "ab") as sink:
        code = subprocess.run([sys.executable, "-m", "pipelines", "verify", *args],
                              env=lakecdc_env(config), cwd=ROOT, stdout=sink,
                              stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - started, code


def mirror_rows(config: Config) -> int:
    """The mirror's current rows (its tail laid over its table); 0 before it exists."""
    from silver.mirrors.tail import read_mirror

    try:
        return read_mirror(mirror_path(config.lakehouse, TABLE), columns=[]).num_rows
    except Exception:       # not created yet
        return 0


def replayed(config: Config) -> bool:
    """The mirrors' query has applied what it held back while the table loaded (a MERGE
    recorded it: ``silver.mirrors.merge.due_replay``)."""
    from core.commits import parse_commit_metadata

    return any("replayed" in (parse_commit_metadata(c.get("userMetadata"), "mirror") or {})
               for c in DeltaTable(mirror_path(config.lakehouse, TABLE)).history(50))


def sample_matches(config: Config, rows: int) -> tuple[int, int]:
    """(rows compared, rows differing) over ``SAMPLE_RANGES`` random key ranges of
    ``SAMPLE_ROWS`` rows: every column, the mirror (delta-rs) against the source."""
    from bench.counts import utc

    rng = random.Random(3838)
    mirror = CurrentMirror(mirror_path(config.lakehouse, TABLE))
    compared = differing = 0
    with psycopg.connect(config.source_dsn) as conn:
        for _ in range(SAMPLE_RANGES):
            lo = rng.randint(1, max(1, rows - SAMPLE_ROWS))
            hi = lo + SAMPLE_ROWS - 1
            cur = conn.execute("SELECT * FROM big WHERE id BETWEEN %s AND %s", [lo, hi])
            names = [d.name for d in cur.description]
            source = {r[0]: tuple(utc(v) for v in r) for r in cur}
            got = mirror.rows(names, (pc.field("id") >= lo)
                              & (pc.field("id") <= hi)).to_pylist()
            theirs = {r["id"]: tuple(utc(r[n]) for n in names) for r in got}
            compared += len(source)
            differing += sum(1 for k in source.keys() | theirs.keys()
                             if source.get(k) != theirs.get(k))
    return compared, differing


def measure(config: Config, work: Path, rows: int, rate: float,
            kept_s: float = KEPT_S) -> dict:
    """The section on ``config``'s database (set up, ``big`` created and filled, not
    captured). ``rate``: changes per second in all, half of them updates of ``big``."""
    from bench.catch_up import until_exact
    from bench.counts import exactness, truth

    out: dict = {"rows": rows, "rate": rate, "load_before": numbers.load()}
    port = free_port()
    db = Path(config.lakehouse).name           # the database's: the logs' names
    run = RunProcess(config, work / f"{db}-run.log", {"LAKECDC_METRICS_PORT": str(port)})
    stop = multiprocessing.get_context("spawn").Event()
    results = multiprocessing.get_context("spawn").Queue()
    traffic = multiprocessing.get_context("spawn").Process(
        target=_traffic, args=(config.source_dsn, rows, rate / 2, rate / 2, stop, results))
    try:
        first = Path(config.table_path(STREAM_CHECKPOINT)) / "offsets" / "0"
        while not first.exists():
            run.check()
            time.sleep(POLL_S)
        traffic.start()
        copy_s, copy_bytes = copy_seconds(config.source_dsn)
        out["copy"] = {"seconds": round(copy_s, 2), "mb": round(copy_bytes / 2**20),
                       "rows_per_s": numbers.rate(rows, copy_s)}
        with OldestTransaction(config.source_dsn) as oldest:
            started = time.perf_counter()
            add_s, peak_mb, code = tables_add(config, work / f"{db}-tables-add.log")
            if code != 0:
                raise RuntimeError(f"tables add exited {code}: see {work}/{db}-tables-add.log")
            while mirror_rows(config) < rows:
                run.check()
                time.sleep(POLL_S)
            load_s = time.perf_counter() - started
            # The changes held back while it loaded, applied by the mirrors' query.
            while not replayed(config):
                run.check()
                time.sleep(POLL_S)
            replayed_s = time.perf_counter() - started
        out["load"] = {"seconds": round(load_s, 2), "rows_per_s": numbers.rate(rows, load_s),
                       "replayed_s": round(replayed_s, 2),
                       "of_copy_replayed": round(copy_s / replayed_s, 3),
                       "tables_add_s": round(add_s, 2),
                       "of_copy": round(copy_s / load_s, 3),
                       "tables_add_peak_rss_mb": round(peak_mb),
                       "oldest_transaction_s": round(oldest.xact_s, 2),
                       "oldest_transaction": oldest.who,
                       "oldest_snapshot_xids": oldest.xmin_age}
        out["kept"] = kept(config, run, port, kept_s, rows)
        stop.set()
        traffic.join(timeout=120)
        out["traffic"] = results.get(timeout=60)
        # Caught up: the dashboard equals the source, then the mirror converges on the table.
        until_exact(run, config, truth(config.source_dsn), timeout=600)
        deadline = time.monotonic() + 600
        while True:
            compared, differing = sample_matches(config, rows)
            if (differing == 0 and mirror_rows(config) == rows) or time.monotonic() > deadline:
                break
            run.check()
            time.sleep(2.0)
        out["mirror"] = {"rows": mirror_rows(config), "sample_rows": compared,
                         "sample_differing": differing}
        # ``lakecdc verify``: gold, the dashboard and every mirror against the source at one
        # point, while ``run`` runs, and the snapshot it holds meanwhile: the big one by its
        # every key and a sample of its rows (as verify does above 1M rows), then whole.
        for name, args in (("verify", ("--sample-above", str(rows // 2))),
                           ("verify_whole", ("--whole",))):
            with OldestTransaction(config.source_dsn) as oldest:
                verify_s, code = lakecdc_verify(config, work / f"{db}-verify.log", *args)
            out[name] = {"seconds": round(verify_s, 2), "exit": code,
                         "oldest_transaction_s": round(oldest.xact_s, 2)}
        out["lakecdc"] = exactness(config)
    finally:
        stop.set()
        if traffic.is_alive():
            traffic.join(timeout=60)
        run.stop()
    out["load_after"] = numbers.load()
    return out
