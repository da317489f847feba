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

A missing slot is checked by the shipper (``bronze.ship``). Recovery commands are in the
messages; the runbook is ``docs/failover.md``.
"""

from __future__ import annotations

import psycopg

from bronze.table import SourceIdentity
from pipelines.errors import UserError
from pipelines.lsn import fmt

REBASELINE = ("run `lakecdc setup --rebaseline`, then `lakecdc backfill rebuild-gold`, then "
              "`lakecdc verify` (runbook: docs/failover.md)")
NEW_LAKEHOUSE = ("point LAKECDC_LAKEHOUSE at a new location and run `lakecdc setup`, then "
                 "`lakecdc run` (the old lakehouse keeps the abandoned history; runbook: "
                 "docs/failover.md).")


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
