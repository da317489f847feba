"""``lakecdc backfill snapshot``: the current rows of captured tables into bronze as ``R``
(read) rows, in keyset chunks, while streaming goes on (DBLog / Sequin-style watermarks).

Why: rows that existed before the slot have no INSERT in the WAL. Gold does not need them
(setup's baseline counts them), but silver and anything built on it as a copy of the tables
does. A backfill gives every such row a ``R`` row in the change stream, placed so that a
reader replaying the stream in ``(commit_lsn, seq)`` order never sees a read that is older
than a change it has already seen.

Per chunk of table T (docs/backfill.md, "How it works"): commit a LOW watermark message;
read the chunk (keyset on T's primary key) in a short REPEATABLE READ snapshot, noting the
transactions in progress; stage rows, key range, LOW LSN and those transactions in
``bronze/_backfill_chunks`` (one Delta commit); commit a HIGH watermark message.

The backfill never writes bronze: its one writer stays the shipper, which appends a staged
chunk's rows to the HIGH's own transaction (``BackfillEmitter``), minus the rows a captured
change inside the window touched (``bronze.backfill_marks.Window``), and records
``lakecdc-backfill:<run>`` = the highest chunk emitted in the same commit, so a repeated
HIGH is ignored. A ``kill -9`` anywhere resumes: a staged chunk not yet emitted gets a new
HIGH (its window only grows) and the run goes on after the last staged key.

It needs a running shipper and stays at most ``max_ahead`` chunks ahead of it; without one
it exits 2 rather than wait.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

import psycopg

from bronze.backfill_source import SourceTable, _reader, describe_table, emit_mark, read_chunk
from bronze.backfill_staging import (
    RUN_DONE,
    TABLE_DONE,
    ChunkInfo,
    RunState,
    _now_us,
    app_id,
    staging_table,
)
from bronze.spark_table import bronze_table
from bronze.table import numbers_as_text
from core.config import Config
from core.engine.api import Engine
from core.errors import UserError
from core.locks import acquire, shipper_running
from core.postgres import connect
from core.progress import ProgressBar
from core.switches import Switches

log = logging.getLogger("lakecdc.backfill")


DEFAULT_CHUNK_ROWS = 10_000
MAX_AHEAD = 2                      # chunks staged but not yet in bronze, at most
WAIT_TIMEOUT_S = 600.0


def backfill_lock_name(slot: str) -> str:
    return f"lakecdc.backfill:{slot}"


def _no_shipper(slot: str) -> UserError:
    return UserError(f"no lakecdc shipper is running on slot {slot}: the backfill's chunks "
                     "reach bronze only through it, so start `lakecdc ship` or `lakecdc run` "
                     "and rerun `lakecdc backfill snapshot` (it continues where it stopped).")


@dataclass
class TableProgress:
    table: str
    rows: int = 0              # staged for the run, all invocations
    chunks: int = 0
    new_rows: int = 0          # staged by this invocation
    new_chunks: int = 0
    done: bool = False


@dataclass
class BackfillReport:
    run: str
    tables: tuple[str, ...]
    outcome: str               # "complete", "already complete", "stopped"
    per_table: dict[str, TableProgress]
    seconds: float
    resumed: bool = False

    @property
    def new_rows(self) -> int:
        return sum(t.new_rows for t in self.per_table.values())

    def summary(self) -> str:
        parts = ", ".join(f"{t.table} {t.rows:,} rows in {t.chunks:,} chunks"
                          for t in self.per_table.values())
        if self.outcome == "already complete":
            return (f"backfill run {self.run} of {', '.join(self.tables)} is already complete "
                    f"({parts}); pass --new-run to read the tables again.")
        rate = (f", {self.new_rows / self.seconds:,.0f} rows/s" if self.seconds > 0
                and self.new_rows else "")
        head = f"backfill run {self.run}{' (resumed)' if self.resumed else ''}: {parts}"
        if self.outcome == "stopped":
            return (f"{head}; stopped between chunks after {self.seconds:.1f}s: rerun "
                    "`lakecdc backfill snapshot` to continue.")
        return f"{head}; complete in {self.seconds:.1f}s{rate}."


def resolve_tables(config: Config, requested: Iterable[str] | None) -> tuple[str, ...]:
    """The captured tables to read (all when none requested), in configuration order."""
    if not requested:
        return tuple(config.tables)
    chosen = set()
    for name in requested:
        matches = [t for t in config.tables if name in (t, t.split(".", 1)[1])]
        if len(matches) != 1:
            raise UserError(f"table {name} is not captured, so it cannot be backfilled; "
                            f"captured: {', '.join(config.tables)} (LAKECDC_TABLES).")
        chosen.add(matches[0])
    return tuple(t for t in config.tables if t in chosen)


def run_snapshot_backfill(config: Config, tables: Iterable[str] | None = None,
                          chunk_rows: int = DEFAULT_CHUNK_ROWS,
                          stop: threading.Event | None = None, new_run: bool = False,
                          max_ahead: int = MAX_AHEAD, timeout_s: float = WAIT_TIMEOUT_S,
                          storage_options: dict | None = None,
                          since_us: int | None = None,
                          engine: Engine | None = None) -> BackfillReport:
    """``lakecdc backfill snapshot``: run or continue the backfill of ``tables``.
    ``since_us``: runs of these tables started before this time (µs since the epoch) are
    passed over (``lakecdc tables add``: a table captured again is read again).
    ``engine``: the one staging is written and bronze read through (None: ``config``'s,
    ``core.engine.choose.engine_for``)."""
    chosen = resolve_tables(config, tables)
    if chunk_rows < 1 or max_ahead < 0 or timeout_s <= 0:
        raise UserError("--chunk-rows and --timeout must be positive.")
    return SnapshotBackfill(config, chosen, chunk_rows, stop or threading.Event(), new_run,
                            max_ahead, timeout_s, storage_options, since_us,
                            engine=engine).run()


class SnapshotBackfill:
    def __init__(self, config: Config, tables: tuple[str, ...], chunk_rows: int,
                 stop: threading.Event, new_run: bool, max_ahead: int, timeout_s: float,
                 storage_options: dict | None, since_us: int | None = None,
                 engine: Engine | None = None) -> None:
        """``storage_options``: bronze's on delta-rs (None: the engine's)."""
        if engine is None:
            from core.engine.choose import engine_for

            engine = engine_for(config)
        self.config, self.tables, self.chunk_rows = config, tables, chunk_rows
        self.since_us = since_us
        self.stop, self.new_run = stop, new_run
        self.max_ahead, self.timeout_s = max_ahead, timeout_s
        self.key = ",".join(tables)
        self.switches = Switches.from_config(config)
        self.bronze = bronze_table(config, storage_options, engine=engine,
                                   switches=self.switches)
        self.staging = staging_table(config, engine=engine)

    # -- state --

    def _pick_run(self) -> tuple[RunState, bool]:
        """The run to work on, and whether it existed already."""
        runs = self.staging.runs()
        mine = sorted((r for r in runs.values() if r.tables == self.tables
                       and (self.since_us is None or r.started_at >= self.since_us)),
                      key=lambda r: r.started_at)
        for other in runs.values():
            if other.tables != self.tables and not other.complete:
                log.info("backfill run %s of %s is unfinished; `lakecdc backfill snapshot` "
                         "with those tables continues it", other.run, ", ".join(other.tables))
        latest = mine[-1] if mine else None
        if latest is not None and not self.new_run:
            return latest, True
        if latest is not None and not latest.complete:
            log.warning("starting a new backfill run: run %s of these tables is abandoned "
                        "unfinished", latest.run)
        run = (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-"
               + secrets.token_hex(3))
        return RunState(run, self.tables, _now_us()), False

    def _emitted(self, run: str) -> int:
        return self.bronze.app_version(app_id(run)) or 0

    def _wait_emitted(self, conn: psycopg.Connection, run: str, chunk: int) -> bool:
        """Until bronze holds ``chunk`` of ``run`` (False: stopped). Bounded: exit 2 if no
        shipper runs, or after ``timeout_s``."""
        if chunk <= 0:
            return True
        deadline = time.monotonic() + self.timeout_s
        delay = 0.02
        while self._emitted(run) < chunk:
            if self.stop.is_set():
                return False
            if not shipper_running(conn, self.config.slot):
                raise _no_shipper(self.config.slot)
            if time.monotonic() > deadline:
                raise UserError(f"the shipper has not brought backfill chunk {chunk} into "
                                f"bronze within {self.timeout_s:.0f}s (is it far behind? see "
                                "`lakecdc status`); rerun `lakecdc backfill snapshot` to "
                                "continue.")
            self.stop.wait(delay)
            delay = min(delay * 1.5, 0.5)
        return True

    # -- the run --

    def run(self) -> BackfillReport:
        started = time.monotonic()
        cfg = self.config
        if not self.bronze.exists():
            raise UserError(f"no bronze table at {cfg.bronze_path}: run `lakecdc setup` first.")
        with connect(cfg.require_source()) as conn:
            acquire(conn, backfill_lock_name(cfg.slot), f"lakecdc backfill {cfg.slot}",
                    f"another `lakecdc backfill snapshot` is running on slot {cfg.slot}; wait "
                    "for it to finish or stop it first.")
            self.staging.ensure()
            state, resumed = self._pick_run()
            per_table = {t: TableProgress(t) for t in self.tables}
            for info in state.chunks.values():
                per_table[info.table].rows += info.rows
                per_table[info.table].chunks += 1
            for t in state.done_tables:
                per_table[t].done = True
            if state.complete:
                self.staging.drop_rows(state.run)     # idempotent: a crash may have left them
                return BackfillReport(state.run, self.tables, "already complete", per_table,
                                      time.monotonic() - started, resumed)
            if not shipper_running(conn, cfg.slot):
                raise _no_shipper(cfg.slot)
            # Numbers as the shipper's wal2json prints them (it recorded how in bronze).
            text = numbers_as_text(self.bronze, cfg.slot)
            sources = {t: describe_table(conn, t, text) for t in self.tables}
            outcome = self._run(conn, state, sources, per_table)
        return BackfillReport(state.run, self.tables, outcome, per_table,
                              time.monotonic() - started, resumed)

    def _run(self, conn: psycopg.Connection, state: RunState,
             sources: dict[str, SourceTable], per_table: dict[str, TableProgress]) -> str:
        run, tables = state.run, self.key
        emitted = self._emitted(run)
        # Staged before an interruption but not in bronze: announce again (the window of
        # such a chunk only grows, which keeps the drop rule correct).
        for k in sorted(c for c in state.chunks if c > emitted):
            info = state.chunks[k]
            log.info("backfill %s: announcing chunk %d of %s again (staged before an "
                     "interruption)", run, k, info.table)
            emit_mark(conn, run, info.table, k, "high")
        next_chunk = max(state.chunks, default=0) + 1
        log.info("backfill run %s of %s: %s", run, tables,
                 "continuing" if state.chunks or state.done_tables else "starting")
        with _reader(self.config.require_source()) as reader:
            for table in self.tables:
                progress = per_table[table]
                if progress.done:
                    continue
                source = sources[table]
                previous = state.table_chunks(table)
                cursor = previous[-1].last_key if previous else None
                with ProgressBar(f"backfill {table}", max(source.estimated_rows, progress.rows),
                              unit="rows read") as bar:
                    if progress.rows:
                        bar(progress.rows)
                    while True:
                        if self.stop.is_set():
                            return "stopped"
                        if not self._wait_emitted(conn, run, next_chunk - 1 - self.max_ahead):
                            return "stopped"
                        low = emit_mark(conn, run, table, next_chunk, "low")
                        self.switches.hit("after_backfill_low")
                        chunk = read_chunk(reader, table, cursor, self.chunk_rows,
                                           source.numbers_as_text)
                        if not chunk.keys:
                            break
                        self.staging.stage_chunk(
                            ChunkInfo(run, next_chunk, table, chunk.source.key_columns,
                                      chunk.keys[0], chunk.keys[-1], low, chunk.in_progress,
                                      len(chunk.keys)),
                            tables, chunk.keys, chunk.data)
                        self.switches.hit("after_backfill_stage")
                        emit_mark(conn, run, table, next_chunk, "high")
                        self.switches.hit("after_backfill_high")
                        n = len(chunk.keys)
                        progress.rows += n
                        progress.chunks += 1
                        progress.new_rows += n
                        progress.new_chunks += 1
                        bar.label = f"backfill {table} (chunk {next_chunk})"
                        bar(n)
                        cursor = chunk.keys[-1]
                        next_chunk += 1
                        if n < self.chunk_rows:
                            break
                self.staging.mark(TABLE_DONE, run, tables, table=table)
                progress.done = True
                log.info("backfill %s: %s read, %s rows in %s chunks", run, table,
                         f"{progress.rows:,}", f"{progress.chunks:,}")
        if not self._wait_emitted(conn, run, next_chunk - 1):
            return "stopped"
        total = sum(p.rows for p in per_table.values())
        self.staging.mark(RUN_DONE, run, tables, rows=total, chunk=next_chunk - 1)
        self.staging.drop_rows(run)
        # The staging table's only writer is this run: it keeps the table small itself
        # (core.maintenance), after its last write.
        log.info("backfill %s: maintained %s", run,
                 self.staging.maintain(self.config.retention_hours).line())
        return "complete"

