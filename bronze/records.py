"""Turning wal2json peek rows into bronze records: pure functions on columns, no I/O.

A peek returns rows in decode order: each transaction as ``B``, its changes, ``C`` (always
whole and contiguous), and non-transactional logical messages (``M`` with xid 0) on their
own. Every change is keyed by ``(commit_lsn, seq)``: the LSN of its transaction's commit
record (from the ``B`` row's JSON) and its position inside the transaction. A change's own
LSN is not unique (COPY and multi-row inserts share one) and is kept only as information. A
non-transactional message is a transaction of one: ``commit_lsn`` = its own LSN, ``seq`` 0.

``TransactionAssembler`` consumes the peek in chunks, so a transaction of a million rows
never has to sit in memory at once; state carried between chunks is one open transaction's
header. The transaction's change count (``tx_changes``, stored on every row so a reader
can tell it holds the whole transaction) is only known at its ``C``, so chunks carry a
transaction number (``gid``) and ``finalize`` fills the count in once the transaction is
closed (``TransactionAssembler.tx_changes``; ``open_gid`` is the one still open).

Snapshot backfill (``bronze/backfill.py``), the pure parts: ``high_marks`` finds the HIGH
watermark messages among assembled rows, ``Window``/``changed_keys`` the keys a chunk must
drop, ``read_records`` turns a chunk's rows into bronze rows (action ``R``) of the HIGH's
transaction.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UTC_US = pa.timestamp("us", tz="UTC")

BRONZE_SCHEMA = pa.schema([
    pa.field("slot", pa.string(), nullable=False),
    pa.field("commit_lsn", pa.int64(), nullable=False),
    pa.field("seq", pa.int32(), nullable=False),
    pa.field("tx_changes", pa.int32(), nullable=False),
    pa.field("xid", pa.int64()),
    pa.field("lsn", pa.int64(), nullable=False),
    pa.field("commit_ts", UTC_US),
    pa.field("action", pa.string(), nullable=False),
    pa.field("shipped_at", UTC_US, nullable=False),
    pa.field("data", pa.string(), nullable=False),
])

# What the assembler emits per chunk: bronze columns minus slot/tx_changes/shipped_at, plus
# the transaction number used to fill ``tx_changes`` in ``finalize``.
ASSEMBLED_SCHEMA = pa.schema(
    [BRONZE_SCHEMA.field(n) for n in ("commit_lsn", "seq")]
    + [pa.field("gid", pa.int64(), nullable=False)]
    + [BRONZE_SCHEMA.field(n) for n in ("xid", "lsn", "commit_ts", "action", "data")])

_B, _C, _M = ord("B"), ord("C"), ord("M")


class MalformedPeek(Exception):
    """The peek output broke wal2json's framing (a bug or an unsupported plugin version)."""


@dataclass
class PeekColumns:
    """One chunk of peek output, column-wise.

    ``commit_lsn`` and ``commit_ts_us`` are taken from the JSON of ``B`` rows (0 elsewhere).
    """

    lsn: np.ndarray           # int64, the row's own LSN as the peek reports it
    xid: np.ndarray           # int64, 0 for non-transactional messages
    commit_lsn: np.ndarray    # int64
    commit_ts_us: np.ndarray  # int64, microseconds since the epoch
    action: np.ndarray        # uint8, the wal2json action letter
    data: pa.StringArray      # the wal2json JSON; empty for B and C rows

    def __len__(self) -> int:
        return len(self.lsn)


@dataclass
class _Open:
    """Header of the transaction still open at the end of the previous chunk."""

    gid: int
    start: int
    commit_lsn: int
    commit_ts_us: int
    xid: int


@dataclass
class PeekSummary:
    rows: int                     # all peek rows, B/C included
    last_lsn: int | None          # the LSN the slot may be advanced to once this is stored
    max_commit_lsn: int | None    # highest commit_lsn among kept changes
    max_commit_ts_us: int | None  # its commit time (microseconds since the epoch)
    kept: int                     # change rows kept (newer than the recorded version)
    transactions: int             # transactions kept (with at least one change)
    tx_changes: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, np.int32))


