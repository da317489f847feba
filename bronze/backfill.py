"""``lakecdc backfill snapshot``: the current rows of captured tables into bronze as ``R``
(read) rows, in keyset chunks, while streaming goes on (DBLog / Sequin-style watermarks).

Why: rows that existed before the slot have no INSERT in the WAL. Gold does not need them
(setup's baseline counts them), but silver and anything built on it as a copy of the tables
does. A backfill gives every such row a ``R`` row in the change stream, placed so that a
reader replaying the stream in ``(commit_lsn, seq)`` order never sees a read that is older
than a change it has already seen.

Per chunk of table T (keyset on T's single-column primary key, ``chunk_rows`` rows):

1. commit a LOW watermark: ``pg_logical_emit_message(true, 'lakecdc.backfill',
   '{"run":…,"table":…,"chunk":k,"mark":"low"}')``; its LSN is the window's start;
2. in a short REPEATABLE READ READ ONLY transaction, note the transactions in progress in
   its snapshot and SELECT the chunk (``WHERE key > cursor ORDER BY key LIMIT n``) as
   wal2json-v2-shaped JSON built by Postgres (``chunk_query``);
3. stage the rows, the chunk's key range (the persisted cursor), the LOW LSN and the
   in-progress transactions in ``<lakehouse>/bronze/_backfill_chunks`` (one Delta commit);
4. commit a HIGH watermark message for the chunk.

The backfill never writes bronze: bronze keeps one writer, the shipper, so read rows land in
commit order. When the shipper meets a HIGH watermark of a staged chunk not yet in bronze
(``BackfillEmitter``), it appends the chunk's rows to the HIGH's own transaction (same
``commit_lsn``, ``seq`` after the message, ``tx_changes`` grown) in the same bronze commit,
**minus the rows whose key a captured change inside the window touched** (committed after
the LOW, before the HIGH - see ``bronze.records.Window`` for the exact rule, which also
covers Postgres making a transaction visible later than its commit record suggests). Those
rows are superseded by the streamed change; changes after the HIGH come after the read in
commit order. The same commit records the Delta app transaction ``lakecdc-backfill:<run>`` =
highest chunk emitted, so a repeated HIGH (after a resume) is ignored.

Resuming after ``kill -9``: the staging table says which chunks exist and bronze's app
transaction which are emitted; a staged chunk not yet emitted gets a new HIGH (its window
only grows, which is still correct) and the run continues after the last staged key. A run
(id persisted in the staging table) belongs to its set of tables: ``lakecdc backfill
snapshot`` with the same tables continues it until it completes; then it reports the run
complete, and ``--new-run`` reads the tables again.

The backfill needs a running shipper (``lakecdc ship`` or ``lakecdc run``) and stays at most
``max_ahead`` chunks ahead of it; without one it says so and exits 2 rather than wait.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import reduce
from typing import Callable, Iterable

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import CommitProperties, DeltaTable, write_deltalake
from psycopg import sql

from bronze.records import (BACKFILL_PREFIX, UTC_US, HighMark, Window, changed_keys,
                            read_records)
from bronze.source import connect
from bronze.table import BronzeTable
from pipelines.config import Config
from pipelines.errors import UserError
from pipelines.faults import FaultPoints
from pipelines.locks import acquire, shipper_running
from pipelines.lsn import fmt
from pipelines.progress import Progress

log = logging.getLogger("lakecdc.backfill")

STAGING_NAME = "_backfill_chunks"
APP_PREFIX = "lakecdc-backfill:"
GUARD = "backfill_window"          # LAKECDC_UNSAFE_DISABLE_GUARDS: negative control only
DEFAULT_CHUNK_ROWS = 10_000
MAX_AHEAD = 2                      # chunks staged but not yet in bronze, at most
WAIT_TIMEOUT_S = 600.0
READ_TIMEOUT_S = 300               # statement timeout of one chunk's SELECT

# Staging rows by kind (the table is partitioned by it, so markers are read without data).
ROW, CHUNK, TABLE_DONE, RUN_DONE = "row", "chunk", "table_done", "run_done"

STAGING_SCHEMA = pa.schema([
    pa.field("kind", pa.string(), nullable=False),
    pa.field("run", pa.string(), nullable=False),
    pa.field("tables", pa.string(), nullable=False),     # the run's tables, comma-joined
    pa.field("table_name", pa.string()),                 # schema.table
    pa.field("chunk", pa.int64()),                       # 1, 2, ... across the run
    pa.field("seq", pa.int32()),                         # row: position in the chunk
    pa.field("key", pa.string()),                        # row: the key as text
    pa.field("key_column", pa.string()),                 # chunk: the keyset column
    pa.field("first_key", pa.string()),                  # chunk: key range = the cursor
    pa.field("last_key", pa.string()),
    pa.field("low_lsn", pa.int64()),                     # chunk: LSN of the LOW watermark
    pa.field("in_progress", pa.list_(pa.int64())),       # chunk: xids running at its snapshot
    pa.field("rows", pa.int64()),                        # chunk: rows; run_done: all rows
    pa.field("staged_at", UTC_US, nullable=False),
    pa.field("data", pa.string()),                       # row: wal2json-v2-shaped JSON
])
_STAGING_CONFIG = {
    "delta.checkpointInterval": "20",
    "delta.dataSkippingNumIndexedCols": str(len(STAGING_SCHEMA) - 1),   # no stats on data
    "delta.logRetentionDuration": "interval 30 days",
}


def staging_path(config: Config) -> str:
    return config.table_path("bronze", STAGING_NAME)


def app_id(run: str) -> str:
    """The bronze app transaction recording the highest chunk of ``run`` in bronze."""
    return APP_PREFIX + run


def backfill_lock_name(slot: str) -> str:
    return f"lakecdc.backfill:{slot}"


def _no_shipper(slot: str) -> UserError:
    return UserError(f"no lakecdc shipper is running on slot {slot}: the backfill's chunks "
                     "reach bronze only through it, so start `lakecdc ship` or `lakecdc run` "
                     "and rerun `lakecdc backfill snapshot` (it continues where it stopped).")


# --- the staging table ----------------------------------------------------------------

@dataclass(frozen=True)
class ChunkInfo:
    run: str
    chunk: int
    table: str
    key_column: str
    first_key: str
    last_key: str
    low_lsn: int
    in_progress: tuple[int, ...]
    rows: int


@dataclass
class RunState:
    run: str
    tables: tuple[str, ...]
    started_at: int                                   # microseconds, first staged row
    chunks: dict[int, ChunkInfo] = field(default_factory=dict)
    done_tables: set[str] = field(default_factory=set)
    complete: bool = False
    total_rows: int = 0                               # from the run_done marker

    def table_chunks(self, table: str) -> list[ChunkInfo]:
        return [c for _, c in sorted(self.chunks.items()) if c.table == table]


class StagingTable:
    """``bronze/_backfill_chunks``: staged chunk rows and the markers that make a run
    resumable. Written by the backfill only, read by the shipper for HIGH watermarks."""

    def __init__(self, uri: str, storage_options: dict | None = None) -> None:
        self.uri = uri
        self.storage_options = storage_options

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options)

    def ensure(self) -> None:
        if not self.exists():
            DeltaTable.create(self.uri, STAGING_SCHEMA, mode="ignore", partition_by=["kind"],
                              name="backfill_chunks", configuration=_STAGING_CONFIG,
                              description="lakecdc snapshot backfill: staged chunks, emitted "
                                          "into bronze by the shipper at their HIGH watermark",
                              storage_options=self.storage_options)

    def _table(self) -> DeltaTable:
        return DeltaTable(self.uri, storage_options=self.storage_options)

    def runs(self) -> dict[str, RunState]:
        dt = self._table()
        markers = dt.to_pyarrow_dataset(file_pruning_predicate=f"kind <> '{ROW}'").to_table(
            filter=pds.field("kind") != ROW,
            columns=[f.name for f in STAGING_SCHEMA if f.name not in ("data", "key", "seq")])
        runs: dict[str, RunState] = {}
        for m in markers.to_pylist():
            stamp = int(m["staged_at"].timestamp() * 1e6)
            state = runs.setdefault(m["run"], RunState(m["run"], tuple(m["tables"].split(",")),
                                                       stamp))
            state.started_at = min(state.started_at, stamp)
            if m["kind"] == CHUNK:
                state.chunks[m["chunk"]] = _chunk_info(m)
            elif m["kind"] == TABLE_DONE:
                state.done_tables.add(m["table_name"])
            elif m["kind"] == RUN_DONE:
                state.complete = True
                state.total_rows = m["rows"] or 0
        return runs

    def run_ids(self) -> set[str]:
        """The runs staging holds (none if there is no staging table)."""
        return set(self.runs()) if self.exists() else set()

    def chunk(self, run: str, chunk: int) -> ChunkInfo | None:
        if not self.exists():
            return None
        rows = self._table().to_pyarrow_dataset(
            file_pruning_predicate=f"kind = '{CHUNK}' AND chunk = {int(chunk)}").to_table(
            filter=(pds.field("kind") == CHUNK) & (pds.field("run") == run)
            & (pds.field("chunk") == chunk)).to_pylist()
        return _chunk_info(rows[0]) if rows else None

    def chunk_rows(self, run: str, chunk: int) -> pa.Table:
        """``seq``, ``key``, ``data`` of a staged chunk, in key order."""
        table = self._table().to_pyarrow_dataset(
            file_pruning_predicate=f"kind = '{ROW}' AND chunk = {int(chunk)}").to_table(
            columns=["seq", "key", "data"],
            filter=(pds.field("kind") == ROW) & (pds.field("run") == run)
            & (pds.field("chunk") == chunk))
        return table.sort_by("seq")

    def stage_chunk(self, info: ChunkInfo, tables: str, keys: list[str],
                    data: list[str]) -> None:
        """The chunk's rows and its marker, in one commit."""
        n = len(keys)
        now = _now_us()
        row = {"kind": [ROW] * n, "run": [info.run] * n, "tables": [tables] * n,
               "table_name": [info.table] * n, "chunk": [info.chunk] * n,
               "seq": list(range(n)), "key": keys, "staged_at": [now] * n, "data": data}
        marker = {"kind": [CHUNK], "run": [info.run], "tables": [tables],
                  "table_name": [info.table], "chunk": [info.chunk],
                  "key_column": [info.key_column], "first_key": [info.first_key],
                  "last_key": [info.last_key], "low_lsn": [info.low_lsn],
                  "in_progress": [list(info.in_progress)], "rows": [info.rows],
                  "staged_at": [now]}
        self._append([row, marker], {"lakecdc.operation": "backfill-chunk",
                                     "lakecdc.run": info.run, "lakecdc.chunk": info.chunk,
                                     "lakecdc.rows": n})

    def mark(self, kind: str, run: str, tables: str, table: str | None = None,
             rows: int | None = None, chunk: int | None = None) -> None:
        self._append([{"kind": [kind], "run": [run], "tables": [tables], "table_name": [table],
                       "rows": [rows], "chunk": [chunk], "staged_at": [_now_us()]}],
                     {"lakecdc.operation": f"backfill-{kind}", "lakecdc.run": run})

    def drop_rows(self, run: str) -> None:
        """Delete a completed run's staged rows (bronze holds them now); markers stay. The
        files go with VACUUM."""
        _check_run_id(run)
        self._table().delete(f"kind = '{ROW}' AND run = '{run}'")

    def _append(self, parts: list[dict], metadata: dict) -> None:
        tables = []
        for part in parts:
            n = len(part["kind"])
            cols = {f.name: part.get(f.name, [None] * n) for f in STAGING_SCHEMA}
            cols["staged_at"] = pa.array(cols["staged_at"], pa.int64()).cast(UTC_US)
            tables.append(pa.table(cols, schema=STAGING_SCHEMA))
        write_deltalake(self.uri, pa.concat_tables(tables), mode="append",
                        partition_by=["kind"], storage_options=self.storage_options,
                        commit_properties=CommitProperties(
                            custom_metadata={k: str(v) for k, v in metadata.items()}))


