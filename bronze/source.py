"""Checks and preparation of the source database: each problem a person can fix becomes one
``UserError`` sentence saying what to do.

- ``check_source``: ``wal_level``, REPLICATION privilege, captured tables present;
  ``check_plugin``: wal2json loads (setup checks it before changing anything).
- ``identity_problem`` / ``ensure_replica_identity``: a counted table's replica identity must
  supply the old dims on UPDATE and DELETE; setup creates a unique index on the identity
  columns and sets ``REPLICA IDENTITY USING INDEX`` (the columns must be NOT NULL; FULL is
  the fallback). Any other captured table needs an identity that names the changed row (a
  primary key, ``USING INDEX`` or ``FULL``); setup never changes it. The shipper refuses to
  run when a table's identity falls short, rather than ship changes it cannot place.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from core.captured import IDENTITY_COLUMNS, identity_index_name
from core.errors import UserError


def check_source(conn: psycopg.Connection, tables: tuple[str, ...]) -> None:
    wal_level = conn.execute("SHOW wal_level").fetchone()[0]
    if wal_level != "logical":
        raise UserError(f"the source has wal_level = {wal_level}; set wal_level = logical "
                        "(ALTER SYSTEM SET wal_level = logical) and restart Postgres.")
    check_replication_role(conn)
    db = conn.execute("SELECT current_database()").fetchone()[0]
    for table in tables:
        if conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is None:
            raise UserError(f"captured table {table} does not exist in database {db}; "
                            "create it or fix LAKECDC_TABLES.")


def check_replication_role(conn: psycopg.Connection) -> None:
    """The connecting role may use replication slots (REPLICATION or superuser)."""
    user, can_replicate = conn.execute(
        "SELECT current_user, rolreplication OR rolsuper FROM pg_roles "
        "WHERE rolname = current_user").fetchone()
    if not can_replicate:
        raise UserError(f"role {user} cannot use replication slots; as a superuser run "
                        f"ALTER ROLE {user} REPLICATION (see infra/postgres/roles.sql).")


PLUGIN_MISSING = ("the wal2json output plugin is not installed on the source server: install "
                  "it (Debian: apt-get install postgresql-15-wal2json) and rerun `lakecdc "
                  "setup`.")


def raise_if_plugin_missing(exc: psycopg.Error) -> None:
    """Turn the server's "could not access file" for wal2json into ``PLUGIN_MISSING``."""
    if isinstance(exc, psycopg.errors.UndefinedFile) or "could not access file" in str(exc):
        raise UserError(PLUGIN_MISSING) from None


def check_plugin(conn: psycopg.Connection, probe_timeout_s: float = 5.0) -> None:
    """wal2json loads on the source, checked before setup changes anything.

    A TEMPORARY slot is created and dropped: Postgres loads the output plugin before it
    waits for running transactions to build the slot's snapshot, so a missing plugin fails
    at once, and the wait itself is cut short by a statement timeout (which proves the
    plugin loaded). A temporary slot never outlives its session.
    """
    probe = f"lakecdc_probe_{conn.info.backend_pid}"
    conn.execute(sql.SQL("SET statement_timeout = {}").format(
        sql.Literal(f"{int(probe_timeout_s * 1000)}ms")))
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json', true)", [probe])
        conn.execute("SELECT pg_drop_replication_slot(%s)", [probe])
    except psycopg.errors.QueryCanceled:
        pass                                   # loaded; waiting for running transactions
    except psycopg.Error as exc:
        raise_if_plugin_missing(exc)
        raise
    finally:
        conn.execute("RESET statement_timeout")


def _split(table: str) -> tuple[str, str]:
    schema, name = table.split(".", 1)
    return schema, name


def identity_problem(conn: psycopg.Connection, table: str, counted: bool = True) -> str | None:
    """Why ``table``'s replica identity cannot do its job, or None if it can: for a counted
    table, supply the old dims; for any other, identify the row an UPDATE or DELETE
    changed (a primary key, ``USING INDEX`` or ``FULL``)."""
    schema, name = _split(table)
    ident = conn.execute("""
        SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s""", [schema, name]).fetchone()
    if ident is None:
        return f"table {table} does not exist"
    kind = ident[0]
    if kind == "f":
        return None
    if kind == "n":
        return f"table {table} has REPLICA IDENTITY NOTHING"
    # 'i': the index chosen with USING INDEX; 'd': the primary key.
    cols = {r[0] for r in conn.execute("""
        SELECT a.attname FROM pg_index i
        JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE n.nspname = %s AND c.relname = %s
          AND CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END""",
        [schema, name, kind])}
    if not counted:
        return None if cols else (f"table {table} has no primary key, so its UPDATE and "
                                  "DELETE would not say which row they changed")
    missing = [c for c in IDENTITY_COLUMNS if c not in cols]
    if missing:
        return (f"the replica identity of {table} lacks {', '.join(missing)}, so UPDATE and "
                "DELETE would not carry the old counts")
    return None