class TransactionAssembler:
    """Groups peek rows into whole transactions and keys them ``(commit_lsn, seq)``.

    Transactions with ``commit_lsn <= after_commit_lsn`` (already in bronze) are dropped:
    this is what makes a re-delivered transaction harmless.
    """

    def __init__(self, after_commit_lsn: int) -> None:
        self.after = after_commit_lsn
        self._open: _Open | None = None
        self._groups = 0
        self._rows = 0
        self._counts = np.zeros(1024, dtype=np.int32)    # tx_changes by gid, known at ends
        self._last_lsn: int | None = None
        self._max_commit: int | None = None
        self._max_commit_ts_us: int | None = None
        self._kept = 0
        self._kept_groups: set[int] = set()

    def add(self, cols: PeekColumns) -> pa.RecordBatch:
        n = len(cols)
        if n == 0:
            return pa.RecordBatch.from_pylist([], schema=ASSEMBLED_SCHEMA)
        action = cols.action
        is_b, is_c = action == _B, action == _C
        is_solo = (action == _M) & (cols.xid == 0)
        ends = is_c | is_solo
        starts = is_b | is_solo
        idx = np.arange(self._rows, self._rows + n, dtype=np.int64)

        # Framing: a start only after an end (or at a clean boundary), and every other row
        # inside an open transaction.
        prev_end = np.empty(n, dtype=bool)
        prev_end[0] = self._open is None
        prev_end[1:] = ends[:-1]
        if np.any(starts & ~prev_end) or np.any(~starts & prev_end):
            bad = int(np.flatnonzero((starts & ~prev_end) | (~starts & prev_end))[0])
            raise MalformedPeek(f"row {self._rows + bad} breaks transaction framing: "
                                f"{cols.data[bad].as_py()[:120]}")

        # Per-transaction headers: slot 0 is the transaction carried in from the last chunk.
        local = np.cumsum(starts) - 1 + 1          # 0 = carried-in, 1.. = started here
        sidx = np.flatnonzero(starts)
        carried = self._open or _Open(-1, -1, 0, 0, 0)
        g_gid = np.concatenate(([carried.gid], self._groups + np.arange(len(sidx))))
        g_start = np.concatenate(([carried.start], idx[sidx]))
        g_commit = np.concatenate(([carried.commit_lsn],
                                   np.where(is_solo[sidx], cols.lsn[sidx], cols.commit_lsn[sidx])))
        g_ts = np.concatenate(([carried.commit_ts_us], cols.commit_ts_us[sidx]))
        g_xid = np.concatenate(([carried.xid], cols.xid[sidx]))
        g_solo = np.concatenate(([False], is_solo[sidx]))

        row_commit = g_commit[local]
        row_start = g_start[local]
        seq = idx - row_start - np.where(g_solo[local], 0, 1)
        if np.any((~is_solo) & (cols.xid != g_xid[local])):
            bad = int(np.flatnonzero((~is_solo) & (cols.xid != g_xid[local]))[0])
            raise MalformedPeek(f"row {self._rows + bad} has xid {cols.xid[bad]} inside "
                                f"transaction {g_xid[local][bad]}")

        # Change counts, known at each end row: C (rows since B) or a solo message (1).
        eidx = np.flatnonzero(ends)
        if self._groups + len(sidx) > len(self._counts):
            grown = np.zeros(2 * (self._groups + len(sidx)), dtype=np.int32)
            grown[:self._groups] = self._counts[:self._groups]
            self._counts = grown
        if len(eidx):
            gl = local[eidx]
            self._counts[g_gid[gl]] = np.where(is_solo[eidx], 1, idx[eidx] - g_start[gl] - 1)

        keep = ~is_b & ~is_c & (row_commit > self.after)
        kidx = np.flatnonzero(keep)
        if len(kidx):
            self._kept += len(kidx)
            newest = kidx[int(np.argmax(row_commit[kidx]))]
            if self._max_commit is None or int(row_commit[newest]) > self._max_commit:
                self._max_commit = int(row_commit[newest])
                self._max_commit_ts_us = int(g_ts[local[newest]])
            self._kept_groups.update(np.unique(g_gid[local[kidx]]).tolist())

        # Carry the last transaction over if it is still open.
        last = n - 1
        if ends[last]:
            self._open = None
        else:
            gl = local[last]
            self._open = _Open(int(g_gid[gl]), int(g_start[gl]), int(g_commit[gl]),
                               int(g_ts[gl]), int(g_xid[gl]))
        self._groups += len(sidx)
        self._rows += n
        self._last_lsn = int(cols.lsn[last])

        xid = g_xid[local][kidx]
        ts = g_ts[local][kidx]
        return pa.RecordBatch.from_arrays([
            pa.array(row_commit[kidx], pa.int64()),
            pa.array(seq[kidx].astype(np.int32), pa.int32()),
            pa.array(g_gid[local][kidx], pa.int64()),
            pa.array(xid, pa.int64(), mask=xid == 0),
            pa.array(cols.lsn[kidx], pa.int64()),
            pa.array(ts, pa.int64(), mask=g_solo[local][kidx]).cast(UTC_US),
            pa.array(action[kidx].view("S1")).cast(pa.string()),
            _kept_text(cols.data, kidx, n_changes=int(np.count_nonzero(~is_b & ~is_c))),
        ], schema=ASSEMBLED_SCHEMA)

    @property
    def open_gid(self) -> int | None:
        """The transaction still open after the last chunk (its rows are the last ones
        ``add`` returned); None at a transaction boundary."""
        return None if self._open is None else self._open.gid

    @property
    def tx_changes(self) -> np.ndarray:
        """Change counts by ``gid``, so far: valid for every transaction already closed."""
        return self._counts[:self._groups]

    def finish(self) -> PeekSummary:
        """Close the peek. Raises if it ended inside a transaction (wal2json never does)."""
        if self._open is not None:
            raise MalformedPeek("peek ended inside a transaction")
        return PeekSummary(rows=self._rows, last_lsn=self._last_lsn,
                           max_commit_lsn=self._max_commit,
                           max_commit_ts_us=self._max_commit_ts_us, kept=self._kept,
                           transactions=len(self._kept_groups), tx_changes=self.tx_changes)