def _chunk_info(m: dict) -> ChunkInfo:
    return ChunkInfo(m["run"], int(m["chunk"]), m["table_name"], m["key_column"],
                     m["first_key"], m["last_key"], int(m["low_lsn"]),
                     tuple(m["in_progress"] or ()), int(m["rows"]))


def _now_us() -> int:
    return int(time.time() * 1e6)


def _check_run_id(run: str) -> None:
    if not run.replace("-", "").isalnum():
        raise ValueError(f"bad backfill run id {run!r}")


# --- reading the source ---------------------------------------------------------------

# wal2json 2.5 prints these types as bare JSON numbers (NaN / ±Infinity as null), booleans
# as true/false, bytea as its hex digits, and every other type as a JSON string of the
# type's text output (wal2json.c, format-version 2).
_NUMBER_TYPES = (20, 21, 23, 26, 700, 701, 1700)    # int8 int2 int4 oid float4 float8 numeric
_BOOL, _BYTEA = 16, 17


@dataclass(frozen=True)
class SourceTable:
    name: str                                   # schema.table, as configured
    schema: str
    table: str
    key_column: str
    head: str                                   # JSON text before the first column
    columns: tuple[tuple[str, int, str], ...]   # (name, type oid, JSON text before the value)
    estimated_rows: int


