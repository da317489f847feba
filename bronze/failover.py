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

And the slot itself, checked by the shipper (``bronze.ship``) at start and with every batch:
missing (``slot_missing``), invalidated (``slot_lost``), or ahead of bronze (``slot_ahead``).
Recovery commands are in the messages; the runbook is ``docs/failover.md``.
"""

from __future__ import annotations

import psycopg

from bronze.slot import SlotState
from bronze.table import Progress, SourceIdentity
from core.errors import UserError
from core.lsn import fmt

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
