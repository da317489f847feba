"""Make identity columns NOT NULL without an outage (``lakecdc setup --online-not-null``).

``ALTER COLUMN … SET NOT NULL`` alone holds an ACCESS EXCLUSIVE lock while it scans the whole
table: on a table of hundreds of millions of rows, minutes without writes. The online path,
per column (docs/source-tables.md):

1. ``ADD CONSTRAINT lakecdc_nn_<col> CHECK (<col> IS NOT NULL) NOT VALID`` - a brief lock,
   no scan; new rows are checked from here on;
2. ``VALIDATE CONSTRAINT`` - scans under SHARE UPDATE EXCLUSIVE, which writers pass;
3. ``ALTER COLUMN <col> SET NOT NULL`` - Postgres >= 12 proves it from the valid check, no
   scan, a brief lock;
4. ``DROP CONSTRAINT`` - a brief lock.

The brief locks are still ACCESS EXCLUSIVE, and a lock request queues behind a long
transaction that reads the table - with every writer then queued behind *it*. So each
statement runs with a short ``lock_timeout`` and is retried after a pause: a writer waits at
most about that timeout, never for the long transaction. Every step is idempotent, so an
interrupted run is simply run again.
"""

from __future__ import annotations

import time
from typing import Callable

import psycopg
from psycopg import sql

from core.errors import UserError


def constraint_name(column: str) -> str:
    return f"lakecdc_nn_{column}"[:63]


def statements(table: str, column: str) -> list[sql.Composed]:
    """The four statements of the online path for one column, in order."""
    schema, name = table.split(".", 1)
    t, c, k = sql.Identifier(schema, name), sql.Identifier(column), \
        sql.Identifier(constraint_name(column))
    return [
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({} IS NOT NULL) NOT VALID").format(
            t, k, c),
        sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(t, k),
        sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET NOT NULL").format(t, c),
        sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(t, k),
    ]


def make_not_null(conn: psycopg.Connection, table: str, columns: list[str], *,
                  lock_timeout_ms: int = 500, attempts: int = 120,
                  echo: Callable[[str], None] | None = None) -> None:
    """Run the online path for each of ``columns`` on an autocommit connection."""
    schema, name = table.split(".", 1)
    for column in columns:
        exists = conn.execute(
            "SELECT 1 FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND k.conname = %s",
            [schema, name, constraint_name(column)]).fetchone()
        steps = statements(table, column)
        for step in steps[1:] if exists else steps:
            if echo is not None:
                echo(step.as_string(conn))
            try:
                _run(conn, step, table, lock_timeout_ms, attempts)
            except psycopg.errors.CheckViolation:
                # Leave the table as it was: no NOT VALID check behind.
                _run(conn, steps[3], table, lock_timeout_ms, attempts)
                raise UserError(f"column {column} of {table} holds NULLs, so it cannot be "
                                "made NOT NULL: fill them in (or delete those rows), then "
                                "rerun `lakecdc setup --online-not-null`.") from None


def _run(conn: psycopg.Connection, statement: sql.Composed, table: str,
         lock_timeout_ms: int, attempts: int) -> None:
    for attempt in range(attempts):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(
                    sql.Literal(f"{lock_timeout_ms}ms")))
                conn.execute(statement)
            return
        except psycopg.errors.LockNotAvailable:
            time.sleep(min(5.0, 0.2 * (attempt + 1)))
        except psycopg.errors.InsufficientPrivilege:
            raise UserError(f"changing {table} needs the table's owner: "
                            "run `lakecdc setup --online-not-null` once as the owner.") from None
    raise UserError(f"could not take the brief lock on {table} for {attempts} tries of "
                    f"{lock_timeout_ms} ms (a long transaction holds it): rerun `lakecdc "
                    "setup --online-not-null` when it has ended; nothing is half-done.")