def describe_table(conn: psycopg.Connection, name: str) -> SourceTable:
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
    keys = [r[0] for r in conn.execute("""
        SELECT a.attname FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s::int8::oid AND i.indisprimary""", [oid])]
    if len(keys) != 1:
        raise UserError(f"{name} has {'no' if not keys else 'a composite'} primary key; a "
                        "keyset backfill needs a single-column primary key.")
    columns = tuple(conn.execute("""
        SELECT a.attname, a.atttypid::int8,
               '{"name":' || to_json(a.attname::text)::text || ',"type":'
               || to_json(format_type(a.atttypid, a.atttypmod))::text || ',"value":'
        FROM pg_attribute a
        WHERE a.attrelid = %s::int8::oid AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum""", [oid]).fetchall())
    return SourceTable(name, schema, table, keys[0], head, columns, int(estimate))


def _value_json(column: str, type_oid: int) -> sql.Composable:
    c = sql.SQL("t.{}").format(sql.Identifier(column))
    if type_oid in _NUMBER_TYPES:
        return sql.SQL("CASE WHEN {c} IS NULL OR {c}::text IN ('NaN', 'Infinity', '-Infinity') "
                       "THEN 'null' ELSE {c}::text END").format(c=c)
    if type_oid == _BOOL:
        return sql.SQL("CASE WHEN {c} IS NULL THEN 'null' WHEN {c} THEN 'true' "
                       "ELSE 'false' END").format(c=c)
    if type_oid == _BYTEA:
        return sql.SQL("""CASE WHEN {c} IS NULL THEN 'null' ELSE '"' || encode({c}, 'hex') """
                       """|| '"' END""").format(c=c)
    # format('%s') calls the type's output function, as wal2json does (a cast to text would
    # trim char(n)); num_nulls is NULL-ness of the value itself (IS NULL is true for a
    # composite whose fields are all NULL).
    return sql.SQL("CASE WHEN num_nulls({c}) = 1 THEN 'null' "
                   "ELSE to_json(format('%%s', {c}))::text END").format(c=c)


