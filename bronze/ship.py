"""slot → bronze, exactly once (DESIGN §3.1).

Delivery guarantees:

- Every change of a committed transaction on a captured table lands in bronze exactly once,
  keyed ``(commit_lsn, seq)``; rolled-back transactions never reach the slot's output.
- A transaction is never split across Delta commits: a peek ends between transactions and
  is written in one commit, however large (batches spill to local disk, not to memory).
- **The delivery rule** (``ship_batch``, the only place it is written): peek without moving
  the slot → drop transactions with ``commit_lsn <=`` bronze's recorded version → append the
  rest *and* the new progress in one Delta commit → only then advance the slot, never past
  what bronze recorded. A crash anywhere repeats at most the peek; the repeat is dropped by
  the version check.
- Snapshot backfill (``bronze/backfill.py``): a kept HIGH watermark message of a staged
  chunk not yet in bronze gets the chunk's rows appended to its own transaction, in the same
  commit, minus rows changed inside the chunk's watermark window; the commit also records
  ``lakecdc-backfill:<run>`` = the highest chunk emitted, so a repeated HIGH is ignored.
- On start the shipper reads bronze's progress and completes an interrupted advance (or a
  slot that went back after a Postgres crash). It refuses to run, with the recovery command,
  if the slot is missing, invalidated, ahead of bronze (moved by someone else: changes may
  be lost), belongs to another database or cluster, or another shipper holds it.

Operational risk: while the shipper is stopped the slot pins WAL on the source (see
``bronze/slot.py``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import psycopg
import pyarrow as pa

from bronze import slot as slots
from bronze.buffer import SpillBuffer
from bronze.failover import REBASELINE as FAILOVER_STEPS
from bronze.failover import check_same_history
from bronze.backfill import BackfillEmitter
from bronze.records import ASSEMBLED_SCHEMA, TransactionAssembler, finalize, high_marks
from bronze.source import connect, require_identity
from bronze.table import BronzeTable, Progress
from pipelines.config import Config
from pipelines.errors import UserError
from pipelines.faults import FaultPoints
from pipelines.locks import ship_lock_name
from pipelines.lsn import fmt

log = logging.getLogger("lakecdc.ship")


@dataclass
class BatchResult:
    peek_rows: int
    changes: int
    transactions: int
    full: bool              # the peek hit upto_nchanges: more may be waiting
    committed: bool         # a bronze commit was made
    seconds: float
    read_rows: int = 0      # snapshot backfill rows appended (not counted in ``changes``)


@dataclass
class ShipTotals:
    batches: int = 0
    changes: int = 0
    transactions: int = 0
    commits: int = 0
    read_rows: int = 0


class Shipper:
    def __init__(self, config: Config, faults: FaultPoints | None = None,
                 storage_options: dict | None = None,
                 on_batch: Callable[[BatchResult, Progress], None] | None = None) -> None:
        self.config = config
        # Called after every batch (metrics); must not raise.
        self.on_batch = on_batch
        self.faults = faults or FaultPoints(config.faults)
        self.table = BronzeTable(config.bronze_path, storage_options)
        self.backfill = BackfillEmitter(config, self.table, storage_options)
        self._last_progress_commit = time.monotonic()

    # --- start-up ---------------------------------------------------------------------

    def open(self) -> tuple[psycopg.Connection, Progress]:
        """Connect, take the single-shipper lock, check everything, finish any advance."""
        cfg = self.config
        conn = connect(cfg.require_source())
        try:
            if not self.table.exists():
                raise UserError(f"no bronze table at {cfg.bronze_path}: run `lakecdc setup` "
                                "first.")
            conn.execute("SELECT set_config('statement_timeout', %s, false)",
                         [f"{cfg.peek_timeout_s}s"])
            got = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                               [ship_lock_name(cfg.slot)]).fetchone()[0]
            if not got:
                raise UserError(f"another lakecdc shipper is already running on slot "
                                f"{cfg.slot}; stop it first (only one may ship a slot).")
            progress = self._check(conn)
            state = slots.slot_state(conn, cfg.slot)
            if state.confirmed_flush_lsn < progress.end_lsn and cfg.guard_on("version_check"):
                log.info("slot %s at %s is behind bronze's %s: completing the advance",
                         cfg.slot, fmt(state.confirmed_flush_lsn), fmt(progress.end_lsn))
                slots.advance(conn, cfg.slot, progress.end_lsn)
            return conn, progress
        except BaseException:
            conn.close()
            raise

    def _check(self, conn: psycopg.Connection) -> Progress:
        cfg = self.config
        ident = self.table.identity()
        db = conn.execute("SELECT current_database()").fetchone()[0]
        if ident.slot != cfg.slot or ident.database != db:
            raise UserError(f"bronze at {cfg.bronze_path} was set up for slot {ident.slot} on "
                            f"database {ident.database}, not slot {cfg.slot} on {db}; use "
                            "the matching LAKECDC_SLOT/LAKECDC_LAKEHOUSE.")
        progress = self.table.progress(cfg.slot)
        if progress is None:
            raise UserError(f"bronze at {cfg.bronze_path} has no progress for slot {cfg.slot}; "
                            "run `lakecdc setup`.")
        system_id, timeline = slots.identify_system(cfg.require_source())
        check_same_history(conn, ident, progress.end_lsn, system_id, timeline)
        require_identity(conn, cfg.tables)
        state = slots.slot_state(conn, cfg.slot)
        if state is None:
            raise UserError(f"replication slot {cfg.slot} does not exist (dropped, or lost "
                            f"in a failover); bronze holds changes up to "
                            f"{fmt(progress.end_lsn)}: {FAILOVER_STEPS}.")
        if state.wal_status == "lost" or state.confirmed_flush_lsn is None:
            raise UserError(f"replication slot {cfg.slot} was invalidated (wal_status="
                            f"{state.wal_status}): the WAL it needed is gone; "
                            f"{FAILOVER_STEPS}.")
        if state.plugin != slots.PLUGIN or state.database != db:
            raise UserError(f"replication slot {cfg.slot} uses plugin {state.plugin} on "
                            f"database {state.database}; lakecdc needs a wal2json slot on {db}.")
        if state.active_pid is not None:
            raise UserError(f"replication slot {cfg.slot} is in use by PID {state.active_pid}; "
                            "stop that consumer first.")
        if state.confirmed_flush_lsn > progress.end_lsn:
            raise UserError(f"replication slot {cfg.slot} is at "
                            f"{fmt(state.confirmed_flush_lsn)}, past bronze's "
                            f"{fmt(progress.end_lsn)}: it was advanced or recreated outside "
                            f"lakecdc and changes may be lost; {FAILOVER_STEPS}.")
        if state.wal_status == "unreserved":
            log.warning("slot %s wal_status=unreserved: WAL it needs is about to be removed",
                        cfg.slot)
        return progress

    # --- the delivery rule ----------------------------------------------------------------

    def ship_batch(self, conn: psycopg.Connection, progress: Progress,
                   force_progress: bool = False) -> tuple[BatchResult, Progress]:
        """One bounded peek → at most one bronze commit → advance. Returns the new progress."""
        cfg = self.config
        started = time.monotonic()
        after = progress.commit_lsn if cfg.guard_on("version_check") else -1
        assembler = TransactionAssembler(after)
        marks = []
        with SpillBuffer(ASSEMBLED_SCHEMA, cfg.memory_budget_mb << 20, cfg.spill_dir) as buf:
            for cols in slots.peek(conn, cfg.slot, cfg.tables, cfg.upto_nchanges,
                                   int(cfg.chunk_mb * (1 << 20))):
                batch = assembler.add(cols)
                marks += high_marks(batch)
                buf.append(batch)
            summary = assembler.finish()
            self.faults.hit("after_peek")
            full = summary.rows >= cfg.upto_nchanges
            if summary.last_lsn is None:
                return BatchResult(0, 0, 0, False, False, time.monotonic() - started), progress

            new = Progress(max(progress.commit_lsn, summary.max_commit_lsn or 0),
                           max(progress.end_lsn, summary.last_lsn))
            if not cfg.guard_on("commit_before_advance"):
                # Negative control only: acknowledging before storing loses data on a crash.
                slots.advance(conn, cfg.slot, new.end_lsn)
                self.faults.hit("after_advance")
            committed = False
            read_rows = 0
            if summary.kept:
                shipped_at = pa.scalar(int(time.time() * 1e6), pa.int64()).cast(
                    pa.timestamp("us", tz="UTC"))
                metadata = {"lakecdc.changes": summary.kept,
                            "lakecdc.transactions": summary.transactions}
                # Backfill chunks announced in this batch: their rows join the HIGH
                # watermark's transaction (tx_changes grows before any row is finalized).
                emission = (self.backfill.plan(marks, progress.commit_lsn, buf.batches,
                                               summary.tx_changes, cfg.slot, shipped_at)
                            if marks else None)
                batches = (self._with_fault(finalize(b, summary.tx_changes, cfg.slot, shipped_at))
                           for b in buf.batches())
                if emission is not None:
                    batches = itertools.chain(batches, map(self._with_fault, emission.batches))
                    read_rows = emission.rows
                    metadata.update({"lakecdc.backfill_chunks": ",".join(emission.chunks),
                                     "lakecdc.backfill_rows": emission.rows,
                                     "lakecdc.backfill_dropped": emission.dropped})
                self.table.append(batches, cfg.slot, new, metadata,
                                  emission.app_versions if emission is not None else None)
                committed = True
            elif new.end_lsn > progress.end_lsn and (force_progress or full or self._progress_due()):
                # Only transactions without captured changes: record that they were passed
                # over so the slot can move and release WAL.
                self.table.record_progress(cfg.slot, new, {"lakecdc.changes": 0})
                committed = True
            else:
                new = Progress(progress.commit_lsn, progress.end_lsn)
            if committed:
                self._last_progress_commit = time.monotonic()
                self.faults.hit("after_bronze_commit")
            slots.advance(conn, cfg.slot, new.end_lsn)
            self.faults.hit("after_advance")
        return BatchResult(summary.rows, summary.kept, summary.transactions, full, committed,
                           time.monotonic() - started, read_rows), new

    def _with_fault(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.faults.hit("during_bronze_write")
        return batch

    def _progress_due(self) -> bool:
        return time.monotonic() - self._last_progress_commit >= self.config.progress_commit_interval_s

    # --- loops ------------------------------------------------------------------------------

    def run(self, once: bool = False, stop: threading.Event | None = None) -> ShipTotals:
        """Ship until stopped; with ``once``, until the slot is drained, then return."""
        stop = stop or threading.Event()
        totals = ShipTotals()
        conn, progress = self.open()
        try:
            while not stop.is_set():
                result, progress = self.ship_batch(conn, progress, force_progress=once)
                if self.on_batch is not None:
                    self.on_batch(result, progress)
                totals.batches += 1
                totals.changes += result.changes
                totals.transactions += result.transactions
                totals.commits += result.committed
                totals.read_rows += result.read_rows
                if result.changes:
                    log.debug("shipped %d changes in %d transactions in %.2fs (up to %s)",
                             result.changes, result.transactions, result.seconds,
                             fmt(progress.commit_lsn))
                if result.full:
                    continue
                if once:
                    break
                stop.wait(self.config.poll_interval_s)
        finally:
            conn.close()
        return totals