def _kept_text(data: pa.StringArray, kidx: np.ndarray, n_changes: int) -> pa.StringArray:
    """The text of the kept rows. B/C rows carry empty text, so when every change row is
    kept (the normal case) the kept rows are back to back in the buffer: no copy."""
    if len(kidx) != n_changes or len(kidx) == 0 or data.offset != 0:
        return data.take(pa.array(kidx))
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int32, count=len(data) + 1)
    kept = np.append(offsets[kidx], offsets[kidx[-1] + 1]).astype(np.int32)
    return pa.StringArray.from_buffers(len(kidx), pa.py_buffer(kept), data.buffers()[2])


def finalize(batch: pa.RecordBatch, tx_changes: np.ndarray, slot: str,
             shipped_at: pa.TimestampScalar) -> pa.RecordBatch:
    """An assembled batch as bronze rows: slot, ``tx_changes`` filled in, ``shipped_at``."""
    n = batch.num_rows
    gid = batch.column("gid").to_numpy()
    return pa.RecordBatch.from_arrays([
        pa.array([slot] * n, pa.string()) if n else pa.array([], pa.string()),
        batch.column("commit_lsn"),
        batch.column("seq"),
        pa.array(tx_changes[gid], pa.int32()),
        batch.column("xid"),
        batch.column("lsn"),
        batch.column("commit_ts"),
        batch.column("action"),
        pa.array(np.full(n, shipped_at.value, dtype=np.int64), pa.int64()).cast(UTC_US),
        batch.column("data"),
    ], schema=BRONZE_SCHEMA)