def chunk_query(source: SourceTable, after: bool) -> sql.Composed:
    """The key as text and the row as wal2json v2 JSON (action ``R``), in key order, from
    ``%(after)s`` (exclusive, when ``after``) at most ``%(limit)s`` rows."""
    columns = sql.SQL(" || ',' || ").join(
        sql.SQL("{} || {} || '}}'").format(sql.Literal(prefix), _value_json(name, oid))
        for name, oid, prefix in source.columns)
    key = sql.SQL("t.{}").format(sql.Identifier(source.key_column))
    return sql.SQL("SELECT format('%%s', {key}), {head} || {columns} || ']}}' FROM {table} AS t "
                   "{where} ORDER BY {key} LIMIT %(limit)s").format(
        key=key, head=sql.Literal(source.head), columns=columns,
        table=sql.Identifier(source.schema, source.table),
        where=sql.SQL("WHERE {} > %(after)s").format(key) if after else sql.SQL(""))


@dataclass
class Chunk:
    keys: list[str]
    data: list[str]
    in_progress: tuple[int, ...]
    source: SourceTable


def read_chunk(conn: psycopg.Connection, table: str, after: str | None, limit: int) -> Chunk:
    """One short REPEATABLE READ READ ONLY transaction (``conn`` from ``_reader``):

    the table locked against DDL (ACCESS SHARE: writers are not blocked) so the columns
    read from the catalog are the columns selected - a column added or dropped between
    chunks is followed; then, in the transaction's snapshot, the transactions in progress
    (32-bit xids, like wal2json's) and the chunk."""
    schema, name = table.split(".", 1)
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
            sql.Identifier(schema, name)))
        source = describe_table(conn, table)
        in_progress = conn.execute(
            "SELECT array(SELECT (x::text::numeric % 4294967296)::bigint "
            "FROM pg_snapshot_xip(pg_current_snapshot()) AS x ORDER BY 1)").fetchone()[0]
        rows = conn.execute(chunk_query(source, after is not None),
                            {"after": after, "limit": limit}).fetchall()
    return Chunk([r[0] for r in rows], [r[1] for r in rows], tuple(in_progress), source)


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
    row = conn.execute("SELECT (pg_logical_emit_message(true, %s, %s) - '0/0'::pg_lsn)::bigint",
                       [BACKFILL_PREFIX, content]).fetchone()
    return int(row[0])