def require_identity(conn: psycopg.Connection, tables: tuple[str, ...],
                     counted: tuple[str, ...]) -> None:
    """Every captured table's identity does its job (``identity_problem``); ``counted``:
    the tables service_stats counts."""
    for table in tables:
        problem = identity_problem(conn, table, table in counted)
        if problem and table in counted:
            raise UserError(f"{problem}; run `lakecdc setup` to set REPLICA IDENTITY USING "
                            f"INDEX on ({', '.join(IDENTITY_COLUMNS)}), or ALTER TABLE "
                            f"{table} REPLICA IDENTITY FULL.")
        if problem:
            raise UserError(f"{problem}; {_ROW_IDENTITY_FIX.format(table=table)}")


_ROW_IDENTITY_FIX = ("give it a primary key (with the default replica identity), or ALTER "
                     "TABLE {table} REPLICA IDENTITY FULL (or USING INDEX a unique index on "
                     "NOT NULL columns), or stop capturing it (LAKECDC_TABLES)")


def identity_blocker(conn: psycopg.Connection, table: str, counted: bool = True) -> str | None:
    """Why setup cannot go on with ``table``, or None. A counted table must get (or have)
    the dims identity index; any other table must already identify its rows: setup changes
    nothing of it. Reads only: setup checks every captured table with this before it
    changes any of them."""
    problem = identity_problem(conn, table, counted)
    if problem is None:
        return None
    if not counted:
        return f"captured {problem}: {_ROW_IDENTITY_FIX.format(table=table)}; nothing was changed."
    schema, name = _split(table)
    columns = dict(conn.execute("""
        SELECT a.attname, a.attnotnull FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
        """, [schema, name]).fetchall())
    missing = [c for c in IDENTITY_COLUMNS if c not in columns]
    if missing:
        return (f"counted table {table} has no column(s) {', '.join(missing)}, which "
                f"lakecdc counts by ({', '.join(IDENTITY_COLUMNS)}); count only tables of "
                "that shape (LAKECDC_NOTIFICATIONS_TABLE, LAKECDC_HISTORY_TABLE), and "
                "nothing was changed.")
    nullable = [c for c in IDENTITY_COLUMNS if not columns[c]]
    if nullable:
        return (f"column(s) {', '.join(nullable)} of {table} allow NULL, so they cannot form "
                "the replica identity index; make them NOT NULL without blocking writers "
                "with `lakecdc setup --online-not-null` (docs/source-tables.md), or run "
                f"ALTER TABLE {table} REPLICA IDENTITY FULL (more WAL), then rerun setup.")
    return None


def nullable_identity_columns(conn: psycopg.Connection, table: str) -> list[str]:
    """The identity columns of ``table`` that allow NULL."""
    schema, name = _split(table)
    return [r[0] for r in conn.execute("""
        SELECT a.attname FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND a.attname = ANY(%s) AND NOT a.attnotnull
        ORDER BY a.attnum""", [schema, name, list(IDENTITY_COLUMNS)])]


def ensure_replica_identity(conn: psycopg.Connection, table: str) -> bool:
    """Make the identity cover the dims; returns True if anything was changed.

    Builds the index ``CONCURRENTLY`` so writers are not blocked; a leftover invalid index
    from an interrupted build is dropped and rebuilt. Call ``identity_blocker`` for every
    table first: this raises its sentence too, but only for the table at hand.
    """
    blocker = identity_blocker(conn, table)
    if blocker:
        raise UserError(blocker)
    if identity_problem(conn, table) is None:
        return False
    schema, name = _split(table)
    index = identity_index_name(table)
    valid = conn.execute("""
        SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s""", [schema, index]).fetchone()
    try:
        if valid is not None and not valid[0]:
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY {}")
                         .format(sql.Identifier(schema, index)))
        conn.execute(sql.SQL("CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(index), sql.Identifier(schema, name),
            sql.SQL(", ").join(map(sql.Identifier, IDENTITY_COLUMNS))))
        conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY USING INDEX {}").format(
            sql.Identifier(schema, name), sql.Identifier(index)))
    except psycopg.errors.InsufficientPrivilege:
        raise UserError(f"setting the replica identity of {table} needs its owner: run "
                        "`lakecdc setup` once as the table owner (or a superuser).") from None
    return True


def mirror_key(conn: psycopg.Connection, table: str) -> tuple[list[tuple[str, str]], list[str]]:
    """A captured table's columns (name, type as wal2json names it: ``format_type`` with the
    typmod), in attribute order, and the key its mirror is kept by: the primary key when the
    replica identity carries it (default, ``FULL``, or a ``USING INDEX`` index covering it),
    else the identity index's columns. No key: an empty list (``FULL`` without a primary
    key: rows may repeat, so no mirror can be kept by key)."""
    schema, name = _split(table)
    oid, ident = conn.execute("""
        SELECT c.oid::int8, c.relreplident FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s""", [schema, name]).fetchone()
    columns = [(r[0], r[1]) for r in conn.execute("""
        SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
        WHERE a.attrelid = %s::int8::oid AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum""", [oid])]

    def index_columns(which: str) -> list[str]:
        return [r[0] for r in conn.execute(sql.SQL("""
            SELECT a.attname FROM pg_index i
            JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = %s::int8::oid AND i.{}
            ORDER BY array_position(i.indkey::int2[], a.attnum)""").format(
                sql.Identifier(which)), [oid])]

    primary = index_columns("indisprimary")
    if ident == "i":
        carried = index_columns("indisreplident")
        return columns, primary if primary and set(primary) <= set(carried) else carried
    return columns, primary
