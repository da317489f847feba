"""Every connection lakecdc makes to Postgres (source and dashboard).

``open_connection``: a malformed DSN is one fixed sentence (libpq's own parse errors echo
the password), and a session's ``search_path`` is pinned to ``public``; ``connect`` adds the
sentence for a server that cannot be reached (``Unreachable``). ``emit_message``: the one
way lakecdc writes a logical message into the WAL.
"""

from __future__ import annotations

import psycopg

from core.errors import UserError, last_line, redact


class Unreachable(UserError):
    """The server did not answer (down, restarting, network): a loop that has worked
    before may retry; at start-up it is a configuration problem like any other."""


def open_connection(dsn: str, what: str = "source", **kwargs) -> psycopg.Connection:
    """An autocommit connection. A DSN libpq cannot parse is refused with a fixed sentence:
    libpq's message quotes the text around the fault, which may be the password. Outside
    the replication protocol the session's ``search_path`` is ``public`` (``pg_catalog``
    is always searched first): a schema named after the role cannot shadow the tables
    lakecdc names unqualified. Connection failures are raised as psycopg's."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10, **kwargs)
    except psycopg.ProgrammingError:
        raise UserError(f"the {what} DSN is not a valid connection string (libpq could not "
                        "parse it; its message is not shown, as it may quote the password); "
                        "use postgresql://user@host:port/dbname, with special characters "
                        "in the password percent-encoded.") from None
    if "replication" not in kwargs:
        conn.execute("SET search_path = public")
    return conn


def connect(dsn: str, what: str = "source", **kwargs) -> psycopg.Connection:
    """``open_connection``, with a server that cannot be reached as ``Unreachable``."""
    try:
        return open_connection(dsn, what, **kwargs)
    except psycopg.OperationalError as exc:
        raise Unreachable(f"cannot connect to the {what} database {redact(dsn)}: "
                        f"{last_line(exc)}; check the DSN, that the server is up and "
                        "that pg_hba.conf admits this client.") from None


def emit_message(conn: psycopg.Connection, prefix: str, content: str) -> int:
    """Commit one transactional logical message (``pg_logical_emit_message``; ``conn`` is in
    autocommit): heartbeats, backfill watermarks, verify's markers. Returns the message's
    LSN; its transaction's commit LSN is just past it. Needs EXECUTE on the function, which
    ``infra/postgres/roles.sql`` grants to lakecdc's role alone (docs/security.md)."""
    row = conn.execute("SELECT (pg_logical_emit_message(true, %s, %s) - '0/0'::pg_lsn)::bigint",
                       [prefix, content]).fetchone()
    return int(row[0])


def table_rows(conn: psycopg.Connection, table: str) -> int | None:
    """The planner's estimate of ``table``'s rows (``reltuples``: what the last ANALYZE or
    VACUUM saw), None before the first one: a progress total, never a count."""
    schema, name = table.split(".", 1)
    row = conn.execute("SELECT c.reltuples::int8 FROM pg_class c JOIN pg_namespace n ON "
                       "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                       [schema, name]).fetchone()
    return int(row[0]) if row and row[0] >= 0 else None