# --- the shipper's side ------------------------------------------------------------------

@dataclass
class Emission:
    """Read rows the shipper appends to one bronze commit, and what to record with them."""

    batches: list[pa.RecordBatch]
    app_versions: dict[str, int]
    chunks: list[str]                 # "run:chunk" emitted
    rows: int                         # read rows appended
    dropped: int                      # chunk rows dropped by the window rule


class BackfillEmitter:
    """Turns the HIGH watermarks of one shipper batch into read rows (see module doc)."""

    def __init__(self, config: Config, bronze: BronzeTable,
                 storage_options: dict | None = None) -> None:
        self.staging = StagingTable(staging_path(config), storage_options)
        self.bronze = bronze
        self.window_rule = config.guard_on(GUARD)

    def staged_marks(self, marks: list[HighMark]) -> tuple[list[HighMark], int]:
        """The marks of runs staging holds, and how many others were dropped.

        Anyone allowed to emit logical messages can forge marks: those of runs that were
        never staged are dropped before any other read, at the cost of one read of
        staging's run markers per batch."""
        if not marks:
            return [], 0
        known = self.staging.run_ids()
        staged = [m for m in marks if m.run in known]
        forged = len(marks) - len(staged)
        if forged:
            log.warning("backfill: %d HIGH marks of runs that were never staged ignored "
                        "(forged, or of another lakehouse)", forged)
        return staged, forged

    def plan(self, marks: list[HighMark], bronze_commit_lsn: int,
             assembled: Callable[[], Iterable[pa.RecordBatch]], tx_changes: np.ndarray,
             slot: str, shipped_at: pa.TimestampScalar) -> Emission | None:
        """The read rows for ``marks`` (``staged_marks`` of the HIGHs in this batch), or None.

        ``assembled`` re-reads this batch's rows (for changes inside the windows);
        ``bronze_commit_lsn`` is what bronze held before it (earlier parts of a window are
        looked up there). ``tx_changes`` is updated in place: each HIGH's transaction grows
        by its read rows, so ``finalize`` writes the grown count on the message row too.
        """
        accepted: list[tuple[HighMark, ChunkInfo]] = []
        # Every read below is made at most once per run and chunk: with the forged marks
        # dropped first (``staged_marks``), a flood of marks costs no I/O per mark.
        versions: dict[str, int] = {}
        looked_up: dict[tuple[str, int], ChunkInfo | None] = {}
        for mark in sorted(marks, key=lambda m: (m.commit_lsn, m.seq)):
            if mark.run not in versions:
                versions[mark.run] = self.bronze.app_version(app_id(mark.run)) or 0
            have = versions[mark.run]
            if mark.chunk <= have:
                log.debug("backfill %s chunk %d is already in bronze: repeated HIGH ignored",
                          mark.run, mark.chunk)
                continue
            if mark.chunk != have + 1:
                log.warning("backfill %s: HIGH watermark of chunk %d while chunk %d is the "
                            "next to emit; ignored (a resumed backfill announces it again)",
                            mark.run, mark.chunk, have + 1)
                continue
            if (mark.run, mark.chunk) not in looked_up:
                looked_up[(mark.run, mark.chunk)] = self.staging.chunk(mark.run, mark.chunk)
            info = looked_up[(mark.run, mark.chunk)]
            if info is None:
                log.warning("backfill %s: HIGH watermark of chunk %d, which is not staged "
                            "in %s; ignored", mark.run, mark.chunk, self.staging.uri)
                continue
            accepted.append((mark, info))
            versions[mark.run] = mark.chunk
        if not accepted:
            return None

        windows = [Window(info.run, info.chunk, info.table, info.key_column, info.low_lsn,
                          mark.commit_lsn, frozenset(info.in_progress))
                   for mark, info in accepted]
        drops = (self._changed(windows, bronze_commit_lsn, assembled) if self.window_rule
                 else {(w.run, w.chunk): set() for w in windows})
        next_seq: dict[int, int] = {}
        pending: list[tuple[HighMark, int, pa.Array]] = []
        dropped = 0
        for (mark, info), window in zip(accepted, windows):
            rows = self.staging.chunk_rows(mark.run, mark.chunk)
            gone = drops[(window.run, window.chunk)]
            if gone:
                keep = pc.invert(pc.is_in(rows.column("key"), pa.array(sorted(gone))))
                kept = rows.filter(keep)
            else:
                kept = rows
            dropped += rows.num_rows - kept.num_rows
            first = next_seq.get(mark.gid, int(tx_changes[mark.gid]))
            next_seq[mark.gid] = first + kept.num_rows
            pending.append((mark, first, kept.column("data").combine_chunks()))
            log.debug("backfill %s chunk %d (%s): %d rows, %d dropped (changed in window "
                      "%s..%s)", mark.run, mark.chunk, info.table, kept.num_rows,
                      rows.num_rows - kept.num_rows, fmt(info.low_lsn), fmt(mark.commit_lsn))
        for gid, n in next_seq.items():
            tx_changes[gid] = n
        batches = [read_records(data, mark, first, int(tx_changes[mark.gid]), slot, shipped_at)
                   for mark, first, data in pending if len(data)]
        app_versions: dict[str, int] = {}
        for mark, _ in accepted:
            app_versions[app_id(mark.run)] = max(app_versions.get(app_id(mark.run), 0),
                                                 mark.chunk)
        return Emission(batches, app_versions, [f"{m.run}:{m.chunk}" for m, _ in accepted],
                        sum(b.num_rows for b in batches), dropped)

    def _changed(self, windows: list[Window], bronze_commit_lsn: int,
                 assembled: Callable[[], Iterable[pa.RecordBatch]]
                 ) -> dict[tuple[str, int], set[str]]:
        result: dict[tuple[str, int], set[str]] = {(w.run, w.chunk): set() for w in windows}

        def merge(found: dict[tuple[str, int], set[str]]) -> None:
            for k, keys in found.items():
                result[k] |= keys

        # Earlier parts of the windows, already in bronze: a few rows, found through the
        # files' commit_lsn / xid statistics.
        text, exprs = [], []
        for w in windows:
            if w.low_lsn < bronze_commit_lsn:
                text.append(f"(commit_lsn > {int(w.low_lsn)} AND "
                            f"commit_lsn <= {int(bronze_commit_lsn)})")
                exprs.append((pds.field("commit_lsn") > w.low_lsn)
                             & (pds.field("commit_lsn") <= bronze_commit_lsn))
            if w.in_progress:
                xids = sorted(int(x) for x in w.in_progress)
                text.append(f"(commit_lsn <= {int(w.low_lsn)} AND "
                            f"xid IN ({', '.join(map(str, xids))}))")
                exprs.append((pds.field("commit_lsn") <= w.low_lsn)
                             & pds.field("xid").isin(xids))
        if text:
            found = self.bronze.changes_dataset(" OR ".join(text)).to_table(
                columns=["commit_lsn", "xid", "action", "data"],
                filter=reduce(lambda a, b: a | b, exprs)
                & pds.field("action").isin(["I", "U", "D"]))
            merge(changed_keys(*(found.column(c).combine_chunks()
                                 for c in ("commit_lsn", "xid", "action", "data")), windows))
        # The rest of the windows: this batch.
        for batch in assembled():
            merge(changed_keys(batch.column("commit_lsn"), batch.column("xid"),
                               batch.column("action"), batch.column("data"), windows))
        return result


