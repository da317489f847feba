"""slot → bronze, exactly once (docs/bronze.md).

Delivery guarantees:

- Every change of a committed transaction on a captured table lands in bronze exactly once,
  keyed ``(commit_lsn, seq)``; rolled-back transactions never reach the slot's output.
- A transaction is never split across Delta commits: a peek ends between transactions and
  is written in one commit, however large. Its rows go to the commit's Parquet files while
  the peek streams, each transaction once it is closed (its change count is known); the one
  still open waits, spilled to local disk past ``--memory-budget-mb``. Memory does not grow
  with the size of a peek or of a transaction.
- **The delivery rule** (``ship_batch``, the only place it is written): peek without moving
  the slot → drop transactions with ``commit_lsn <=`` bronze's recorded version → append the
  rest *and* the new progress in one Delta commit → only then advance the slot, never past
  what bronze recorded. A crash repeats at most the peek, which the version check drops.
- Snapshot backfill (``bronze/snapshot_backfill.py``): a staged chunk's rows join its HIGH
  watermark's transaction, in the same commit, which records the chunk (``lakecdc-backfill:<run>``).
- On start the shipper reads bronze's progress and completes an interrupted advance (or a
  slot that went back after a Postgres crash). It refuses to run, with the recovery command,
  if the slot is missing, invalidated, ahead of bronze (moved by someone else: changes may
  be lost), belongs to another database or cluster, or another shipper holds it.

WAL safety and lost sessions (``docs/operations.md``): heartbeats, an ALERT line for an
``unreserved`` slot, a stop with the recovery command for a slot ``lost``, dropped or moved
(never recreated silently), reconnects with capped backoff; the position to advance to is
always re-read from bronze.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import replace

import psycopg
import pyarrow as pa

from bronze import heartbeat as heartbeats
from bronze import slot as slots
from bronze.backfill_emitter import BackfillEmitter
from bronze.backfill_join import join_backfill
from bronze.batch_rows import BatchRows
from bronze.capture_list import ShipperSet
from bronze.failover import SlotWatch, check_same_history, slot_ahead, slot_lost, slot_missing
from bronze.records import UTC_US, PeekSummary, TransactionAssembler
from bronze.session_loss import diagnose, reconnect_reason, transient
from bronze.shipped import (
    FIRST_FOLLOWED_PEEK,
    Downstream,
    KeptRows,
    ShipBatch,
    ShipTotals,
    newest_stored,
)
from bronze.source import check_replication_role, require_identity
from bronze.spark_table import bronze_table
from bronze.table import NUMBERS_SUFFIX, Progress
from core.config import Config
from core.engine.api import Engine
from core.engine.choose import engine_for
from core.errors import UserError, first_line, redact
from core.locks import acquire, release, ship_application, ship_lock_name
from core.lsn import fmt
from core.postgres import connect, open_connection
from core.switches import Switches
from core.units import byte_size

log = logging.getLogger("lakecdc.ship")

# The shipper's source session: a silent network partition is noticed within ~40 s by TCP
# keepalives (a peek that is only slow keeps answering them), a send that is never
# acknowledged within 30 s fails.
SESSION_OPTIONS = {"application_name": "lakecdc ship", "keepalives": 1,
                   "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                   "tcp_user_timeout": 30_000}
RETRY_FIRST_S = 0.5            # first reconnect delay; doubles up to reconnect_max_backoff_s

class Shipper:
    def __init__(self, config: Config, switches: Switches | None = None,
                 storage_options: dict | None = None, engine: Engine | None = None,
                 downstream: Downstream | None = None) -> None:
        """``engine``: the one every lakehouse read and write goes through (None:
        ``config``'s, ``core.engine.choose.engine_for``); ``storage_options``: bronze's.
        ``downstream``: what each batch is handed to (``bronze.shipped.Downstream``)."""
        self.config = config
        self.downstream = downstream or Downstream()
        # The newest source commit bronze holds (None: none), read from bronze's progress
        # at every (re)connect and kept by each commit: bronze has one writer, the shipper
        # holding the slot's lock.
        self._stored_lsn: int | None = None
        # The next peek's bound where each batch's rows are kept (``KeptRows.next_peek``).
        self._upto = min(config.upto_nchanges, FIRST_FOLLOWED_PEEK)
        self.switches = on = switches or Switches.from_config(config)
        engine = engine if engine is not None else engine_for(config)
        self.table = bronze_table(config, storage_options, engine=engine, switches=on)
        self.backfill = BackfillEmitter(config, self.table, engine=engine, switches=on)
        self.captured = ShipperSet(config.lakehouse, config.slot, config.tables, engine=engine)
        # When bronze last committed, so the slot last moved (heartbeats are due after
        # ``heartbeat_interval_s`` without a move).
        self._last_progress_commit = time.monotonic()
        self.heartbeat = heartbeats.Heartbeat(config.heartbeat_interval_s)
        self._session: tuple[int, object] | None = None   # (pid, backend_start) on the source
        self.watch = SlotWatch(config.slot)
        self.reconnects = 0
        self.reconnect_reasons: list[str] = []    # one per reconnect, in order
        self._reported = (0, 0)     # heartbeats, reconnects already passed downstream
        self._unreported: tuple[ShipBatch, Progress] | None = None   # see _report
        self.numbers_as_text: bool | None = None   # wal2json's, asked at every start
        self.recorded: dict[str, int] = {}         # app versions every commit records
        # The source's WAL flush position read right before a peek that found nothing at
        # all; None otherwise. Until more WAL is flushed, a peek would find nothing again
        # (``_step``).
        self._drained_at: int | None = None

    # --- start-up ---------------------------------------------------------------------

    def open(self, reconnecting: bool = False) -> tuple[psycopg.Connection, Progress]:
        """Connect, take the single-shipper lock, check everything, finish any advance.

        ``reconnecting``: after the source went away mid-run. Connection failures are then
        raised as they are (the caller retries), and the session this shipper had before
        is ended first, so its advisory lock and the slot are free at once."""
        cfg = self.config
        self._drained_at = None
        conn = self._connect(reconnecting)
        try:
            if not self.table.exists():
                raise UserError(f"no bronze table at {cfg.bronze_path}: run `lakecdc setup` "
                                "first.")
            conn.execute("SELECT set_config('statement_timeout', %s, false)",
                         [f"{cfg.peek_timeout_s}s"])
            if reconnecting:
                self._end_previous_session(conn)
            self._session = conn.execute(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).fetchone()
            acquire(conn, ship_lock_name(cfg.slot), ship_application(cfg.slot),
                    f"another lakecdc shipper is already running on slot {cfg.slot}; stop it "
                    "first (only one may ship a slot).")
            progress = self._check(conn)
            self._stored_lsn = progress.commit_lsn or None
            state = slots.slot_state(conn, cfg.slot)
            if state.confirmed_flush_lsn < progress.end_lsn and self.switches.on("version_check"):
                log.info("slot %s at %s is behind bronze's %s: completing the advance",
                         cfg.slot, fmt(state.confirmed_flush_lsn), fmt(progress.end_lsn))
                slots.advance(conn, cfg.slot, progress.end_lsn)
            return conn, progress
        except BaseException:
            conn.close()
            raise

    def _connect(self, reconnecting: bool) -> psycopg.Connection:
        dsn = self.config.require_source()
        if not reconnecting:      # a source unreachable at start: one sentence, exit 2
            return connect(dsn, **SESSION_OPTIONS)
        return open_connection(dsn, **SESSION_OPTIONS)

    def _end_previous_session(self, conn: psycopg.Connection) -> None:
        """End this shipper's previous source session if the server still runs it (a cut
        connection is noticed by the server only when it next writes to it); it holds the
        advisory lock and, mid-peek, the slot. Matched by PID *and* start time."""
        if self._session is None:
            return
        pid, started = self._session
        try:
            ended = conn.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                                 "WHERE pid = %s AND backend_start = %s",
                                 [pid, started]).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return                 # it will go away by itself; the lock check says if not
        if ended is not None:
            log.info("ended this shipper's previous source session (PID %d)", pid)

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
        check_replication_role(conn)
        system_id, timeline = slots.identify_system(cfg.require_source())
        check_same_history(conn, ident, progress.end_lsn, system_id, timeline)
        self.captured.start(self.table.app_version(self.captured.app_id))
        require_identity(conn, (*self.captured.tables, *self.captured.left_out), cfg.counted.names)
        self.captured.refuse_left_out()
        state = slots.slot_state(conn, cfg.slot)
        if state is None:
            raise slot_missing(cfg.slot, progress)
        if state.invalidated or state.confirmed_flush_lsn is None:
            raise slot_lost(cfg.slot, state, progress)
        if state.plugin != slots.PLUGIN or state.database != db:
            raise UserError(f"replication slot {cfg.slot} uses plugin {state.plugin} on "
                            f"database {state.database}; lakecdc needs a wal2json slot on {db}.")
        if state.active_pid is not None:
            raise UserError(f"replication slot {cfg.slot} is in use by PID {state.active_pid}; "
                            "stop that consumer first.")
        if (ahead := slot_ahead(cfg.slot, state, progress)) is not None:
            raise ahead
        self._numbers_as_text(conn)
        self.watch(state, progress)
        return progress

    def _numbers_as_text(self, conn: psycopg.Connection) -> None:
        """Ask the server's wal2json for numbers as text where it can (2.6+), so NaN and
        ±Infinity reach silver and the mirrors; every commit records the answer
        (``bronze.table.NUMBERS_SUFFIX``)."""
        slot = self.config.slot
        text = slots.prints_numbers_as_text(conn, slot)
        if text is None:        # taken between the check above and here
            raise UserError(f"replication slot {slot} is in use by another session; stop "
                            "that consumer first.")
        if text != self.numbers_as_text:      # debug: `ship --once` prints nothing else
            log.debug("wal2json on the source %s", "prints numbers as text (2.6+): NaN and "
                      "±Infinity are kept" if text else "lacks numeric-data-types-as-string "
                      "(2.5): NaN and ±Infinity arrive as NULL (docs/silver.md)")
        self.numbers_as_text = text
        self.recorded = {slot + NUMBERS_SUFFIX: int(text)}

    # --- the delivery rule ----------------------------------------------------------------

    def ship_batch(self, conn: psycopg.Connection, progress: Progress,
                   force_progress: bool = False) -> tuple[ShipBatch, Progress]:
        """One bounded peek → at most one bronze commit → advance. Returns the new progress.

        Rows are written to the commit's data files while the peek streams, as their
        transactions close (``BatchRows``); none of them is visible before the commit."""
        cfg = self.config
        started, started_at = time.monotonic(), time.time()
        after = progress.commit_lsn if self.switches.on("version_check") else -1
        assembler = TransactionAssembler(after)
        shipped_at = pa.scalar(int(time.time() * 1e6), pa.int64()).cast(UTC_US)
        self.captured.refresh()          # the captured set (bronze.capture_list)
        ack = self.captured.ack()
        kept = KeptRows() if self.downstream.takes_rows else None
        upto = self._upto if kept is not None else cfg.upto_nchanges

        def to_bronze(batch: pa.RecordBatch) -> pa.RecordBatch:
            self.switches.hit("during_bronze_write")
            if kept is not None:
                kept.add(batch)
            return batch

        with self.table.data_files() as files, BatchRows(
                files, assembler, cfg, shipped_at, to_bronze) as rows:
            for cols in slots.peek(conn, cfg.slot, self.captured.tables, upto,
                                   int(cfg.chunk_mb * (1 << 20)), bool(self.numbers_as_text)):
                rows.add(assembler.add(cols))
            summary = assembler.finish()
            self.switches.hit("after_peek")
            full = summary.rows >= upto
            if kept is not None:
                self._upto = kept.next_peek(cfg.upto_nchanges, upto, full)
            if summary.last_lsn is None:
                return self._done(ShipBatch(0, 0, 0, False, False, time.monotonic() - started,
                                            started_at=started_at), progress)

            new = Progress(max(progress.commit_lsn, summary.max_commit_lsn or 0),
                           max(progress.end_lsn, summary.last_lsn))
            if not self.switches.on("commit_before_advance"):
                # Negative control only: acknowledging before storing loses data on a crash.
                slots.advance(conn, cfg.slot, new.end_lsn)
                self.switches.hit("after_advance")
            stored: dict = {}
            if summary.kept:
                stored = self._commit_changes(rows, summary, progress, new, ack, kept)
                committed = True
            else:
                committed = self._record_passed(progress, new, summary, ack,
                                                force_progress or full)
                if not committed:
                    new = Progress(progress.commit_lsn, progress.end_lsn)
            result = ShipBatch(summary.rows, summary.kept, summary.transactions, full,
                               committed, time.monotonic() - started, started_at=started_at,
                               **newest_stored(summary, committed), **stored)
            if committed:
                if result.commit_lsn is not None:
                    result = self.downstream.stored(result)
                # In bronze now: reported even if the advance fails (a reconnect completes it).
                self._done(result, new)
                self.switches.hit("after_bronze_commit")
            slots.advance(conn, cfg.slot, new.end_lsn)
            self.switches.hit("after_advance")
        return self._done(result, new)

    def _commit_changes(self, rows: BatchRows, summary: PeekSummary, progress: Progress,
                        new: Progress, ack: dict[str, int], kept: KeptRows | None) -> dict:
        """Commit the batch's changes with ``new``, and the read rows of the backfill chunks
        announced in it; returns what ``ShipBatch`` reports of them."""
        metadata = {"lakecdc.changes": summary.kept,
                    "lakecdc.transactions": summary.transactions}
        emission, skipped = join_backfill(self.backfill, rows, summary, progress.commit_lsn,
                                          metadata)
        if kept is not None and kept.batches is not None:
            self.downstream.rows(self._stored_lsn, kept.table(), self.captured.known)
        self.table.commit(rows.files, self.config.slot, new, metadata,
                          {**ack, **self.recorded, **(emission.app_versions if emission else {})})
        stored = {"read_rows": emission.rows if emission is not None else 0,
                  "skipped_messages": skipped, "after_lsn": self._stored_lsn}
        self._stored_lsn = summary.max_commit_lsn
        self._committed(ack, summary)
        return stored

    def _record_passed(self, progress: Progress, new: Progress, summary: PeekSummary,
                       ack: dict[str, int], due: bool) -> bool:
        """Only transactions without captured changes (uncaptured tables, our own
        heartbeats): record that they were passed over, when it is ``due`` or worth it, so
        the slot can move and release WAL. Returns whether it committed."""
        if not (new.end_lsn > progress.end_lsn and (
                due or self._progress_due() or ack or self.heartbeat.passed(summary.last_lsn))):
            return False
        self.table.record_progress(self.config.slot, new, {"lakecdc.changes": 0},
                                   {**ack, **self.recorded})
        self._committed(ack, summary)
        return True

    def _committed(self, ack: dict[str, int], summary: PeekSummary) -> None:
        """After a bronze commit: the captured set it acknowledged is taken as the shipper's,
        the slot moved, a heartbeat it passed recorded."""
        self.captured.committed(ack)
        self._last_progress_commit = time.monotonic()
        if self.heartbeat.passed(summary.last_lsn):
            self.heartbeat.recorded()

    def _done(self, result: ShipBatch, progress: Progress) -> tuple[ShipBatch, Progress]:
        """The batch ``run`` reports next (downstream, totals)."""
        self._unreported = (result, progress)
        return result, progress

    def _report(self, totals: ShipTotals) -> None:
        """Count the last batch once: after it completed, or after it failed past its bronze
        commit (its rows are in bronze; the advance is completed on reconnect)."""
        if self._unreported is None:
            return
        (result, progress), self._unreported = self._unreported, None
        self.downstream.shipped(self._with_events(result), progress)
        totals.batches += 1
        totals.changes += result.changes
        totals.transactions += result.transactions
        totals.commits += result.committed
        totals.read_rows += result.read_rows
        if result.changes:
            log.debug("shipped %d changes in %d transactions in %.2fs (up to %s)",
                      result.changes, result.transactions, result.seconds,
                      fmt(progress.commit_lsn))

    def _progress_due(self) -> bool:
        return (time.monotonic() - self._last_progress_commit
                >= self.config.progress_commit_interval_s)

    # --- loops ------------------------------------------------------------------------------

    def run(self, once: bool = False, stop: threading.Event | None = None) -> ShipTotals:
        """Ship until stopped; with ``once``, until the slot is drained, then return. A lost
        source: continuous shipping reconnects with backoff and re-runs the start-up checks
        (bronze's progress re-read, an interrupted advance completed); ``once`` fails with
        one sentence (exit 2), and its caller decides when to retry."""
        stop = stop or threading.Event()
        # Everything alive now (modules: pyarrow, pandas, psycopg...) lives as long as the
        # process: exempt it from garbage collection, or every collection triggered by a
        # peek's hundreds of thousands of row buffers re-scans it (~30% of the CPU time).
        gc.freeze()
        totals = ShipTotals()
        conn, progress = self.open()
        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    result, progress = self._step(conn, progress, once)
                    # --once: drained, but the WAL is far ahead: one heartbeat, one more batch.
                    again = once and not result.full and self._heartbeat_after_drain(conn)
                except Exception as exc:
                    self._report(totals)               # a batch stored before it failed
                    # raises unless the source went away
                    diagnose(exc, conn, slot=self.config.slot,
                             peek_timeout_s=self.config.peek_timeout_s,
                             bronze_progress=self.table.progress,
                             session_pid=self._session[0] if self._session else None)
                    conn.close()
                    if once:
                        raise UserError(
                            f"lost the source {redact(self.config.require_source())} during "
                            f"a --once run ({first_line(exc)}); nothing was advanced past "
                            f"bronze's last commit: rerun it, or run `lakecdc ship`, which "
                            f"reconnects by itself.") from None
                    reconnected = self._reconnect(stop, exc)
                    if reconnected is None:
                        break                           # stopped while waiting
                    conn, progress = reconnected
                    continue
                self._report(totals)
                if result.full or again:
                    continue
                if once:
                    break
                # Peeks begin every poll interval (at once when the last one took longer).
                stop.wait(max(0.0, self.config.poll_interval_s - (time.monotonic() - began)))
        finally:
            release(conn, ship_lock_name(self.config.slot))
            conn.close()
            totals.heartbeats, totals.reconnects = self.heartbeat.sent, self.reconnects
        return totals

    def _with_events(self, result: ShipBatch) -> ShipBatch:
        """``result`` with the heartbeats and reconnects not yet reported downstream."""
        heartbeats, reconnects = self._reported
        self._reported = (self.heartbeat.sent, len(self.reconnect_reasons))
        return replace(result, heartbeats=self.heartbeat.sent - heartbeats,
                       reconnects=tuple(self.reconnect_reasons[reconnects:]))

    def _step(self, conn: psycopg.Connection, progress: Progress, once: bool
              ) -> tuple[ShipBatch, Progress]:
        """Watch the slot, send a heartbeat if one is due, ship one batch.

        No peek while the source has flushed no WAL since a peek that found nothing: a peek
        decodes what is flushed when it starts, so it would find nothing again. It would
        still cost the server a decode from the slot's ``restart_lsn``, which stays where
        a burst of changes began until a running-transactions record is passed, so an idle
        shipper after a burst kept one of the source's cores busy (docs/operations.md,
        "Idle after a burst")."""
        state = slots.slot_state(conn, self.config.slot)
        self.watch(state, progress)
        if not once and self.heartbeat.due(state.lag_bytes, self._last_progress_commit):
            self._send_heartbeat(conn, state)
            self._drained_at = None
        if not once and state.flush_lsn is not None and state.flush_lsn == self._drained_at:
            return self._done(ShipBatch(0, 0, 0, False, False, 0.0, started_at=time.time()),
                              progress)
        result, progress = self.ship_batch(conn, progress, force_progress=once)
        self._drained_at = state.flush_lsn if result.peek_rows == 0 else None
        return result, progress

    def _send_heartbeat(self, conn: psycopg.Connection, state: slots.SlotState) -> None:
        lsn = heartbeats.emit(conn, self.config.slot)
        self.heartbeat.sent_one(lsn)
        log.debug("heartbeat at %s (slot %s lag %s)", fmt(lsn), self.config.slot,
                  byte_size(state.lag_bytes))

    def _heartbeat_after_drain(self, conn: psycopg.Connection) -> bool:
        """``--once``: after draining, one heartbeat if the WAL is still far ahead of the
        slot (writes elsewhere in the cluster), so a scheduled run releases it too."""
        if not self.heartbeat.enabled or self.heartbeat.sent:
            return False
        state = slots.slot_state(conn, self.config.slot)
        if state is None or (state.lag_bytes or 0) < self.heartbeat.min_lag_bytes:
            return False
        self._send_heartbeat(conn, state)
        return True

    def _reconnect(self, stop: threading.Event, exc: Exception
                   ) -> tuple[psycopg.Connection, Progress] | None:
        """Reconnect with exponential backoff until it works or ``stop`` is set (None).
        Anything but the source being unreachable is raised: a slot lost or a failover
        while disconnected stops the shipper with its recovery command."""
        dsn = redact(self.config.require_source())
        reason = reconnect_reason(exc)
        started = time.monotonic()
        delay = min(RETRY_FIRST_S, self.config.reconnect_max_backoff_s)
        attempt, last = 0, exc
        while True:
            attempt += 1
            log.warning("source %s unreachable (%s); reconnect attempt %d in %.1fs", dsn,
                        first_line(last), attempt, delay)
            if stop.wait(delay):
                return None
            try:
                conn, progress = self.open(reconnecting=True)
            except Exception as err:
                if not transient(err, None):
                    raise
                last = err
                delay = min(delay * 2, self.config.reconnect_max_backoff_s)
                continue
            self.reconnects += 1
            self.reconnect_reasons.append(reason)
            log.info("reconnected to the source after %d attempt(s) in %.1fs (session lost: "
                     "%s); bronze holds up to %s", attempt, time.monotonic() - started,
                     reason, fmt(progress.commit_lsn))
            return conn, progress
