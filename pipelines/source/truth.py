"""Ground truth of ``service_stats`` read straight from the source (docs/gold.md).

``count`` = notifications ever created, in their latest status, across the two counted
tables (``Config.counted``, schema-qualified): a ``GROUP BY`` of the dims over both. Rows
purged from history since the baseline are not in it; callers that purge must add them back.

``count_truth`` counts in primary-key chunks inside the caller's transaction (give it a
REPEATABLE READ transaction on an exported snapshot to count at a slot's consistent point):
memory is bounded by the number of keys, never the rows; MVCC means writers are never
blocked; and each chunk reports progress, so a count over hundreds of millions of rows
shows how far it got.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import psycopg
from psycopg import sql

from core.captured import DIMS, CountedTables
from core.postgres import table_rows

Key = tuple[str, str, str, str]

CHUNK_ROWS = 250_000


def _ident(table: tuple[str, str]) -> sql.Identifier:
    return sql.Identifier(*table)


def truth_sql(tables: CountedTables) -> sql.Composed:
    """The ``GROUP BY`` of the dims over both counted tables (schema-qualified)."""
    dims = sql.SQL(", ").join(sql.Identifier(c) for c in DIMS)
    return sql.SQL("""
SELECT service_id::text, template_id::text, notification_type::text,
       notification_status::text, count(*)
FROM (SELECT {dims} FROM {live} UNION ALL SELECT {dims} FROM {history}) AS all_notifications
GROUP BY 1, 2, 3, 4""").format(dims=dims, live=_ident(tables.live),
                               history=_ident(tables.history))


def source_counts(conn: psycopg.Connection, tables: CountedTables) -> dict[Key, int]:
    return {tuple(r[:4]): r[4] for r in conn.execute(truth_sql(tables))}


def estimated_rows(conn: psycopg.Connection, tables: CountedTables) -> int:
    """The planner's row estimate of both tables (for a progress total; never for counts)."""
    return sum(table_rows(conn, ".".join(t)) or 0 for t in tables.both)


def count_truth(conn: psycopg.Connection, tables: CountedTables,
                progress: Callable[[int], None] | None = None,
                chunk_rows: int = CHUNK_ROWS) -> Counter:
    """The truth, counted in ``id`` ranges of ``chunk_rows`` rows in the current transaction.

    ``progress(n)`` is called after each chunk with the rows it counted.
    """
    dims = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(c)) for c in DIMS)
    counts: Counter = Counter()
    for table in tables.both:
        ident = _ident(table)
        boundary = sql.SQL("SELECT id FROM {} WHERE id > %s ORDER BY id OFFSET %s LIMIT 1"
                           ).format(ident)
        first = sql.SQL("SELECT id FROM {} ORDER BY id OFFSET %s LIMIT 1").format(ident)
        group = sql.SQL("SELECT {dims}, count(*) FROM {t} WHERE {cond} GROUP BY 1, 2, 3, 4")
        low = None
        while True:
            high = (conn.execute(first, [chunk_rows - 1]) if low is None
                    else conn.execute(boundary, [low, chunk_rows - 1])).fetchone()
            conds, params = [], []
            if low is not None:
                conds.append(sql.SQL("id > %s"))
                params.append(low)
            if high is not None:
                conds.append(sql.SQL("id <= %s"))
                params.append(high[0])
            cond = sql.SQL(" AND ").join(conds) if conds else sql.SQL("true")
            seen = 0
            for row in conn.execute(group.format(dims=dims, t=ident, cond=cond), params):
                counts[tuple(row[:4])] += row[4]
                seen += row[4]
            if progress is not None:
                progress(seen)
            if high is None:
                break
            low = high[0]
    return counts