# --- the backfill process ------------------------------------------------------------------

@dataclass
class TableProgress:
    table: str
    rows: int = 0              # staged for the run, all invocations
    chunks: int = 0
    new_rows: int = 0          # staged by this invocation
    new_chunks: int = 0
    done: bool = False


@dataclass
class BackfillReport:
    run: str
    tables: tuple[str, ...]
    outcome: str               # "complete", "already complete", "stopped"
    per_table: dict[str, TableProgress]
    seconds: float
    resumed: bool = False

    @property
    def new_rows(self) -> int:
        return sum(t.new_rows for t in self.per_table.values())

    def summary(self) -> str:
        parts = ", ".join(f"{t.table} {t.rows:,} rows in {t.chunks:,} chunks"
                          for t in self.per_table.values())
        if self.outcome == "already complete":
            return (f"backfill run {self.run} of {', '.join(self.tables)} is already complete "
                    f"({parts}); pass --new-run to read the tables again.")
        rate = (f", {self.new_rows / self.seconds:,.0f} rows/s" if self.seconds > 0
                and self.new_rows else "")
        head = f"backfill run {self.run}{' (resumed)' if self.resumed else ''}: {parts}"
        if self.outcome == "stopped":
            return (f"{head}; stopped between chunks after {self.seconds:.1f}s: rerun "
                    "`lakecdc backfill snapshot` to continue.")
        return f"{head}; complete in {self.seconds:.1f}s{rate}."