# --- Binary COPY decoding -------------------------------------------------------------

COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
COPY_HEADER_LEN = len(COPY_SIGNATURE) + 8   # flags int32 + header extension length int32
# Each tuple: int16 field count, four int64 fields, the int16 action, then the text.
_ROW_HEAD = np.dtype([("n", ">i2"),
                      ("l1", ">i4"), ("lsn", ">i8"), ("l2", ">i4"), ("xid", ">i8"),
                      ("l3", ">i4"), ("commit_lsn", ">i8"), ("l4", ">i4"), ("ts", ">i8"),
                      ("l5", ">i4"), ("action", ">i2"), ("l6", ">i4")])
ROW_HEAD_LEN = _ROW_HEAD.itemsize


def decode_copy_rows(rows: list) -> PeekColumns:
    """Decode binary-COPY tuples (one buffer each, file header already removed).

    The tuples must come from the shipper's peek query (four ``bigint`` columns, the
    ``int2`` action and the wal2json text). The fixed-size heads are joined into one
    structured numpy array and the texts into one Arrow buffer: two joins, no per-row
    parsing in Python.
    """
    n = len(rows)
    heads = b"".join([r[:ROW_HEAD_LEN] for r in rows])
    if len(heads) != n * ROW_HEAD_LEN:
        raise MalformedPeek("binary COPY tuple shorter than its fixed fields")
    head = np.frombuffer(heads, dtype=_ROW_HEAD)
    data = b"".join([r[ROW_HEAD_LEN:] for r in rows])
    data_len = head["l6"].astype(np.int64)
    if (np.any(head["n"] != 6) or np.any(head["l1"] != 8)
            or np.any(head["l2"] != 8) or np.any(head["l3"] != 8) or np.any(head["l4"] != 8)
            or np.any(head["l5"] != 2) or np.any(data_len < 0)
            or int(data_len.sum()) != len(data)):
        raise MalformedPeek("unexpected binary COPY tuple layout")
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(data_len, out=offsets[1:])
    action = head["action"].astype(np.uint8)
    data, offsets = _valid_messages(data, offsets, action)
    return PeekColumns(lsn=head["lsn"].astype(np.int64), xid=head["xid"].astype(np.int64),
                       commit_lsn=head["commit_lsn"].astype(np.int64),
                       commit_ts_us=head["ts"].astype(np.int64),
                       action=action,
                       data=pa.StringArray.from_buffers(n, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)))


def _valid_messages(data: bytes, offsets: np.ndarray, action: np.ndarray
                    ) -> tuple[bytes, np.ndarray]:
    """``data`` and ``offsets`` with every logical message's text made valid UTF-8.

    wal2json prints the column values of changes as valid text, but a message's content as
    the raw bytes it was given - and anyone allowed to call ``pg_logical_emit_message(…,
    bytea)`` can give it any. An invalid byte becomes U+FFFD: the row is still shipped (a
    message counts 0) and nothing downstream meets bytes that are not text. Messages are
    rare, so only they are checked.
    """
    fixed: dict[int, bytes] = {}
    for i in np.flatnonzero(action == _M).tolist():
        text = data[int(offsets[i]):int(offsets[i + 1])]
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            fixed[i] = text.decode("utf-8", errors="replace").encode("utf-8")
    if not fixed:
        return data, offsets
    lengths = np.diff(offsets).astype(np.int64)
    parts, start = [], 0
    for i, text in fixed.items():
        parts += [data[start:int(offsets[i])], text]
        start = int(offsets[i + 1])
        lengths[i] = len(text)
    parts.append(data[start:])
    new = np.zeros_like(offsets)
    np.cumsum(lengths, out=new[1:])
    return b"".join(parts), new


# --- Snapshot backfill: watermarks, window drops, read rows (see bronze/backfill.py) ----

BACKFILL_PREFIX = "lakecdc.backfill"
READ_ACTION = "R"
_WINDOW_ACTIONS = ("I", "U", "D")


