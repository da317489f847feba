"""The snapshot backfill's reads of the source: a table's keyset chunks as wal2json-v2-shaped
JSON built by Postgres, and the LOW/HIGH watermark messages (``bronze.snapshot_backfill``)."""


from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from bronze.backfill_marks import BACKFILL_PREFIX, key_text, key_values
from bronze.source import mirror_key
from core.errors import UserError
from core.postgres import connect, emit_message

log = logging.getLogger("lakecdc.backfill")


READ_TIMEOUT_S = 300               # statement timeout of one chunk's SELECT

# wal2json prints these types as bare JSON numbers (2.5, and 2.6 without
# ``numeric-data-types-as-string``: NaN / ±Infinity as null) or, with that option, as JSON
# strings of their text (NaN and ±Infinity included); booleans as true/false, bytea as its
# hex digits, and every other type as a JSON string of the type's text output (wal2json.c,
# format-version 2).
NUMBER_TYPES = (20, 21, 23, 26, 700, 701, 1700)    # int8 int2 int4 oid float4 float8 numeric
BOOL, BYTEA = 16, 17
NOT_A_NUMBER = ("NaN", "Infinity", "-Infinity")


@dataclass(frozen=True)
class SourceTable:
    name: str                                   # schema.table, as configured
    schema: str
    table: str
    key_columns: tuple[str, ...]                # the mirror's key (``mirror_key``)
    head: str                                   # JSON text before the first column
    columns: tuple[tuple[str, int, str], ...]   # (name, type oid, JSON text before the value)
    estimated_rows: int
    numbers_as_text: bool = False               # as the slot's wal2json prints numbers


def describe_table(conn: psycopg.Connection, name: str, numbers_as_text: bool = False
                   ) -> SourceTable:
    """What ``chunk_query`` needs, from the catalog: the key, the columns (as wal2json
    would list them: every non-dropped column in attribute order, types by ``format_type``)
    and the JSON text around them, escaped by Postgres the way wal2json escapes it."""
    schema, table = name.split(".", 1)
    row = conn.execute("""
        SELECT c.oid::int8, greatest(c.reltuples, 0)::bigint,
               '{"action":"R","schema":' || to_json(n.nspname::text)::text
               || ',"table":' || to_json(c.relname::text)::text || ',"columns":['
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')""",
                       [schema, table]).fetchone()
    if row is None:
        raise UserError(f"captured table {name} does not exist in the source database; "
                        "create it or fix LAKECDC_TABLES.")
    oid, estimate, head = row
    keys = mirror_key(conn, name)[1]
    if not keys:
        raise UserError(f"{name} has no primary key, nor a replica identity index: a keyset "
                        "backfill reads rows in the order of a unique key.")
    columns = tuple(conn.execute("""
        SELECT a.attname, a.atttypid::int8,
               '{"name":' || to_json(a.attname::text)::text || ',"type":'
               || to_json(format_type(a.atttypid, a.atttypmod))::text || ',"value":'
        FROM pg_attribute a
        WHERE a.attrelid = %s::int8::oid AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum""", [oid]).fetchall())
    return SourceTable(name, schema, table, tuple(keys), head, columns, int(estimate),
                       numbers_as_text)


def _value_json(column: str, type_oid: int, numbers_as_text: bool) -> sql.Composable:
    c = sql.SQL("t.{}").format(sql.Identifier(column))
    if type_oid in NUMBER_TYPES and numbers_as_text:
        return sql.SQL("CASE WHEN {c} IS NULL THEN 'null' ELSE to_json({c}::text)::text "
                       "END").format(c=c)
    if type_oid in NUMBER_TYPES:
        return sql.SQL("CASE WHEN {c} IS NULL OR {c}::text IN ('NaN', 'Infinity', '-Infinity') "
                       "THEN 'null' ELSE {c}::text END").format(c=c)
    if type_oid == BOOL:
        return sql.SQL("CASE WHEN {c} IS NULL THEN 'null' WHEN {c} THEN 'true' "
                       "ELSE 'false' END").format(c=c)
    if type_oid == BYTEA:
        return sql.SQL("""CASE WHEN {c} IS NULL THEN 'null' ELSE '"' || encode({c}, 'hex') """
                       """|| '"' END""").format(c=c)
    # format('%s') calls the type's output function, as wal2json does (a cast to text would
    # trim char(n)); num_nulls is NULL-ness of the value itself (IS NULL is true for a
    # composite whose fields are all NULL).
    return sql.SQL("CASE WHEN num_nulls({c}) = 1 THEN 'null' "
                   "ELSE to_json(format('%%s', {c}))::text END").format(c=c)