def resolve_tables(config: Config, requested: Iterable[str] | None) -> tuple[str, ...]:
    """The captured tables to read (all when none requested), in configuration order."""
    if not requested:
        return tuple(config.tables)
    chosen = set()
    for name in requested:
        matches = [t for t in config.tables if name in (t, t.split(".", 1)[1])]
        if len(matches) != 1:
            raise UserError(f"table {name} is not captured, so it cannot be backfilled; "
                            f"captured: {', '.join(config.tables)} (LAKECDC_TABLES).")
        chosen.add(matches[0])
    return tuple(t for t in config.tables if t in chosen)


def run_snapshot_backfill(config: Config, tables: Iterable[str] | None = None,
                          chunk_rows: int = DEFAULT_CHUNK_ROWS,
                          stop: threading.Event | None = None, new_run: bool = False,
                          max_ahead: int = MAX_AHEAD, timeout_s: float = WAIT_TIMEOUT_S,
                          storage_options: dict | None = None) -> BackfillReport:
    """``lakecdc backfill snapshot``: run or continue the backfill of ``tables``."""
    chosen = resolve_tables(config, tables)
    if chunk_rows < 1 or max_ahead < 0 or timeout_s <= 0:
        raise UserError("--chunk-rows and --timeout must be positive.")
    return SnapshotBackfill(config, chosen, chunk_rows, stop or threading.Event(), new_run,
                            max_ahead, timeout_s, storage_options).run()