@dataclass(frozen=True)
class HighMark:
    """A HIGH watermark message of the snapshot backfill, as the shipper kept it."""

    gid: int                  # transaction number in this peek (index into tx_changes)
    commit_lsn: int
    seq: int
    xid: int | None
    lsn: int                  # the message's own LSN
    commit_ts_us: int | None
    run: str
    table: str
    chunk: int


@dataclass(frozen=True)
class Window:
    """The watermark window of one staged chunk.

    A chunk row of ``table`` with key ``k`` is stale, and must be dropped, if a captured
    change of ``k`` committed before ``high_lsn`` is not visible to the chunk's snapshot.
    Such a change either has ``low_lsn < commit_lsn`` (it committed after the LOW
    watermark), or - when Postgres made a transaction visible after a later-committing one,
    which commit order does not forbid (synchronous replication waits between writing the
    commit record and becoming visible) - its xid is one of ``in_progress``, the
    transactions running when the chunk's snapshot was taken. Dropping is always safe: the
    dropped key has a change in the stream before ``high_lsn`` that carries its row.
    """

    run: str
    chunk: int
    table: str                # schema.table
    key_column: str
    low_lsn: int
    high_lsn: int
    in_progress: frozenset[int] = frozenset()

    def covers(self, commit_lsn: np.ndarray, xid: np.ndarray) -> np.ndarray:
        hit = (commit_lsn > self.low_lsn) & (commit_lsn < self.high_lsn)
        if self.in_progress:
            hit |= (commit_lsn <= self.low_lsn) & np.isin(xid, list(self.in_progress))
        return hit


# A HIGH or LOW mark is ``{"run": …, "table": …, "chunk": …, "mark": …}``, well under this
# size; anything larger under lakecdc's prefix is not lakecdc's and is never parsed.
MAX_MARK_BYTES = 1024
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")
_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*")
_MARK_KEYS = frozenset({"run", "table", "chunk", "mark"})


def parse_mark(text: str) -> tuple[str, str, int, str] | None:
    """``(run, table, chunk, mark)`` of a backfill watermark's content, or None for anything
    that is not exactly one: total (never raises) and O(1) - the size is checked before
    anything is parsed, and only a flat object of the four expected keys and types passes."""
    if not isinstance(text, str) or len(text) > MAX_MARK_BYTES:
        return None
    try:
        content = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(content, dict) or content.keys() != _MARK_KEYS:
        return None
    run, table, chunk, mark = (content[k] for k in ("run", "table", "chunk", "mark"))
    if not (isinstance(run, str) and _RUN_ID.fullmatch(run) and isinstance(table, str)
            and _TABLE.fullmatch(table) and type(chunk) is int and 0 < chunk < 2**31
            and mark in ("low", "high")):
        return None
    return run, table, chunk, mark


def high_marks(batch: pa.RecordBatch) -> tuple[list[HighMark], int]:
    """The backfill HIGH watermarks among assembled rows (``ASSEMBLED_SCHEMA``), and how many
    messages under the backfill prefix were not well-formed marks (skipped, never raised:
    any role allowed to emit logical messages can write under lakecdc's prefixes).

    Cheap on ordinary batches: one vectorised comparison finds the (rare) message rows;
    only those are looked at, each at a bounded cost (``parse_mark``).
    """
    if batch.num_rows == 0:
        return [], 0
    is_m = np.asarray(pc.fill_null(pc.equal(batch.column("action"), "M"), False))
    idx = np.flatnonzero(is_m)
    if len(idx) == 0:
        return [], 0
    marks, rejected = [], 0
    data = batch.column("data")
    for i in idx.tolist():
        text = data[i].as_py()
        if len(text) > MAX_MARK_BYTES + 512 or f'"{BACKFILL_PREFIX}"' not in text:
            rejected += f'"prefix":"{BACKFILL_PREFIX}"' in text[:200]
            continue
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            rejected += 1
            continue
        if not isinstance(doc, dict) or doc.get("prefix") != BACKFILL_PREFIX:
            continue
        parsed = parse_mark(doc.get("content")) if doc.get("transactional") is True else None
        if parsed is None:
            rejected += 1
            continue
        run, table, chunk, mark = parsed
        if mark != "high":
            continue
        ts = batch.column("commit_ts")[i]
        marks.append(HighMark(
            gid=int(batch.column("gid")[i].as_py()),
            commit_lsn=int(batch.column("commit_lsn")[i].as_py()),
            seq=int(batch.column("seq")[i].as_py()),
            xid=batch.column("xid")[i].as_py(),
            lsn=int(batch.column("lsn")[i].as_py()),
            commit_ts_us=None if not ts.is_valid else ts.cast(pa.int64()).as_py(),
            run=run, table=table, chunk=chunk))
    return marks, rejected


