"""The replication slot: bounded peeks, advancing, state, creation.

Operational risk, stated once: a logical slot pins WAL from its ``restart_lsn`` until it is
advanced. If the shipper stops for long, the source's WAL disk fills (or, with
``max_slot_wal_keep_size``, the slot is invalidated and a re-baseline is needed). Every peek
also re-decodes from ``restart_lsn``, so peeks are always bounded (``upto_nchanges`` and a
statement timeout) and the slot is advanced right after each bronze commit. While the
captured tables are idle, heartbeats (``bronze/heartbeat.py``) let it move past WAL written
elsewhere; ``SlotState`` carries what the shipper's ``wal_status`` alerts need. Runbook:
``docs/operations.md``.

``pg_replication_slot_advance`` is not transactional and can go backwards after a crash;
this module never treats the slot position as the record of progress (bronze holds that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import psycopg
from psycopg import sql

from bronze.backfill_marks import BACKFILL_PREFIX
from bronze.heartbeat import PREFIX as HEARTBEAT_PREFIX
from bronze.records import (
    COPY_HEADER_LEN,
    COPY_SIGNATURE,
    PeekColumns,
    decode_copy_rows,
)
from bronze.source import raise_if_plugin_missing
from core.captured import MARKER_PREFIX
from core.lsn import Lsn
from core.postgres import open_connection

# The logical messages lakecdc reads: the snapshot backfill's watermarks and verify's
# markers. wal2json delivers no others (add-msg-prefixes): another application's messages
# never reach bronze, and neither do the shipper's own heartbeats (filter-msg-prefixes,
# kept explicit: their transactions arrive as empty B/C pairs).
MESSAGE_PREFIXES = (BACKFILL_PREFIX, MARKER_PREFIX)

PLUGIN = "wal2json"
CHUNK_BYTES = 16 << 20
# wal2json 2.6+: numbers as JSON strings, NaN and ±Infinity included (2.5 prints those as
# ``null``, and refuses the option: ``prints_numbers_as_text``).
NUMBERS_AS_TEXT = ("numeric-data-types-as-string", "1")


def plugin_options(tables: tuple[str, ...], numbers_as_text: bool = False) -> list[str]:
    """wal2json options, as name/value pairs, shared by the shipper and its witnesses.

    Only ``MESSAGE_PREFIXES`` messages are delivered; the shipper's own heartbeats
    (``bronze/heartbeat.py``) are filtered out: their transactions arrive as empty
    ``B``/``C`` pairs, like those of uncaptured tables."""
    return ["format-version", "2", "include-xids", "1", "include-timestamp", "1",
            "include-lsn", "1",
            "add-tables", ",".join(tables),
            "add-msg-prefixes", ",".join(MESSAGE_PREFIXES),
            "filter-msg-prefixes", HEARTBEAT_PREFIX,
            *(NUMBERS_AS_TEXT if numbers_as_text else ())]


def prints_numbers_as_text(conn: psycopg.Connection, slot: str) -> bool | None:
    """Whether the server's wal2json takes ``numeric-data-types-as-string`` (2.6+); None
    while another session uses ``slot`` (the answer is then the one bronze recorded,
    ``bronze.table.numbers_as_text``).

    A peek with the option that stops after one WAL record (``upto_lsn`` 0/1): wal2json
    reads its options in its start-up callback, before any decoding, and 2.5 refuses an
    unknown one there."""
    option = sql.SQL(", ").join(sql.Literal(o) for o in NUMBERS_AS_TEXT)
    try:
        with conn.transaction():
            conn.execute(sql.SQL("SELECT count(*) FROM pg_logical_slot_peek_changes("
                                 "{}, '0/1', NULL, 'format-version', '2', {})")
                         .format(sql.Literal(slot), option))
    except psycopg.errors.ObjectInUse:
        return None
    except psycopg.errors.InvalidParameterValue as exc:
        if NUMBERS_AS_TEXT[0] in str(exc):
            return False
        raise
    return True


def peek_query(slot: str, tables: tuple[str, ...], upto_nchanges: int,
               numbers_as_text: bool = False) -> sql.Composed:
    """Binary COPY of a bounded peek.

    Per row: its LSN, xid, the commit LSN and time (B rows only, else 0), the action letter,
    and the wal2json text - empty for B and C rows, whose content is folded into the
    columns, so the change rows' text arrives back to back.
    """
    options = sql.SQL(", ").join(sql.Literal(o)
                                 for o in plugin_options(tables, numbers_as_text))
    return sql.SQL("""COPY (
  SELECT (p.lsn - '0/0'::pg_lsn)::bigint,
         p.xid::text::bigint,
         CASE WHEN a.action = 'B'
              THEN ((p.data::json ->> 'lsn')::pg_lsn - '0/0'::pg_lsn)::bigint ELSE 0 END,
         CASE WHEN a.action = 'B'
              THEN (extract(epoch FROM (p.data::json ->> 'timestamp')::timestamptz)
                    * 1000000)::bigint ELSE 0 END,
         ascii(a.action)::int2,
         CASE WHEN a.action IN ('B', 'C') THEN '' ELSE p.data END
  FROM pg_logical_slot_peek_changes({slot}, NULL, {upto}, {options}) AS p,
       LATERAL (SELECT substr(p.data, 12, 1) AS action) AS a
) TO STDOUT (FORMAT binary)""").format(slot=sql.Literal(slot), upto=sql.Literal(upto_nchanges),
                                       options=options)


def peek(conn: psycopg.Connection, slot: str, tables: tuple[str, ...],
         upto_nchanges: int, chunk_bytes: int = CHUNK_BYTES, numbers_as_text: bool = False
         ) -> Iterator[PeekColumns]:
    """Stream one bounded peek as column chunks of about ``chunk_bytes``.

    The slot is not moved. wal2json only cuts between transactions, so one huge transaction
    arrives whole; the chunks keep it out of memory at once.
    """
    rows: list = []
    size = 0
    first = True
    with conn.cursor().copy(peek_query(slot, tables, upto_nchanges,
                                       numbers_as_text)) as copy:
        while row := copy.read():
            if first:
                if bytes(row[:len(COPY_SIGNATURE)]) != COPY_SIGNATURE:
                    raise RuntimeError("peek did not return binary COPY data")
                row = row[COPY_HEADER_LEN:]
                first = False
                if not row:
                    continue
            if len(row) == 2 and bytes(row) == b"\xff\xff":   # trailer; read on to the end
                continue
            rows.append(row)
            size += len(row)
            if size >= chunk_bytes:
                yield decode_copy_rows(rows)
                rows, size = [], 0
    if rows:
        yield decode_copy_rows(rows)


@dataclass(frozen=True)
class SlotState:
    plugin: str
    database: str
    active_pid: int | None
    wal_status: str | None        # reserved | extended | unreserved | lost (PostgreSQL 13+)
    confirmed_flush_lsn: int | None
    restart_lsn: int | None       # NULL once invalidated
    lag_bytes: int | None         # current WAL position - confirmed position
    retained_bytes: int | None = None   # current WAL position - restart_lsn: WAL it pins
    safe_wal_size: int | None = None    # WAL that may still be written before it is
                                        # invalidated (NULL: max_slot_wal_keep_size = -1)
    max_slot_wal_keep_size: str = "-1"  # the server setting, as SHOW prints it
    flush_lsn: int | None = None  # the source's WAL flushed so far: what a peek now decodes

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost" or self.restart_lsn is None


def slot_state(conn: psycopg.Connection, slot: str) -> SlotState | None:
    row = conn.execute("""
        SELECT plugin, database, active_pid, wal_status,
               (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint,
               (restart_lsn - '0/0'::pg_lsn)::bigint,
               (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint,
               (pg_current_wal_lsn() - restart_lsn)::bigint,
               safe_wal_size,
               current_setting('max_slot_wal_keep_size'),
               (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint
        FROM pg_replication_slots WHERE slot_name = %s""", [slot]).fetchone()
    return SlotState(*row) if row else None


def advance(conn: psycopg.Connection, slot: str, lsn: int) -> None:
    """Move the slot's confirmed position to ``lsn`` if it is behind (never backwards)."""
    conn.execute("""
        SELECT pg_replication_slot_advance(slot_name, %(lsn)s::text::pg_lsn)
        FROM pg_replication_slots
        WHERE slot_name = %(slot)s AND confirmed_flush_lsn < %(lsn)s::text::pg_lsn""",
                 {"slot": slot, "lsn": str(Lsn(lsn))})


@dataclass(frozen=True)
class CreatedSlot:
    consistent_point: int
    snapshot_name: str | None


def replication_connection(dsn: str) -> psycopg.Connection:
    return open_connection(dsn, replication="database")


def identify_system(dsn: str) -> tuple[str, int]:
    """(system identifier, timeline) of the source, through the replication protocol."""
    with replication_connection(dsn) as rconn:
        row = rconn.execute("IDENTIFY_SYSTEM").fetchone()
    return str(row[0]), int(row[1])


def create_slot(rconn: psycopg.Connection, slot: str, temporary: bool = False) -> CreatedSlot:
    """Create the logical slot with an exported snapshot on a replication connection.

    The snapshot stays importable (``SET TRANSACTION SNAPSHOT``) while ``rconn`` is open and
    idle, so rows that existed before the slot can be counted at its consistent point. A
    ``temporary`` slot is dropped by the server when ``rconn`` closes (or the session dies),
    so it never pins WAL afterwards.
    """
    try:
        row = rconn.execute(sql.SQL("CREATE_REPLICATION_SLOT {} {}LOGICAL {} EXPORT_SNAPSHOT")
                            .format(sql.Identifier(slot),
                                    sql.SQL("TEMPORARY " if temporary else ""),
                                    sql.Identifier(PLUGIN))).fetchone()
    except psycopg.Error as exc:
        raise_if_plugin_missing(exc)
        raise
    _name, consistent_point, snapshot_name, _plugin = row
    return CreatedSlot(int(Lsn.parse(consistent_point)), snapshot_name)


def drop_slot(conn: psycopg.Connection, slot: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                 "WHERE slot_name = %s", [slot])