class SnapshotBackfill:
    def __init__(self, config: Config, tables: tuple[str, ...], chunk_rows: int,
                 stop: threading.Event, new_run: bool, max_ahead: int, timeout_s: float,
                 storage_options: dict | None) -> None:
        self.config, self.tables, self.chunk_rows = config, tables, chunk_rows
        self.stop, self.new_run = stop, new_run
        self.max_ahead, self.timeout_s = max_ahead, timeout_s
        self.key = ",".join(tables)
        self.bronze = BronzeTable(config.bronze_path, storage_options)
        self.staging = StagingTable(staging_path(config), storage_options)
        self.faults = FaultPoints(config.faults)
        self._bronze_dt: DeltaTable | None = None
        self.storage_options = storage_options

    # -- state --

    def _pick_run(self) -> tuple[RunState, bool]:
        """The run to work on, and whether it existed already."""
        runs = self.staging.runs()
        mine = sorted((r for r in runs.values() if r.tables == self.tables),
                      key=lambda r: r.started_at)
        for other in runs.values():
            if other.tables != self.tables and not other.complete:
                log.info("backfill run %s of %s is unfinished; `lakecdc backfill snapshot` "
                         "with those tables continues it", other.run, ", ".join(other.tables))
        latest = mine[-1] if mine else None
        if latest is not None and not self.new_run:
            return latest, True
        if latest is not None and not latest.complete:
            log.warning("starting a new backfill run: run %s of these tables is abandoned "
                        "unfinished", latest.run)
        run = (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-"
               + secrets.token_hex(3))
        return RunState(run, self.tables, _now_us()), False

    def _emitted(self, run: str) -> int:
        if self._bronze_dt is None:
            self._bronze_dt = DeltaTable(self.config.bronze_path,
                                         storage_options=self.storage_options)
        else:
            self._bronze_dt.update_incremental()
        return self._bronze_dt.transaction_version(app_id(run)) or 0

    def _wait_emitted(self, conn: psycopg.Connection, run: str, chunk: int) -> bool:
        """Until bronze holds ``chunk`` of ``run`` (False: stopped). Bounded: exit 2 if no
        shipper runs, or after ``timeout_s``."""
        if chunk <= 0:
            return True
        deadline = time.monotonic() + self.timeout_s
        delay = 0.02
        while self._emitted(run) < chunk:
            if self.stop.is_set():
                return False
            if not shipper_running(conn, self.config.slot):
                raise _no_shipper(self.config.slot)
            if time.monotonic() > deadline:
                raise UserError(f"the shipper has not brought backfill chunk {chunk} into "
                                f"bronze within {self.timeout_s:.0f}s (is it far behind? see "
                                "`lakecdc status`); rerun `lakecdc backfill snapshot` to "
                                "continue.")
            self.stop.wait(delay)
            delay = min(delay * 1.5, 0.5)
        return True

    # -- the run --

    def run(self) -> BackfillReport:
        started = time.monotonic()
        cfg = self.config
        if not self.bronze.exists():
            raise UserError(f"no bronze table at {cfg.bronze_path}: run `lakecdc setup` first.")
        with connect(cfg.require_source()) as conn:
            acquire(conn, backfill_lock_name(cfg.slot), f"lakecdc backfill {cfg.slot}",
                    f"another `lakecdc backfill snapshot` is running on slot {cfg.slot}; wait "
                    "for it to finish or stop it first.")
            self.staging.ensure()
            state, resumed = self._pick_run()
            per_table = {t: TableProgress(t) for t in self.tables}
            for info in state.chunks.values():
                per_table[info.table].rows += info.rows
                per_table[info.table].chunks += 1
            for t in state.done_tables:
                per_table[t].done = True
            if state.complete:
                self.staging.drop_rows(state.run)     # idempotent: a crash may have left them
                return BackfillReport(state.run, self.tables, "already complete", per_table,
                                      time.monotonic() - started, resumed)
            if not shipper_running(conn, cfg.slot):
                raise _no_shipper(cfg.slot)
            sources = {t: describe_table(conn, t) for t in self.tables}
            outcome = self._run(conn, state, sources, per_table)
        return BackfillReport(state.run, self.tables, outcome, per_table,
                              time.monotonic() - started, resumed)

    def _run(self, conn: psycopg.Connection, state: RunState,
             sources: dict[str, SourceTable], per_table: dict[str, TableProgress]) -> str:
        run, tables = state.run, self.key
        emitted = self._emitted(run)
        # Staged before an interruption but not in bronze: announce again (the window of
        # such a chunk only grows, which keeps the drop rule correct).
        for k in sorted(c for c in state.chunks if c > emitted):
            info = state.chunks[k]
            log.info("backfill %s: announcing chunk %d of %s again (staged before an "
                     "interruption)", run, k, info.table)
            emit_mark(conn, run, info.table, k, "high")
        next_chunk = max(state.chunks, default=0) + 1
        log.info("backfill run %s of %s: %s", run, tables,
                 "continuing" if state.chunks or state.done_tables else "starting")
        with _reader(self.config.require_source()) as reader:
            for table in self.tables:
                progress = per_table[table]
                if progress.done:
                    continue
                source = sources[table]
                previous = state.table_chunks(table)
                cursor = previous[-1].last_key if previous else None
                with Progress(f"backfill {table}", max(source.estimated_rows, progress.rows),
                              unit="rows read") as bar:
                    if progress.rows:
                        bar(progress.rows)
                    while True:
                        if self.stop.is_set():
                            return "stopped"
                        if not self._wait_emitted(conn, run, next_chunk - 1 - self.max_ahead):
                            return "stopped"
                        low = emit_mark(conn, run, table, next_chunk, "low")
                        self.faults.hit("after_backfill_low")
                        chunk = read_chunk(reader, table, cursor, self.chunk_rows)
                        if not chunk.keys:
                            break
                        self.staging.stage_chunk(
                            ChunkInfo(run, next_chunk, table, chunk.source.key_column,
                                      chunk.keys[0], chunk.keys[-1], low, chunk.in_progress,
                                      len(chunk.keys)),
                            tables, chunk.keys, chunk.data)
                        self.faults.hit("after_backfill_stage")
                        emit_mark(conn, run, table, next_chunk, "high")
                        self.faults.hit("after_backfill_high")
                        n = len(chunk.keys)
                        progress.rows += n
                        progress.chunks += 1
                        progress.new_rows += n
                        progress.new_chunks += 1
                        bar.label = f"backfill {table} (chunk {next_chunk})"
                        bar(n)
                        cursor = chunk.keys[-1]
                        next_chunk += 1
                        if n < self.chunk_rows:
                            break
                self.staging.mark(TABLE_DONE, run, tables, table=table)
                progress.done = True
                log.info("backfill %s: %s read, %s rows in %s chunks", run, table,
                         f"{progress.rows:,}", f"{progress.chunks:,}")
        if not self._wait_emitted(conn, run, next_chunk - 1):
            return "stopped"
        total = sum(p.rows for p in per_table.values())
        self.staging.mark(RUN_DONE, run, tables, rows=total, chunk=next_chunk - 1)
        self.staging.drop_rows(run)
        return "complete"


__all__ = ["BackfillEmitter", "BackfillReport", "StagingTable", "run_snapshot_backfill",
           "staging_path", "app_id", "GUARD"]
