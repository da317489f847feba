"""Is the source still the history bronze was built from? (failover, restore; F19)

Bronze's keys are commit LSNs of one WAL history. Three ways the source can stop being
that history, each checked before the shipper reads anything:

- a different cluster (system identifier): restored from a logical dump, or pointed at the
  wrong server;
- a new timeline of the same cluster: a standby was promoted (failover) or the cluster was
  recovered to a point in time; on Postgres 15 logical slots are not carried over, and the
  changes after the switch point on the old timeline are gone;
- a WAL position behind what bronze already holds: the cluster was restored to an earlier
  point (PITR, a snapshot of the disk); the LSNs bronze holds will be reused by different
  transactions.

And the slot itself, checked by the shipper (``bronze.ship``) at start and with every batch
(``SlotWatch``): missing (``slot_missing``), invalidated (``slot_lost``), or ahead of bronze
(``slot_ahead``).
Recovery commands are in the messages; the runbook is ``docs/failover.md``.
"""

from __future__ import annotations

import logging
import time

import psycopg

from bronze.slot import SlotState
from bronze.table import Progress, SourceIdentity
from core.errors import UserError
from core.lsn import fmt
from core.units import byte_size

log = logging.getLogger("lakecdc.ship")

# wal_status alerts repeat with every batch, at most this often.
ALERT_REPEAT_S = 5.0

REBASELINE = ("run `lakecdc setup --rebaseline`, then `lakecdc backfill rebuild-gold`, then "
              "`lakecdc verify` (runbook: docs/failover.md)")
NEW_LAKEHOUSE = ("point LAKECDC_LAKEHOUSE at a new location, run `lakecdc setup` and `lakecdc "
                 "stream --once`, switch the dashboard to the new gold with `lakecdc push "
                 "--once --take-over`, then `lakecdc run` (the old lakehouse keeps the "
                 "abandoned history; runbook: docs/failover.md).")


def check_same_history(conn: psycopg.Connection, ident: SourceIdentity, bronze_end: int,
                       system_id: str, timeline: int) -> None:
    """Raise ``UserError`` with the recovery commands if the source left bronze's history."""
    if ident.system_identifier and system_id != ident.system_identifier:
        raise UserError(f"the source is a different Postgres cluster (system identifier "
                        f"{system_id}, bronze was built from {ident.system_identifier}): "
                        f"{REBASELINE}; if setup says the new cluster's WAL is behind "
                        f"bronze, {NEW_LAKEHOUSE}")
    current = int(conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
                  .fetchone()[0])
    if current < bronze_end:
        raise UserError(f"the source's WAL is at {fmt(current)}, behind what bronze already "
                        f"holds ({fmt(bronze_end)}): it was restored to an earlier point, and "
                        f"those LSNs will be reused by other transactions; {NEW_LAKEHOUSE}")
    if ident.timeline and timeline != ident.timeline:
        raise UserError(f"the source is on timeline {timeline}, bronze was built on timeline "
                        f"{ident.timeline}: a standby was promoted or the cluster was "
                        f"recovered, and the slot's changes after the switch are lost; "
                        f"{REBASELINE}.")


def slot_missing(slot: str, progress: Progress) -> UserError:
    return UserError(f"replication slot {slot} does not exist (dropped, or lost in a "
                     f"failover); bronze holds changes up to {fmt(progress.end_lsn)}: "
                     f"{REBASELINE}.")


def slot_lost(slot: str, state: SlotState, progress: Progress) -> UserError:
    return UserError(f"replication slot {slot} was invalidated (wal_status={state.wal_status}"
                     f"): it retained more WAL than max_slot_wal_keep_size = "
                     f"{state.max_slot_wal_keep_size} and the source removed WAL it still "
                     f"needed, so changes after bronze's {fmt(progress.end_lsn)} are lost to "
                     f"lakecdc; the slot was left as it is (lakecdc never recreates it "
                     f"silently): {REBASELINE}.")


def slot_ahead(slot: str, state: SlotState, progress: Progress) -> UserError | None:
    """The slot was advanced past what bronze recorded, or recreated, outside lakecdc."""
    if state.confirmed_flush_lsn is None or state.confirmed_flush_lsn <= progress.end_lsn:
        return None
    return UserError(f"replication slot {slot} is at {fmt(state.confirmed_flush_lsn)}, past "
                     f"bronze's {fmt(progress.end_lsn)}: it was advanced or recreated outside "
                     f"lakecdc and changes may be lost; {REBASELINE}.")


class SlotWatch:
    """The slot, read with every batch: a stop with its recovery command when it is gone,
    invalidated or moved by someone else; an alert while its WAL is no longer reserved
    (``wal_status``)."""

    def __init__(self, slot: str) -> None:
        self.slot = slot
        self._wal_status: str | None = None
        self._alerted_at = 0.0

    def __call__(self, state: SlotState | None, progress: Progress) -> None:
        slot = self.slot
        if state is None:
            raise slot_missing(slot, progress)
        if state.invalidated:
            raise slot_lost(slot, state, progress)
        if (ahead := slot_ahead(slot, state, progress)) is not None:
            raise ahead
        status, now = state.wal_status, time.monotonic()
        if status == "unreserved":
            if self._wal_status != status or now - self._alerted_at >= ALERT_REPEAT_S:
                self._alerted_at = now
                log.warning(
                    "ALERT slot %s wal_status=unreserved: lag %s, it retains %s of WAL, more "
                    "than max_slot_wal_keep_size = %s; the next checkpoint invalidates it and "
                    "then only a re-baseline recovers; let the shipper catch up, or raise "
                    "max_slot_wal_keep_size now (docs/operations.md)", slot,
                    byte_size(state.lag_bytes), byte_size(state.retained_bytes),
                    state.max_slot_wal_keep_size)
        elif status == "extended" and self._wal_status != status:
            log.warning("slot %s wal_status=extended: it retains %s of WAL, more than "
                        "max_wal_size (lag %s; %s more before max_slot_wal_keep_size = %s)",
                        slot, byte_size(state.retained_bytes), byte_size(state.lag_bytes),
                        byte_size(state.safe_wal_size), state.max_slot_wal_keep_size)
        elif status == "reserved" and self._wal_status in ("extended", "unreserved"):
            log.info("slot %s wal_status=reserved again (lag %s)", slot,
                     byte_size(state.lag_bytes))
        self._wal_status = status
