"""Postgres's own decode rate and the shipper's drain rate, on the same slot content.

- ``raw_decode``: ``SELECT count(*) FROM pg_logical_slot_peek_changes(...)`` with the
  shipper's wal2json options (``bronze.slot.plugin_options``) on a *witness* slot created
  next to the shipper's before the workload, so it saw the same WAL; it is never advanced,
  so it can be timed more than once. The rows never leave the server: this is the floor
  any client of the slot pays (decoding + wal2json's JSON), the limit the shipper is
  measured against.
- ``recvlogical``: Postgres's own streaming client, ``pg_recvlogical``, draining a second
  witness slot through the replication protocol to ``/dev/null`` with the same options, up
  to the WAL position at the end of the backlog: decode, transfer and the client's write,
  nothing stored. The client the shipper is measured against.
- ``replication_drain``: the replication protocol through psycopg (3.3 runs
  ``START_REPLICATION`` and leaves its ``COPY_BOTH`` stream to ``psycopg.pq``), read on a
  third witness up to the same position and discarded: what a shipper on the walsender
  would pay before it parsed or stored anything (the last lever; docs/bronze.md,
  "Against `pg_recvlogical`").
- ``ship_once``: ``lakecdc ship --once`` as a child process (the command an operator runs),
  timed from spawn to exit, with that child's own peak RSS (``PeakRss``: the high-water
  mark of its own memory, not ``wait4``'s figure, which counts this process's).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench import numbers
from bench.catch_up import lakecdc_env
from bronze.slot import plugin_options
from core.config import Config
from core.errors import redact
from core.lsn import Lsn
from infra.localpg import bin_dir

ROOT = Path(__file__).resolve().parents[1]


def create_witness(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [name])


def drop_slot(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s AND active_pid IS NULL", [name])


def raw_decode(dsn: str, slot: str, tables: tuple[str, ...]) -> tuple[int, float]:
    """(rows wal2json emitted, seconds) of one unbounded peek of ``slot`` counted in SQL."""
    options = sql.SQL(", ").join(sql.Literal(o) for o in plugin_options(tables))
    query = sql.SQL("SELECT count(*) FROM pg_logical_slot_peek_changes({}, NULL, NULL, {})"
                    ).format(sql.Literal(slot), options)
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        rows = conn.execute(query).fetchone()[0]
        return rows, time.perf_counter() - started


def current_lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def recvlogical(dsn: str, slot: str, tables: tuple[str, ...], endpos: str) -> float:
    """Seconds for ``pg_recvlogical`` to stream ``slot`` from its start to ``endpos`` into
    ``/dev/null`` (it moves ``slot``: one run per witness)."""
    options = plugin_options(tables)
    params = conninfo_to_dict(dsn)
    password = params.pop("password", None)       # in its environment, not its arguments
    args = [str(bin_dir() / "pg_recvlogical"), "--dbname", make_conninfo(**params),
            "--slot", slot, "--start", "--file", "/dev/null", "--no-loop", "--endpos", endpos]
    for name, value in zip(options[::2], options[1::2]):
        args += ["--option", f"{name}={value}"]
    env = {**os.environ, **({"PGPASSWORD": password} if password else {})}
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({done.returncode}): "
                           f"{redact(done.stderr)[-2000:]}")
    return seconds


@dataclass(frozen=True)
class Drain:
    messages: int               # wal2json rows received up to ``endpos``
    seconds: float
    client_cpu_s: float         # the reading thread's own CPU


# Replication protocol messages in ``COPY_BOTH``'s CopyData: XLogData (a 25-byte head, its
# WAL start first) and the primary's keepalive (its WAL end first).
_XLOG_DATA, _KEEPALIVE = ord("w"), ord("k")


def replication_drain(dsn: str, slot: str, tables: tuple[str, ...], endpos: str,
                      timeout_s: float = 600.0) -> Drain:
    """Stream ``slot`` through the replication protocol with psycopg, the shipper's wal2json
    options, discarding every row, up to a row at ``endpos`` (the last commit's end) or
    a keepalive there, as a SQL peek then would return them. Sends no feedback: ``slot``
    stays where it was, for the caller to drop."""
    options = plugin_options(tables)
    start = sql.SQL("START_REPLICATION SLOT {} LOGICAL 0/0 ({})").format(
        sql.Identifier(slot), sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(name), sql.Literal(value))
            for name, value in zip(options[::2], options[1::2])))
    end = int(Lsn.parse(endpos))
    messages = 0
    started, cpu = time.perf_counter(), time.thread_time()
    # Closed, not left through ``with``: its exit would send COMMIT into the stream.
    conn = psycopg.connect(dsn, replication="database", autocommit=True)
    try:
        conn.execute(start)
        pgconn = conn.pgconn
        while True:
            size, data = pgconn.get_copy_data(1)
            if size == 0:                           # nothing buffered: wait for the socket
                if time.perf_counter() - started > timeout_s:
                    raise RuntimeError(f"the replication stream did not reach {endpos} "
                                       f"within {timeout_s:.0f} s")
                select.select([pgconn.socket], [], [], 1.0)
                pgconn.consume_input()
                continue
            if size < 0:
                raise RuntimeError("the server ended the replication stream early")
            at = int.from_bytes(data[1:9], "big")
            if data[0] == _XLOG_DATA:
                if at > end:
                    break
                messages += 1
                if at == end:       # a commit ending at endpos; the next transaction's
                    break           # first rows share its position
            elif data[0] == _KEEPALIVE and at >= end:
                break
    finally:
        conn.close()
    return Drain(messages, time.perf_counter() - started, time.thread_time() - cpu)


@dataclass(frozen=True)
class ShipRun:
    seconds: float
    peak_rss_mb: float
    stderr_tail: str


def ship_once(config: Config, env: dict | None = None) -> ShipRun:
    """``python -m pipelines ship --once`` for ``config`` in a child process (``env``: its
    whole environment, else the configuration's variables)."""
    env = env or lakecdc_env(config)
    started = time.perf_counter()
    with open(os.devnull, "wb") as devnull, subprocess.Popen(
            [sys.executable, "-m", "pipelines", "ship", "--once"], env=env, cwd=ROOT,
            stdout=devnull, stderr=subprocess.PIPE) as proc:
        peak = PeakRss(proc.pid)
        err = proc.stderr.read()            # before waiting: a full pipe would block it
        proc.wait()
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"lakecdc ship --once failed ({proc.returncode}): "
                           f"{err.decode(errors='replace')[-2000:]}")
    return ShipRun(seconds, peak.mb(), err.decode(errors="replace")[-500:])


class PeakRss:
    """A running child's peak RSS: the kernel's high-water mark of its own memory
    (``VmHWM`` in ``/proc/<pid>/status``), sampled every 20 ms until it exits.

    Not ``wait4``'s ``ru_maxrss``: a child is spawned sharing its parent's memory until it
    executes the new program, and Linux keeps that size as the child's peak. A ``ship
    --once`` run from a process holding 1.5 GB reported 1.5 GB that way (checked with
    ``python -c pass``), and the bench's own process holds a stream's batches."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            try:
                with open(f"/proc/{self.pid}/status") as status:
                    found = [int(line.split()[1]) / 1024 for line in status
                             if line.startswith("VmHWM:")]
            except OSError:
                found = []
            if not found:                   # exited (a zombie has no memory) or reaped
                return
            self.peak = max(self.peak, found[0])
            time.sleep(0.02)

    def mb(self) -> float:
        """The peak, once the child has exited."""
        self._thread.join()
        return self.peak


def against_postgres(config: Config, changes: int, endpos) -> dict:
    """The backlog decoded by Postgres alone (a peek, twice), by ``pg_recvlogical``, by
    psycopg's replication protocol, and shipped by lakecdc, from the witness slots made
    before it was written."""
    rows1, raw1 = raw_decode(config.source_dsn, "witness", config.tables)
    recv = recvlogical(config.source_dsn, "witness_recv", config.tables, endpos)
    drain = replication_drain(config.source_dsn, "witness_repl", config.tables, endpos)
    ship = ship_once(config)
    rows2, raw2 = raw_decode(config.source_dsn, "witness", config.tables)
    for witness in ("witness", "witness_recv", "witness_repl"):
        drop_slot(config.source_dsn, witness)
    raw = (raw1 + raw2) / 2
    # rows2 may exceed rows1 by the empty B/C pairs of transactions the shipper's own
    # session committed on uncaptured tables in between.
    return {"peek_rows": rows1, "peek_rows_after": rows2,
            "raw_decode_s": [round(raw1, 3), round(raw2, 3)],
            "pg_recvlogical_s": round(recv, 3),
            "psycopg_replication": {
                "seconds": round(drain.seconds, 3), "messages": drain.messages,
                "client_cpu_s": round(drain.client_cpu_s, 3)},
            "ship_vs_recvlogical": round(recv / ship.seconds, 3),
            "ship_s": round(ship.seconds, 3), "ratio": round(raw / ship.seconds, 3),
            "raw_rows_per_s": numbers.rate(rows1, raw),
            "ship_rows_per_s": numbers.rate(rows1, ship.seconds),
            "ship_changes_per_s": numbers.rate(changes, ship.seconds),
            "ship_peak_rss_mb": round(ship.peak_rss_mb)}
