"""The proof of concept lakecdc grew from, as a baseline: counters kept inside Postgres.

Per tick, all in SQL on the source:

1. peek at most ``TICK_CHANGES`` (10k) rows of its own wal2json slot (format-version 2,
   the captured tables only);
2. turn every change into ±1 on ``(service_id, template_id, notification_type,
   notification_status)``: +1 on the new row of an INSERT; −1 on the old row and +1 on the
   new row of an UPDATE whose old row (wal2json's ``identity``) carries the dims; −1 on the
   old row of such a DELETE. An UPDATE without them counts 0 (right when no key column
   changed) and a DELETE without them is skipped -
   silently, as the PoC did. Under the default replica identity (the primary key) that
   means every status change and every delete is lost;
3. ``INSERT … ON CONFLICT DO UPDATE SET count = GREATEST(0, count + delta)`` into its
   counter table (the clamp hides a count going negative) and commit;
4. ``pg_replication_slot_advance`` to the last peeked LSN (after the commit: a crash in
   between would count the tick twice - the PoC had no record of progress).

It does not tell the two tables apart (a history purge would count −1) and never checks
the replica identity. Its drift is measured against the same ``GROUP BY`` lakecdc is
checked against (``pipelines.source.truth``). Identifiers are quoted with ``psycopg.sql``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from bench import numbers
from bench.counts import compare, truth
from bench.decode import drop_slot
from core.captured import DIMS
from core.config import Config

TICK_CHANGES = 10_000
COUNTER_TABLE = "poc_service_stats"


@dataclass
class PocRun:
    changes: int = 0          # change rows (I/U/D) seen
    ticks: int = 0
    seconds: float = 0.0


def create(dsn: str, slot: str, table: str = COUNTER_TABLE) -> None:
    """The PoC's slot and counter table (dims as text, like the dashboard's)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ({}, count bigint NOT NULL, PRIMARY KEY ({}))"
        ).format(sql.Identifier(table),
                 sql.SQL(", ").join(sql.SQL("{} text NOT NULL").format(sql.Identifier(c))
                                    for c in DIMS),
                 sql.SQL(", ").join(map(sql.Identifier, DIMS))))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", [slot])


def _dims(obj: str) -> sql.Composable:
    """The four dims of a change as text columns, from a name → value object."""
    return sql.SQL(", ").join(sql.SQL("{o}->>{c} AS {a}").format(
        o=sql.Identifier(obj), c=sql.Literal(c), a=sql.Identifier(c)) for c in DIMS)


def _tick_sql(slot: str, tables: tuple[str, ...], table: str) -> sql.Composed:
    dims = sql.SQL(", ").join(map(sql.Identifier, DIMS))
    attributable = sql.SQL(" AND ").join(
        sql.SQL("{} IS NOT NULL").format(sql.Identifier(c)) for c in DIMS)
    # Deltas are summed per key first (ON CONFLICT may touch a row once per statement), so
    # the clamp applies per key and tick, as the PoC's did.
    return sql.SQL("""
WITH peeked AS (
    SELECT lsn, data::jsonb AS j
    FROM pg_logical_slot_peek_changes({slot}, NULL, {n}, 'format-version', '2',
                                      'include-lsn', '1', 'add-tables', {tables})),
changes AS (
    SELECT j->>'action' AS action,
           (SELECT jsonb_object_agg(e->>'name', e->'value')
            FROM jsonb_array_elements(j->'columns') e) AS new_row,
           (SELECT jsonb_object_agg(e->>'name', e->'value')
            FROM jsonb_array_elements(j->'identity') e) AS old_row
    FROM peeked WHERE j->>'action' IN ('I', 'U', 'D')),
signed AS (
    SELECT {new_dims}, 1 AS delta FROM changes
    WHERE action = 'I' OR (action = 'U' AND old_row ?& {dim_names})
    UNION ALL
    SELECT {old_dims}, -1 FROM changes WHERE action IN ('U', 'D') AND old_row ?& {dim_names}),
summed AS (SELECT {dims}, sum(delta) AS delta FROM signed WHERE {attributable}
           GROUP BY {dims}),
upserted AS (
    INSERT INTO {table} AS t ({dims}, count)
    SELECT {dims}, GREATEST(0, delta) FROM summed
    ON CONFLICT ({dims}) DO UPDATE
        SET count = GREATEST(0, t.count + (SELECT s.delta FROM summed s WHERE {same}))
    RETURNING 1)
SELECT (SELECT count(*) FROM changes), (SELECT max(lsn) FROM peeked),
       (SELECT count(*) FROM upserted)""").format(
        slot=sql.Literal(slot), n=sql.Literal(TICK_CHANGES),
        tables=sql.Literal(",".join(tables)), dim_names=sql.Literal(list(DIMS)),
        new_dims=_dims("new_row"),
        old_dims=_dims("old_row"), table=sql.Identifier(table), dims=dims,
        attributable=attributable,
        same=sql.SQL(" AND ").join(sql.SQL("s.{c} = t.{c}").format(c=sql.Identifier(c))
                                   for c in DIMS))


def run(dsn: str, slot: str, tables: tuple[str, ...], table: str = COUNTER_TABLE) -> PocRun:
    """Tick until the slot is drained; returns what it saw and how long it took."""
    result = PocRun()
    tick = _tick_sql(slot, tables, table)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            with conn.transaction():
                changes, last_lsn, _ = conn.execute(tick).fetchone()
            if last_lsn is None:
                break
            conn.execute("SELECT pg_replication_slot_advance(%s, %s)", [slot, last_lsn])
            result.changes += changes
            result.ticks += 1
    result.seconds = time.perf_counter() - started
    return result


def counts(dsn: str, table: str = COUNTER_TABLE) -> dict[tuple, int]:
    with psycopg.connect(dsn) as conn:
        return {tuple(r[:4]): r[4] for r in conn.execute(sql.SQL(
            "SELECT {}, count FROM {}").format(sql.SQL(", ").join(map(sql.Identifier, DIMS)),
                                               sql.Identifier(table)))}


def measured(config: Config, slot: str) -> dict:
    """The proof of concept over the backlog from its slot ``slot``, and its counts against
    the source's."""
    done = run(config.source_dsn, slot, config.tables)
    drop_slot(config.source_dsn, slot)
    return {"seconds": round(done.seconds, 2), "ticks": done.ticks, "changes": done.changes,
            "changes_per_s": numbers.rate(done.changes, done.seconds),
            **compare(counts(config.source_dsn), truth(config.source_dsn))}