def changed_keys(commit_lsn: pa.Array, xid: pa.Array, action: pa.Array, data: pa.Array,
                 windows: list[Window]) -> dict[tuple[str, int], set[str]]:
    """Keys of each window's table changed inside the window, per ``(run, chunk)``.

    Rows are change rows (bronze or assembled columns); only ``I``/``U``/``D`` count. The
    key is read from ``columns`` (new value) and ``identity`` (old value: a DELETE, or an
    UPDATE that changed the key), as text - exactly as the chunk's ``key::text`` is stored
    (JSON numbers are taken as their text).
    """
    result: dict[tuple[str, int], set[str]] = {(w.run, w.chunk): set() for w in windows}
    if not windows or len(commit_lsn) == 0:
        return result
    lsn = np.asarray(commit_lsn.to_numpy(zero_copy_only=False), dtype=np.int64)
    xids = np.asarray(pc.fill_null(xid, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    changes = np.asarray(pc.fill_null(pc.is_in(action, pa.array(_WINDOW_ACTIONS)), False))
    hits = {(w.run, w.chunk): w.covers(lsn, xids) & changes for w in windows}
    any_hit = np.zeros(len(lsn), dtype=bool)
    for hit in hits.values():
        any_hit |= hit
    by_table: dict[str, list[Window]] = {}
    for w in windows:
        by_table.setdefault(w.table, []).append(w)
    for i in np.flatnonzero(any_hit).tolist():
        doc = json.loads(data[i].as_py(), parse_int=str, parse_float=str)
        table = f"{doc.get('schema')}.{doc.get('table')}"
        for w in by_table.get(table, ()):
            if not hits[(w.run, w.chunk)][i]:
                continue
            for part in ("columns", "identity"):
                for col in doc.get(part) or ():
                    if col.get("name") == w.key_column and col.get("value") is not None:
                        result[(w.run, w.chunk)].add(str(col["value"]))
    return result


def read_records(data: pa.Array, mark: HighMark, first_seq: int, tx_changes: int, slot: str,
                 shipped_at: pa.TimestampScalar) -> pa.RecordBatch:
    """Chunk rows as bronze rows of the HIGH watermark's transaction: same ``commit_lsn``,
    ``seq`` from ``first_seq`` on, its (grown) ``tx_changes``, action ``R``."""
    n = len(data)
    ts = pa.array([mark.commit_ts_us] * n, pa.int64()).cast(UTC_US)
    return pa.RecordBatch.from_arrays([
        pa.array([slot] * n, pa.string()),
        pa.array(np.full(n, mark.commit_lsn, dtype=np.int64), pa.int64()),
        pa.array(np.arange(first_seq, first_seq + n, dtype=np.int32), pa.int32()),
        pa.array(np.full(n, tx_changes, dtype=np.int32), pa.int32()),
        pa.array([mark.xid] * n, pa.int64()),
        pa.array(np.full(n, mark.lsn, dtype=np.int64), pa.int64()),
        ts,
        pa.array([READ_ACTION] * n, pa.string()),
        pa.array(np.full(n, shipped_at.value, dtype=np.int64), pa.int64()).cast(UTC_US),
        data.cast(pa.string()),
    ], schema=BRONZE_SCHEMA)