def chunk_query(source: SourceTable, after: bool) -> sql.Composed:
    """The key's columns as text, then the row as wal2json v2 JSON (action ``R``), in key
    order, after the key ``%(after0)s``, ``%(after1)s``, ... (exclusive, when ``after``), at
    most ``%(limit)s`` rows. A composite key is compared as a row, in its index's order."""
    columns = sql.SQL(" || ',' || ").join(
        sql.SQL("{} || {} || '}}'").format(sql.Literal(prefix),
                                           _value_json(name, oid, source.numbers_as_text))
        for name, oid, prefix in source.columns)
    keys = [sql.SQL("t.{}").format(sql.Identifier(k)) for k in source.key_columns]
    bounds = [sql.Placeholder(f"after{i}") for i in range(len(keys))]
    where = sql.SQL("WHERE ({}) > ({})").format(sql.SQL(", ").join(keys),
                                               sql.SQL(", ").join(bounds))
    return sql.SQL("SELECT {texts}, {head} || {columns} || ']}}' FROM {table} AS t "
                   "{where} ORDER BY {order} LIMIT %(limit)s").format(
        texts=sql.SQL(", ").join(sql.SQL("format('%%s', {})").format(k) for k in keys),
        head=sql.Literal(source.head), columns=columns,
        table=sql.Identifier(source.schema, source.table),
        where=where if after else sql.SQL(""), order=sql.SQL(", ").join(keys))


@dataclass
class Chunk:
    keys: list[str]
    data: list[str]
    in_progress: tuple[int, ...]
    source: SourceTable


def read_chunk(conn: psycopg.Connection, table: str, after: str | None, limit: int,
               numbers_as_text: bool = False) -> Chunk:
    """One short REPEATABLE READ READ ONLY transaction (``conn`` from ``_reader``):

    the table locked against DDL (ACCESS SHARE: writers are not blocked) so the columns
    read from the catalog are the columns selected - a column added or dropped between
    chunks is followed; then, in the transaction's snapshot, the transactions in progress
    (32-bit xids, like wal2json's) and the chunk."""
    schema, name = table.split(".", 1)
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
            sql.Identifier(schema, name)))
        source = describe_table(conn, table, numbers_as_text)
        in_progress = conn.execute(
            "SELECT array(SELECT (x::text::numeric % 4294967296)::bigint "
            "FROM pg_snapshot_xip(pg_current_snapshot()) AS x ORDER BY 1)").fetchone()[0]
        n = len(source.key_columns)
        bounds = key_values(after, n) if after is not None else (None,) * n
        rows = conn.execute(chunk_query(source, after is not None),
                            {"limit": limit, **{f"after{i}": v for i, v in enumerate(bounds)}}
                            ).fetchall()
    return Chunk([key_text(r[:n]) for r in rows], [r[n] for r in rows], tuple(in_progress),
                 source)


def _reader(dsn: str) -> psycopg.Connection:
    conn = connect(dsn)
    conn.execute("SELECT set_config('statement_timeout', %s, false)", [f"{READ_TIMEOUT_S}s"])
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    return conn


def emit_mark(conn: psycopg.Connection, run: str, table: str, chunk: int, mark: str) -> int:
    """Commit a LOW or HIGH watermark message; returns the message's LSN."""
    content = json.dumps({"run": run, "table": table, "chunk": chunk, "mark": mark},
                         separators=(",", ":"))
    return emit_message(conn, BACKFILL_PREFIX, content)
